"""The soak's figures and bounds from its ranks' samples (no processes, no clock): what the soak
(:mod:`benchmarks.suites.soak`) and its CI test check, and what its page shows."""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["DRIFT_TOL", "RSS_GROWTH_MIB", "check_bounded", "summarize"]


RSS_GROWTH_MIB = 64.0  # resident memory may grow at most this much after the warm-up (allocator noise)


DRIFT_TOL = 0.25  # steps/s of the last quarter within 25% of the second quarter's


def summarize(ranks: list[dict[str, Any]], warmup: int | None = None) -> dict[str, Any]:
    """The soak's figures over every rank.

    Args:
        ranks: :func:`soak_worker`'s results. warmup: steps before the memory baseline (default: a quarter of
            the run, at least twice the cache size: the cache is full and the allocator warm).

    Returns:
        ``rss_growth_mib`` (largest RSS after the warm-up minus the RSS at it, worst rank), ``cache_max`` /
        ``cache_maxsize``, ``distinct_layouts`` (plan-cache misses of rank 0 over the entries one layout makes),
        ``peers_max``, ``logged_growth``,
        ``steps_per_s_q2`` / ``steps_per_s_q4`` (second and last quarter, slowest rank per step) and ``drift``
        (their relative change).
    """
    steps = ranks[0]["steps"]
    warmup = warmup if warmup is not None else min(steps - 1, max(steps // 4, 2 * ranks[0]["cache_maxsize"]))
    growth, logged = 0.0, 0
    for r in ranks:
        base = min((s for s in r["samples"] if s["step"] >= warmup), key=lambda s: s["step"])
        after = [s for s in r["samples"] if s["step"] >= base["step"]]
        growth = max(growth, max(s["rss_mib"] for s in after) - base["rss_mib"])
        logged = max(logged, max(s["logged"] for s in after) - base["logged"])
    per_step = np.max(np.array([r["step_s"] for r in ranks]), axis=0)
    q = steps // 4
    q2, q4 = 1.0 / float(np.mean(per_step[q:2 * q])), 1.0 / float(np.mean(per_step[3 * q:]))
    return {"steps": steps, "world": ranks[0]["world"], "tokens": ranks[0]["tokens"], "warmup": warmup,
            "rss_start_mib": max(r["samples"][0]["rss_mib"] for r in ranks),
            "rss_end_mib": max(r["samples"][-1]["rss_mib"] for r in ranks), "rss_growth_mib": growth,
            "cache_max": max(s["cache"] for r in ranks for s in r["samples"]),
            "cache_maxsize": ranks[0]["cache_maxsize"],
            "distinct_layouts": ranks[0]["misses"] / ranks[0].get("entries_per_layout", 1),
            "peers_max": max(s["peers"] for r in ranks for s in r["samples"]),
            "logged_growth": logged, "steps_per_s_q2": q2, "steps_per_s_q4": q4, "drift": q4 / q2 - 1.0,
            "loss_first": ranks[0]["loss_first"], "loss_last": ranks[0]["loss_last"]}


def check_bounded(s: dict[str, Any], rss_growth_mib: float = RSS_GROWTH_MIB) -> None:
    """Assert what a long run must keep bounded (no clock: the tests use this one).

    Raises:
        AssertionError: the plan cache over its size, fewer distinct layouts than steps (the soak would not test
            the cache), RSS growing by more than ``rss_growth_mib`` after the warm-up, communication counters
            or ``log_once`` sets growing.
    """
    assert s["cache_max"] <= s["cache_maxsize"], s
    assert s["distinct_layouts"] == s["steps"], s  # a new layout (a cache miss) every step
    assert s["rss_growth_mib"] <= rss_growth_mib, s
    assert s["peers_max"] <= s["world"] and s["logged_growth"] == 0, s
