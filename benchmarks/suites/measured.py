"""Measured on the CPU machine: fwd + bwd of one attention layer at world 4 on gloo, and peak memory.

Every schedule runs over the same kernel (:class:`~hf_hsap.kernels.TorchCPUFlashKernel`), so the
ratio of two times shows the schedule. The ranks are spawned processes (:class:`hf_hsap.testing.DistPool`)
with one thread each; the worker functions live in :mod:`benchmarks.suites.cpu_workers`.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from hf_hsap.kernels import TorchCPUFlashKernel
from hf_hsap.kernels.base import VarlenSpec
from hf_hsap.testing import DistPool

from ..analytic.distributions import cu_seqlens, doc_lengths, useful_pairs
from . import cpu_workers
from .cpu_workers import ATTENTION_ONLY
from .gpu_calibrate import calibrate_layout, timed


@dataclass(frozen=True)
class MeasureConfig:
    """The measured configuration (defaults: the spec's, plus hf_hsap with ``U = 2``).

    Attributes:
        world: ranks; T: row length; hq, kv_heads, d: query heads, key/value head counts, head dim.
        dists, seed: layouts; reps: timed runs after the warm-up (check) run.
        schedules: ``hsap`` first (the reference), then ``hsap_U<U>``, ``ring``, ``allgather_kv``, ``ulysses``.
        memory_T, memory_dists, memory_budget: the peak-memory runs (with and without this budget).
    """

    world: int = 4
    T: int = 16384
    hq: int = 8
    kv_heads: tuple[int, ...] = (8, 2)
    d: int = 64
    dists: tuple[str, ...] = ("longtail", "sft")
    seed: int = 0
    reps: int = 5
    schedules: tuple[str, ...] = ("hsap", "hsap_U2", "ring", "allgather_kv", "ulysses")
    memory_T: int = 65536
    memory_dists: tuple[str, ...] = ("mixed",)
    memory_budget: int = 4096


def summarize_times(per_rank: list[dict]) -> dict:
    """Per schedule: the median over runs of the slowest rank's time, bytes per rank, errors.

    Args:
        per_rank: the results of :func:`benchmarks.suites.cpu_workers.bench_schedules`, one per rank.

    Returns:
        ``{name: {"ms", "min_ms", "runs_ms", "ratio", "min_ratio", "cpu_max_ms", "cpu_sum_ms", "cpu_ratio", "bytes_max",
        "bytes_mean", "error", "info"}}``; ``ratio`` is this schedule's wall time / hf_hsap's; ``cpu_max_ms``
        / ``cpu_sum_ms`` are the medians over runs of the largest and the summed per-rank CPU time, and
        ``cpu_ratio`` compares the summed CPU time with hf_hsap's.
    """
    names = list(per_rank[0]["times"])
    out = {}
    for n in names:
        runs = np.max(np.array([r["times"][n] for r in per_rank]), axis=0)  # [reps] slowest rank per run
        b = np.array([r["bytes"][n] for r in per_rank], dtype=np.float64)
        cpu = np.array([r["cpu"][n] for r in per_rank])  # [ranks, reps]
        out[n] = {"ms": float(np.median(runs)) * 1e3, "min_ms": float(np.min(runs)) * 1e3,
                  "runs_ms": (runs * 1e3).round(1).tolist(),
                  "cpu_max_ms": float(np.median(cpu.max(0))) * 1e3, "cpu_sum_ms": float(np.median(cpu.sum(0))) * 1e3,
                  "bytes_max": float(b.max()), "bytes_mean": float(b.mean()), "error": per_rank[0]["errors"][n],
                  "info": [r["info"][n] for r in per_rank]}
    for n in names:
        out[n]["ratio"] = out[n]["ms"] / out["hsap"]["ms"]
        out[n]["min_ratio"] = out[n]["min_ms"] / out["hsap"]["min_ms"]
        out[n]["cpu_ratio"] = out[n]["cpu_sum_ms"] / out["hsap"]["cpu_sum_ms"]
    return out


def run_kernel_paths(cfg: MeasureConfig) -> list[dict]:
    """hf_hsap's compute path of the busiest rank (local + remote items, gathers, LSE merges; no
    communication) against one varlen call over the same number of pairs, in this process, one thread.

    Args:
        cfg: sizes (``T``, ``world`` as the SP size, heads, distributions).

    Returns:
        Rows of :func:`benchmarks.suites.gpu_calibrate.calibrate_layout` (float32, CPU, best of 5 after a warm-up)
        with ``hkv`` added.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [dict(calibrate_layout(d, cfg.T, cfg.world, cfg.hq, hkv, cfg.d, torch.float32, torch.device("cpu"),
                                      1, 5, "min", ATTENTION_ONLY), hkv=hkv)  # the measured runs' plans
                for d in cfg.dists for hkv in cfg.kv_heads]
    finally:
        torch.set_num_threads(threads)


KERNEL_SHAPES: tuple[tuple[str, int, int], ...] = (
    ("causal", 512, 512), ("causal", 1024, 1024), ("causal", 2048, 2048), ("causal", 4096, 4096),
    ("full", 1024, 4096), ("full", 2048, 2048))


def run_kernel_shapes(cfg: MeasureConfig, heads: tuple[int, ...] = (8, 2)) -> list[dict]:
    """Throughput of the CPU kernel by segment shape: one causal square or one full rectangle, forward
    and backward timed apart, ``heads`` query and key/value heads, one thread, best of 3 after a
    warm-up. Each shape runs as one op call (``whole``), halved in both passes (``halved``: causal
    squares cut down to 128 rows at >= 4 heads, 256 below) and as the kernel runs it by default
    (backward halved, forward whole). PyTorch's CPU flash attention walks keys in blocks of 512, so one
    call on a causal square computes about 256 masked keys per query row on its diagonal, a share that
    shrinks as the square grows.

    Returns:
        Rows ``{kind, nq, nk, heads, <v>_fwd_ms, <v>_bwd_ms, <v>_mpairs_per_s}`` for ``v`` in ``whole``,
        ``halved``, ``default`` (million useful (query, key) pairs per head per second, fwd + bwd).
    """
    kernels = {"whole": TorchCPUFlashKernel(block=0, few_heads_block=0),
               "halved": TorchCPUFlashKernel(halve_forward=True), "default": TorchCPUFlashKernel()}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    try:
        out = []
        for h in heads:
            for kind, nq, nk in KERNEL_SHAPES:
                g = torch.Generator().manual_seed(0)
                q, do = (torch.randn(nq, h, cfg.d, generator=g) for _ in range(2))
                k, v = (torch.randn(nk, h, cfg.d, generator=g) for _ in range(2))
                spec, scale = VarlenSpec((0, nq), (0, nk), kind == "causal"), cfg.d ** -0.5
                pairs = nq * (nq + 1) / 2 if kind == "causal" else nq * nk
                row = {"kind": kind, "nq": nq, "nk": nk, "heads": h}
                for key, kern in kernels.items():
                    o, lse = kern.forward(q, k, v, spec, scale)
                    f = timed(lambda: kern.forward(q, k, v, spec, scale), cpu, 1, 3, "min")
                    b = timed(lambda: kern.backward(do, q, k, v, o, lse, spec=spec, scale=scale), cpu, 1, 3, "min")
                    row[f"{key}_fwd_ms"], row[f"{key}_bwd_ms"] = f * 1e3, b * 1e3
                    row[f"{key}_mpairs_per_s"] = pairs * h / (f + b) / 1e6
                out.append(row)
        return out
    finally:
        torch.set_num_threads(threads)


def run_measured(cfg: MeasureConfig, progress: bool = False) -> dict:
    """Time every schedule on every (distribution, kv heads) and probe PyTorch's context parallel.

    Args:
        cfg: the configuration; progress: print one line per configuration.

    Returns:
        ``{"torch_cp": probe result, "configs": [{"dist", "T", "hq", "hkv", "d", "n_docs", "pairs",
        "results": summarize_times(...)}], "seconds"}``.
    """
    t0 = time.perf_counter()
    configs = []
    with DistPool(cfg.world, timeout_s=900.0, pg_timeout_s=900.0) as pool:
        probe = pool.run(cpu_workers.probe_torch_context_parallel)[0]
        for dist_name in cfg.dists:
            lengths = doc_lengths(dist_name, cfg.T, cfg.seed)
            cu = cu_seqlens(lengths).tolist()
            for hkv in cfg.kv_heads:
                t1 = time.perf_counter()
                res = pool.run(cpu_workers.bench_schedules, cu, cfg.hq, hkv, cfg.d, cfg.seed, cfg.reps, cfg.schedules)
                s = summarize_times(res)
                configs.append({"dist": dist_name, "T": cfg.T, "hq": cfg.hq, "hkv": hkv, "d": cfg.d,
                                "n_docs": len(lengths), "pairs": useful_pairs(lengths), "results": s})
                if progress:
                    line = " ".join(f"{n}={v['ms']:.0f}ms" for n, v in s.items())
                    print(f"  measured {dist_name:8s} hkv={hkv}: {line} ({time.perf_counter() - t1:.0f}s)", flush=True)
    return {"torch_cp": probe, "world": cfg.world, "configs": configs, "seconds": time.perf_counter() - t0}


@contextmanager
def _malloc_env() -> Iterator[None]:
    """Spawned ranks inherit glibc settings that return freed blocks to the OS at once, so the resident
    set follows live memory (restored for the parent afterwards)."""
    keys = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_memory(cfg: MeasureConfig, progress: bool = False) -> list[dict]:
    """Peak memory per rank of one SAP fwd + bwd (``T = memory_T``, world ``world``, kv heads
    ``kv_heads[-1]``), with and without ``recv_budget_tokens``; each run in fresh processes.

    Args:
        cfg: the configuration; progress: print one line per run.

    Returns:
        One row per (distribution, budget): ``{"dist", "T", "budget", "ranks": [memory_task results]}``.
    """
    rows = []
    hkv = cfg.kv_heads[-1]
    for dist_name in cfg.memory_dists:
        cu = cu_seqlens(doc_lengths(dist_name, cfg.memory_T, cfg.seed)).tolist()
        for budget in (None, cfg.memory_budget):
            t1 = time.perf_counter()
            with _malloc_env(), DistPool(cfg.world, timeout_s=900.0, pg_timeout_s=900.0) as pool:
                ranks = pool.run(cpu_workers.memory_task, cu, cfg.hq, hkv, cfg.d, budget)
            rows.append({"dist": dist_name, "T": cfg.memory_T, "budget": budget, "hq": cfg.hq, "hkv": hkv,
                         "d": cfg.d, "ranks": ranks})
            if progress:
                peak = max(r["peak_delta_bytes"] for r in ranks) / 2**20
                print(f"  memory {dist_name:8s} budget={budget}: peak +{peak:.0f} MiB "
                      f"({time.perf_counter() - t1:.0f}s)", flush=True)
    return rows
