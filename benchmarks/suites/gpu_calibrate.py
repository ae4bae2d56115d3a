"""Calibrate the cost model's kernel efficiencies on one GPU (under 5 minutes); writes ``calibration.json``.

For each layout (the spec's distributions at ``T``, ``P``), it takes the plan's busiest rank and times,
on this one GPU, with the rank's real tensor sizes (model heads, bf16):

1. **plan items**: hf_hsap's forward and backward compute path for that rank
   (:func:`hf_hsap.runtime.sap_forward` / :func:`~hf_hsap.runtime.sap_backward`: the local work item,
   the remote items, the gathers and the LSE merges) with communication replaced by ready buffers;
2. **one varlen call over the same FLOPs**: a single causal segment whose pair count equals the rank's;
3. **GEMM**: a bf16 matmul of the model's MLP shape.

Achieved TFLOP/s counts ``4 · pairs · head_dim · q_heads`` forward and ``2.5×`` that backward (the cost
model's convention). The written ``attn_efficiency`` is the single varlen call's (the kernel's own
capability, applied by the cost model to every scheme); the plan items' efficiency relative to it is
recorded in ``source`` (the price of hf_hsap's fragmentation). ``gemm_efficiency`` is the matmul's.
Efficiencies are relative to the nominal dense bf16 peak of the device (the table of
:mod:`hf_hsap.hardware`: A100 312, H100 / H200 989 TFLOP/s, ...); they are written under
``hardware.<key>`` (``A100``, ``H100``, ...: the table's key for the device) of the calibration file,
other keys kept.

    python -m benchmarks calibrate                 # on a GPU machine
    python -m benchmarks calibrate --dry-run       # on CPU: tiny sizes, float32, prints the JSON only
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import time
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

import hf_hsap
from hf_hsap.comm.p2p import Pending
from hf_hsap.hardware import GPU_KINDS, hardware_for_device_name, peak_flops_for_device_name
from hf_hsap.kernels import VarlenSpec, select_kernel
from hf_hsap.runtime import sap_backward, sap_forward

from ..analytic.cost_model import DEFAULT_CALIBRATION, MODELS
from ..analytic.distributions import DISTRIBUTIONS, cu_seqlens, doc_lengths
from .output import Outcome

# {device-name substring: (hardware key, dense bf16 peak FLOP/s)}, a read-only view of hf_hsap.hardware's table
PEAKS: Mapping[str, tuple[str, float]] = MappingProxyType(
    {sub: (kind.key, kind.peak_bf16_flops) for kind in GPU_KINDS for sub in kind.name_substrings})


class ReadyBuffers:
    """Stands in for :class:`hf_hsap.comm.p2p.P2PExecutor`: every transfer returns a ready buffer of
    the right shape (made once per shape), so only compute is timed."""

    def __init__(self) -> None:
        self._bufs: dict[tuple, torch.Tensor] = {}

    def transfer(self, send: torch.Tensor, send_splits, recv_rows: int, recv_splits, tag: int = 0) -> Pending:
        key = (recv_rows, tuple(send.shape[1:]), send.dtype, str(send.device))
        if key not in self._bufs:
            self._bufs[key] = torch.randn((recv_rows, *send.shape[1:]), dtype=send.dtype, device=send.device)
        return Pending([], self._bufs[key])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, warmup: int, iters: int, stat: str = "median") -> float:
    """Seconds of ``fn`` after ``warmup`` calls (device synchronised around each call): the median of
    ``iters`` calls, or their minimum (``stat="min"``: robust to other load on a shared CPU)."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        ts.append(time.perf_counter() - t0)
    return float(np.min(ts) if stat == "min" else np.median(ts))


def calibrate_layout(dist: str, T: int, P: int, hq: int, hkv: int, d: int, dtype: torch.dtype,
                     device: torch.device, warmup: int, iters: int, stat: str = "median",
                     cost: hf_hsap.CostModel | None = None) -> dict:
    """Time the busiest rank's plan items and one varlen call over the same pairs.

    Args:
        dist, T, P: the layout (seed 0) and SP size; hq, hkv, d: heads and head dim of the model.
        dtype, device: where to run; warmup, iters: timing repetitions; stat: ``median`` or ``min``.
        cost: the planner's cost model (default: a full model's, KV over NVLink: one node).

    Returns:
        ``{"dist", "part", "pairs", "items", "plan_fwd_s", "plan_bwd_s", "single_fwd_s", "single_bwd_s",
        "plan_tflops", "single_tflops"}`` (TFLOP/s over forward + backward).
    """
    plan = hf_hsap.plan_sequence(cu_seqlens(doc_lengths(dist, T, 0)), P, "auto", gpus_per_node=P, cost=cost)
    part = int(np.argmax(plan.stats().attn_work))
    sched = plan.schedule(part)
    n = sched.n_local
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v, dout = (torch.randn(n, h, d, generator=g).to(device, dtype) for h in (hq, hkv, hkv, hq))
    kernel = select_kernel(device, dtype)
    ex, scale = ReadyBuffers(), d ** -0.5
    run = {"sched": sched, "executor": ex, "kernel": kernel, "scale": scale}
    out, lse, recvs = sap_forward(q, k, v, keep_recv=True, **run)
    fwd = timed(lambda: sap_forward(q, k, v, keep_recv=True, **run), device, warmup, iters, stat)
    bwd = timed(lambda: sap_backward(dout, q, k, v, out, lse, recvs=recvs, **run), device, warmup, iters, stat)
    pairs = int(plan.stats().attn_work[part])
    n_eq = max(1, int(round((math.sqrt(8 * pairs + 1) - 1) / 2)))  # n (n + 1) / 2 ≈ pairs
    qs, ks, vs, ds = (torch.randn(n_eq, h, d, generator=g).to(device, dtype) for h in (hq, hkv, hkv, hq))
    spec = VarlenSpec((0, n_eq), (0, n_eq), True)
    o1, l1 = kernel.forward(qs, ks, vs, spec, scale)
    s_fwd = timed(lambda: kernel.forward(qs, ks, vs, spec, scale), device, warmup, iters, stat)
    s_bwd = timed(lambda: kernel.backward(ds, qs, ks, vs, o1, l1, spec=spec, scale=scale), device, warmup, iters, stat)
    flops = 4.0 * pairs * d * hq * (1 + 2.5)
    flops_eq = 4.0 * (n_eq * (n_eq + 1) / 2) * d * hq * (1 + 2.5)
    n_items = int(sched.local_item is not None) + sum(len(r.items) for r in sched.rounds)
    return {"dist": dist, "part": part, "pairs": pairs, "items": n_items, "kernel": kernel.name,
            "plan_fwd_s": fwd, "plan_bwd_s": bwd, "single_fwd_s": s_fwd, "single_bwd_s": s_bwd,
            "plan_tflops": flops / (fwd + bwd) / 1e12, "single_tflops": flops_eq / (s_fwd + s_bwd) / 1e12}


def gemm_tflops(tokens: int, hidden: int, ffn: int, dtype: torch.dtype, device: torch.device,
                warmup: int, iters: int) -> float:
    """Achieved TFLOP/s of ``[tokens, hidden] @ [hidden, ffn]``."""
    a = torch.randn(tokens, hidden, device=device, dtype=dtype)
    b = torch.randn(hidden, ffn, device=device, dtype=dtype)
    t = timed(lambda: a @ b, device, warmup, iters)
    return 2.0 * tokens * hidden * ffn / t / 1e12


def peak_for_device_name(name: str) -> tuple[str, float | None]:
    """The calibration key and nominal peak of a device name, from :mod:`hf_hsap.hardware`.

    Args:
        name: a ``torch.cuda.get_device_name()`` string.

    Returns:
        ``(hardware key, dense bf16 peak FLOP/s)``; an unknown device gives its name with ``_`` for
        spaces and ``None``.
    """
    key = hardware_for_device_name(name)
    if key is None:
        return name.replace(" ", "_"), None
    return key, peak_flops_for_device_name(name)


def device_peak(device: torch.device, dtype: torch.dtype) -> tuple[str, str, float | None]:
    """(device name, hardware key, nominal peak FLOP/s) — peak ``None`` when unknown.

    Args:
        device: the device timed (not CUDA: ``("cpu", "cpu", None)``).
        dtype: the dtype timed (the peak is the dense bf16 one).

    Returns:
        The device's name and :func:`peak_for_device_name` of it.
    """
    if device.type != "cuda":
        return "cpu", "cpu", None
    name = torch.cuda.get_device_name(device)
    return (name, *peak_for_device_name(name))


def build_parser() -> argparse.ArgumentParser:
    """The command-line options of the calibration script."""
    p = argparse.ArgumentParser(prog="python -m benchmarks calibrate", description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, float32; print the JSON, write nothing")
    p.add_argument("--dists", default=",".join(DISTRIBUTIONS), help="comma-separated distributions")
    p.add_argument("--T", type=int, default=131072)
    p.add_argument("--P", type=int, default=8)
    p.add_argument("--model", choices=sorted(MODELS), default="llama3-8b")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default=None, help=f"calibration file (default {DEFAULT_CALIBRATION}; dry run: none)")
    return p


def main(argv: Sequence[str]) -> Outcome:
    """Run the calibration.

    Args:
        argv: the command-line arguments.

    Returns:
        The outcome (status 0; the pages are left alone: the calibration is read when the core suite runs).
    """
    args = build_parser().parse_args(argv)
    m = MODELS[args.model]
    if args.dry_run:
        device, dtype = torch.device("cpu"), torch.float32
        T, P, hq, hkv, d, hidden, ffn = 4096, 4, 4, 1, 32, 256, 512
        warmup, iters = 1, 1
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --dry-run on CPU")
        device, dtype = torch.device("cuda"), torch.bfloat16
        T, P, hq, hkv, d, hidden, ffn = args.T, args.P, m.q_heads, m.kv_heads, m.head_dim, m.hidden, m.intermediate
        warmup, iters = args.warmup, args.iters
    t0 = time.perf_counter()
    layouts = [calibrate_layout(dist, T, P, hq, hkv, d, dtype, device, warmup, iters)
               for dist in args.dists.split(",")]
    gemm = gemm_tflops(8192 if not args.dry_run else 256, hidden, ffn, dtype, device, warmup, iters)
    name, hw, peak = device_peak(device, dtype)
    peak = peak or gemm * 1e12  # unknown device: efficiencies relative to the measured matmul
    single = float(np.median([x["single_tflops"] for x in layouts])) * 1e12
    plan_ratio = float(np.median([x["plan_tflops"] / x["single_tflops"] for x in layouts]))
    entry = {"attn_efficiency": round(min(1.0, single / peak), 4), "gemm_efficiency": round(min(1.0, gemm * 1e12 / peak), 4)}
    detail = "; ".join(f"{x['dist']}: rank {x['part']} {x['items']} items, plan {x['plan_tflops']:.1f} vs single "
                       f"{x['single_tflops']:.1f} TFLOP/s" for x in layouts)
    source = (f"{'DRY RUN (CPU, meaningless numbers): ' if args.dry_run else ''}benchmarks/suites/gpu_calibrate.py on "
              f"{name}, {_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, torch {torch.__version__}, "
              f"kernel {layouts[0]['kernel']}, {args.model} heads, T={T}, P={P}, {dtype}; plan items reach "
              f"{plan_ratio:.2f}x the single varlen call's throughput; matmul {gemm:.1f} TFLOP/s; {detail}")
    out_path = None if args.dry_run and args.out is None else Path(args.out or DEFAULT_CALIBRATION)
    data = json.loads(out_path.read_text()) if out_path is not None and out_path.exists() else {}
    data.setdefault("hardware", {})[hw] = entry
    data["source"] = source
    text = json.dumps(data, indent=2)
    print(text)
    if out_path is not None:
        out_path.write_text(text + "\n")
        print(f"wrote {out_path} in {time.perf_counter() - t0:.0f}s")
    return Outcome(0, None, False)
