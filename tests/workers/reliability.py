"""Worker functions for the reliability tests (faults, NaN propagation)."""
from __future__ import annotations

import os
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import hf_hsap
from hf_hsap.comm.p2p import HSAPCommError
from hf_hsap.kernels import reference_attention


def fault_worker(rank: int, world: int, init_method: str, mode: str, timeout_s: float, results, release,
                 hang_guard_s: float) -> None:
    """Rank ``world - 1`` dies (``mode="die"``: exit code 17) or stalls (``"stall"``: stays alive and silent
    until ``release`` is set, then reports ``"stalled"``) after planning; the others run attention under an
    SP group of ``timeout_s`` and report ``(rank, kind, message)``: ``kind`` is the exception type they raised
    (``"HSAPCommError"`` expected) or ``"no error"``. ``hang_guard_s`` bounds every wait (a broken test)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=hang_guard_s))
    try:
        sp = hf_hsap.init_sequence_parallel(world, timeout_s=timeout_s)
        cu = [0, 24 * world]  # one document over every rank: everyone exchanges with everyone
        plan = hf_hsap.plan_sequence(cu, sp, "zigzag")
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(cu[-1], 2, 8, generator=g) for _ in range(3))
        ql, kl, vl = (plan.shard(x).requires_grad_(True) for x in (q, k, v))
        dist.barrier(group=sp.group)
        if rank == world - 1:
            if mode == "die":
                os._exit(17)
            results.put((rank, "stalled" if release.wait(hang_guard_s) else "never released", ""))
            return
        try:
            hf_hsap.hsap_attn_func(ql, kl, vl, plan).sum().backward()
            results.put((rank, "no error", ""))
        except HSAPCommError as err:
            results.put((rank, "HSAPCommError", str(err)))
        except Exception as err:  # noqa: BLE001 - report what else happened
            results.put((rank, type(err).__name__, str(err)))
    except BaseException:  # noqa: BLE001
        results.put((rank, "setup failed", traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()  # flush before the hard exit below
        os._exit(0)


def check_nan_propagation(world: int, where: str) -> dict:
    """Put NaN into one key (or query) token; the NaN pattern of the output must equal the float64
    reference's (no hidden masking, no spreading across documents)."""
    from workers.sap import get_sp

    sp = get_sp(world, 1)
    cu = [0, 7, 40, 41, 60]
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(60, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    bad = 20  # inside the long document [7, 40)
    (k if where == "key" else q)[bad, 1, 3] = float("nan")
    plan = hf_hsap.plan_sequence(torch.tensor(cu), sp, "balanced")
    out = hf_hsap.hsap_attn_func(plan.shard(q), plan.shard(k), plan.shard(v), plan)
    ref, _ = reference_attention(q, k, v, cu)
    return {"got": torch.isnan(out).any(-1).tolist(), "want": torch.isnan(plan.shard(ref)).any(-1).tolist(),
            "n_nan": int(torch.isnan(out).any(-1).any(-1).sum())}
