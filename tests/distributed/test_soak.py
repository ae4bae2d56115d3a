"""The soak's short version (``benchmarks/suites/soak.py``; the 2,000-step run is ``python -m benchmarks soak``): 100
training steps on 2 gloo ranks, a new packing layout every step, a plan cache of 8. What must stay bounded is
checked; the clock is not (the full soak checks the throughput drift)."""
from __future__ import annotations

from benchmarks.analytic.soak import check_bounded, summarize

from benchmarks.suites.soak import soak_worker

STEPS, CACHE = 100, 8


def test_a_long_run_with_a_new_layout_every_step_stays_bounded(pools) -> None:
    ranks = pools(2, 300).run(soak_worker, STEPS, 128, CACHE)
    s = summarize(ranks)
    check_bounded(s)
    assert s["cache_max"] == CACHE and s["distinct_layouts"] == STEPS  # the cache was full and evicted
    assert all(r["samples"][-1]["cache"] == CACHE for r in ranks)
    assert s["rss_growth_mib"] >= 0 and s["warmup"] == 25
    assert ranks[0]["loss_first"] == ranks[1]["loss_first"] and ranks[0]["loss_last"] == ranks[1]["loss_last"]
