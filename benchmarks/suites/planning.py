"""Planning time, cold and cached, for ``T = 524288`` with 2,000 documents (the spec's planning case)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

import hf_hsap

from ..analytic.distributions import planning_lengths


@dataclass(frozen=True)
class PlanningConfig:
    """Sizes and repetitions of the planning benchmark."""

    T: int = 524288
    n_docs: int = 2000
    Ps: tuple[int, ...] = (8, 64)
    placements: tuple[str, ...] = ("auto", "balanced", "contiguous")
    cold_runs: int = 15
    cached_runs: int = 2000
    seed: int = 0


def _times_ms(fn, runs: int, clock=time.perf_counter) -> list[float]:
    """Milliseconds of each of ``runs`` calls of ``fn`` by ``clock``."""
    ts = []
    for _ in range(runs):
        t0 = clock()
        fn()
        ts.append((clock() - t0) * 1e3)
    return ts


def _median_ms(fn, runs: int, clock=time.perf_counter) -> float:
    """Median milliseconds of ``runs`` calls of ``fn`` by ``clock``."""
    return float(np.median(_times_ms(fn, runs, clock)))


def run_planning(cfg: PlanningConfig) -> list[dict]:
    """Median planning times.

    * ``cold_ms``: ``plan_sequence`` without a cache (layout validation, placement, transfers);
      ``cold_cpu_ms`` the same by the calling thread's CPU time (``time.thread_time``: what other load on the
      machine disturbs least; the planner runs on this one thread, and a process's clock would also count the
      threads earlier benchmark sections left running, e.g. 21.5 ms against 16.1 ms wall in one run);
      ``cold_cpu_min_ms`` their minimum: what the code costs when nothing else slows the machine (this 2-core
      machine's speed moves by up to 2x from one minute to the next, and its slow phases inflate even CPU time).
    * ``schedule_ms``: compiling one rank's schedule afterwards (every rank does it once per layout;
      the slowest rank's).
    * ``cached_ms``: ``plan_sequence`` with a warm :class:`~hf_hsap.PlanCache` (validation, hashing,
      lookup), from a CPU ``torch`` tensor as a data loader hands it over.

    Args:
        cfg: the sizes.

    Returns:
        One row per (P, placement): ``{"P", "placement", "chosen", "cold_ms", "cold_cpu_ms", "cold_cpu_min_ms",
        "schedule_ms", "cached_ms"}``.
    """
    import torch

    cu_np = np.concatenate([[0], np.cumsum(planning_lengths(cfg.T, cfg.n_docs, cfg.seed))])
    cu = torch.from_numpy(cu_np)
    rows = []
    for P in cfg.Ps:
        for placement in cfg.placements:
            cold = _median_ms(lambda: hf_hsap.plan_sequence(cu, P, placement), cfg.cold_runs)
            cpu_ms = _times_ms(lambda: hf_hsap.plan_sequence(cu, P, placement), cfg.cold_runs, time.thread_time)
            plan = hf_hsap.plan_sequence(cu, P, placement)
            sched = []
            for _ in range(max(1, cfg.cold_runs // 2)):
                fresh = hf_hsap.plan_sequence(cu, P, placement)
                sched.append(max(_median_ms(lambda: fresh.schedule(part), 1) for part in range(P)))
            cache = hf_hsap.PlanCache()
            hf_hsap.plan_sequence(cu, P, placement, cache=cache)
            t0 = time.perf_counter()
            for _ in range(cfg.cached_runs):
                hf_hsap.plan_sequence(cu, P, placement, cache=cache)
            cached = (time.perf_counter() - t0) / cfg.cached_runs * 1e3
            rows.append({"P": P, "placement": placement, "chosen": plan.placement_name, "cold_ms": cold,
                         "cold_cpu_ms": float(np.median(cpu_ms)), "cold_cpu_min_ms": min(cpu_ms),
                         "schedule_ms": float(np.median(sched)), "cached_ms": cached})
    return rows
