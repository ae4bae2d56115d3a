"""Functions run on every spawned gloo rank by the CPU benchmarks (importable by the child processes).

Every task creates what it needs (process groups, plans, tensors) and returns plain data; nothing is
kept between tasks (no module-global state).
"""
from __future__ import annotations

import gc
import time
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

import hf_hsap
from hf_hsap.kernels import TorchCPUFlashKernel
from hf_hsap.plan.memory import memory_terms
from hf_hsap.testing import rel_err

from .cpu_baselines import AllGatherKV, RingAttention, UlyssesAttention

Result = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # out, dq, dk, dv (local rows)


class _Runner:
    """One schedule on this rank: ``run()`` does forward + backward of one attention layer."""

    def __init__(self, indices: torch.Tensor, fn: Callable[[], Result], bytes_fn: Callable[[], int],
                 info: dict | None = None) -> None:
        self.indices, self._fn, self._bytes, self.info = indices, fn, bytes_fn, info or {}

    def run(self) -> Result:
        return self._fn()

    def bytes(self) -> int:
        """Bytes this rank moved in the last :meth:`run` (see :func:`bench_schedules`)."""
        return self._bytes()


# The cost model of the step these benchmarks time: one attention layer and nothing else, so a token
# costs no linear layers (a full model's projections and MLP would price it at ~18,000 pairs), only its
# communication: KV priced as on NVLink, as for an SP group inside one node (and the default all-to-all
# share for hsap_U2). diag_block prices what a split costs in the CPU kernel: BENCHMARKS.md's "CPU kernel by
# segment shape" table puts a causal square of n rows at n * b / 2 masked pairs with b = 220-330 (512 rows
# reach 0.70 of a 4096-row square's throughput, 1024 rows 0.76, 2048 rows 0.88), so 256.
ATTENTION_ONLY = hf_hsap.CostModel(token_cost=0.0, kv_token_cost=hf_hsap.CostModel.nvlink().kv_token_cost,
                                   round_cost=hf_hsap.CostModel.nvlink().round_cost, diag_block=256)


def _hsap_runner(cu: list[int], U: int | str, q, k, v, dout, cost: hf_hsap.CostModel = ATTENTION_ONLY
                 ) -> tuple[_Runner, Any]:
    """hf_hsap on this rank: a group of Ulysses degree ``U`` (``"per_batch"``: the degree ``cost`` prices fastest
    for this row, up to ``U = world``, among those whose modelled activation memory is at most ``U = world``'s),
    placement auto under ``cost``."""
    config = hf_hsap.HSAPConfig(sp_size=dist.get_world_size(), ulysses_size=U, cost_model=cost)
    sp = hf_hsap.init_sequence_parallel(config, num_heads=q.shape[1], num_kv_heads=k.shape[1])
    plan = hf_hsap.plan_sequence(torch.tensor(cu), sp, "auto")
    idx = plan.local_token_indices()
    ql, kl, vl, dl = (x.index_select(0, idx) for x in (q, k, v, dout))

    def fn() -> Result:
        plan.sp.comm_stats.reset()
        a, b, c = (x.detach().requires_grad_(True) for x in (ql, kl, vl))
        out = hf_hsap.hsap_attn_func(a, b, c, plan)
        out.backward(dl)
        return out.detach(), a.grad, b.grad, c.grad

    st = plan.stats()
    info = {"placement": plan.placement_name, "recv_kv_tokens": st.recv_kv_tokens[sp.rank],
            "tokens": st.tokens[sp.rank], "attn_work": st.attn_work[sp.rank], "ulysses": plan.ulysses_size}
    return _Runner(idx, fn, lambda: sp.comm_stats.bytes_recv + sp.comm_stats.a2a_bytes_sent, info), plan


def _baseline_runner(name: str, cu: np.ndarray, q, k, v, dout, kernel, scale: float) -> _Runner:
    rank, world = dist.get_rank(), dist.get_world_size()
    cls = {"ring": RingAttention, "allgather_kv": AllGatherKV, "ulysses": UlyssesAttention}[name]
    impl = cls(cu, rank, world, kernel, scale)
    idx = impl.local_indices()
    ql, kl, vl, dl = (x.index_select(0, idx) for x in (q, k, v, dout))

    def fn() -> Result:
        impl.bytes_recv = 0
        if name == "ring":
            out, lse = impl.forward(ql, kl, vl)
            return (out, *impl.backward(dl, ql, kl, vl, out, lse))
        if name == "allgather_kv":
            out, lse, glob = impl.forward(ql, kl, vl)
            return (out, *impl.backward(dl, ql, glob, out, lse))
        out, saved = impl.forward(ql, kl, vl)
        return (out, *impl.backward(dl, saved))

    return _Runner(idx, fn, lambda: impl.bytes_recv)


def bench_schedules(cu: list[int], hq: int, hkv: int, d: int, seed: int, reps: int, names: tuple[str, ...],
                    tol: float = 1e-4) -> dict:
    """Time forward + backward of one attention layer under every schedule in ``names``.

    ``names`` must start with ``"hsap"`` (the reference); other entries: ``hsap_U<U>``, ``ring``,
    ``allgather_kv``, ``ulysses``. Every schedule's output and input gradients are first compared
    with hf_hsap's (gathered over the group; every rank asserts the group-wide maximum error is below
    ``tol``); that run is the warm-up. Then ``reps`` rounds, each timing every schedule once
    (``dist.barrier()`` before and after, ``time.perf_counter``).

    Args:
        cu: ``[n_docs + 1]`` document boundaries of the row; hq, hkv, d: heads and head dim.
        seed: seed of the random q, k, v, dout (float32, identical on every rank).
        reps: timed rounds; names: schedules; tol: largest relative error allowed.

    Returns:
        ``{"rank", "times": {name: [s, ...]}, "cpu": {name: [s, ...]}, "bytes": {name: int},
        "errors": {name: float}, "info": {name: dict}}``; ``cpu`` is this process's CPU time of the run
        (all its threads, gloo's included), which other load on the machine disturbs less than wall time. Bytes: received from other ranks per forward + backward (hf_hsap:
        received point-to-point plus all-to-all bytes sent, which equal those received over the group).
    """
    if names[0] != "hsap":
        raise ValueError("the first schedule must be 'hsap' (the reference of the others)")
    torch.set_num_threads(1)
    T = cu[-1]
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(T, h, d, generator=g) for h in (hq, hkv, hkv, hq))
    kernel = TorchCPUFlashKernel()
    runners: dict[str, _Runner] = {}
    ref_plan = None
    for name in names:
        if name.startswith("hsap"):
            U = int(name[len("hsap_U"):]) if name.startswith("hsap_U") else 1
            runners[name], plan = _hsap_runner(cu, U, q, k, v, dout)
            ref_plan = ref_plan or plan
        else:
            runners[name] = _baseline_runner(name, np.asarray(cu), q, k, v, dout, kernel, d ** -0.5)
    errors, bytes_ = {}, {}
    ref = None
    for name, r in runners.items():
        res = r.run()
        bytes_[name] = r.bytes()
        if ref is None:
            ref = [ref_plan.gather(x.detach()) for x in res]  # global out, dq, dk, dv
        err = torch.tensor([max(rel_err(x, g_.index_select(0, r.indices)) for x, g_ in zip(res, ref))])
        dist.all_reduce(err, op=dist.ReduceOp.MAX)
        errors[name] = float(err)
        assert errors[name] < tol, f"{name} differs from hf_hsap by {errors[name]:.2e} (tolerance {tol})"
    del ref
    gc.collect()
    times: dict[str, list[float]] = {n: [] for n in runners}
    cpu: dict[str, list[float]] = {n: [] for n in runners}
    for _ in range(reps):
        for name, r in runners.items():
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            r.run()
            c1 = time.process_time()
            dist.barrier()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(c1 - c0)
    return {"rank": dist.get_rank(), "times": times, "cpu": cpu, "bytes": bytes_, "errors": errors,
            "info": {n: r.info for n, r in runners.items()}}


def probe_torch_context_parallel() -> str:
    """Try PyTorch's ``context_parallel`` (causal SDPA, one document) on CPU / gloo.

    Returns:
        ``"ok"`` when forward and backward ran and matched plain SDPA, else the exception's type and message.
    """
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.tensor.experimental import context_parallel

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 4, 64 * dist.get_world_size(), 16, generator=g) for _ in range(3))
        qs, ks, vs = q.clone(), k.clone(), v.clone()
        with context_parallel(mesh, buffers=[qs, ks, vs], buffer_seq_dims=[2, 2, 2], no_restore_buffers={qs, ks, vs}):
            qs.requires_grad_(True)
            out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            out.sum().backward()
        return "ok"
    except Exception as e:  # noqa: BLE001 - the probe reports whatever stops it
        return f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"


def _status_kb(key: str) -> int:
    """A ``/proc/self/status`` field in kB (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _reset_peak() -> bool:
    """Reset the peak RSS (``VmHWM``) of this process to its current RSS (Linux ``clear_refs`` 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_task(cu: list[int], hq: int, hkv: int, d: int, budget: int | None) -> dict:
    """Peak resident memory of one SAP attention forward + backward (float32) on this rank.

    The rank's own q, k, v, dout are allocated first; then the peak RSS is reset and the call runs;
    the result is the peak RSS minus the RSS just before the call.

    Args:
        cu: document boundaries; hq, hkv, d: heads and head dim; budget: ``recv_budget_tokens``.

    Returns:
        ``{"rank", "n_local", "recv_tokens", "rounds", "max_round_recv", "peak_delta_bytes",
        "peak_reset", "own_bytes", "recv_buffer_bytes"}`` (the last two: the planner's memory model,
        :func:`hf_hsap.plan.memory.memory_terms`: own tokens, and the receive side).
    """
    torch.set_num_threads(1)
    sp = hf_hsap.init_sequence_parallel(dist.get_world_size())
    plan = hf_hsap.plan_sequence(torch.tensor(cu), sp, "auto", recv_budget_tokens=budget)
    sched = plan.schedule()
    n = plan.num_local_tokens()
    g = torch.Generator().manual_seed(sp.rank)
    q, k, v, dout = (torch.randn(n, h, d, generator=g) for h in (hq, hkv, hkv, hq))
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    gc.collect()
    dist.barrier()
    rss0 = _status_kb("VmRSS")
    reset = _reset_peak()
    out = hf_hsap.hsap_attn_func(q, k, v, plan)
    out.backward(dout)
    peak = _status_kb("VmHWM")
    dist.barrier()
    max_round = max((r.recv_total for r in sched.rounds), default=0)
    # the planner's own memory model (hf_hsap.plan.memory), in tokens x heads of d float32 elements
    own, _, kv = memory_terms(plan.placement.tokens_per_part(), plan.pieces, budget is not None, 1, hq, hkv)
    return {
        "rank": sp.rank, "n_local": n, "recv_tokens": sched.recv_tokens, "rounds": len(sched.rounds),
        "max_round_recv": max_round, "peak_delta_bytes": (peak - rss0) * 1024, "peak_reset": reset,
        "own_bytes": int(own[sp.rank] * d * 4), "recv_buffer_bytes": int(kv[sp.rank] * d * 4),
        "finite": bool(torch.isfinite(out.detach()).all()),
    }
