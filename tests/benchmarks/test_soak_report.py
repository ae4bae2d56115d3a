"""The soak's figures and bounds (benchmarks/analytic/soak.py) on made-up samples (no processes, no clock): what the
soak and its CI test assert, and the BENCHMARKS.md section."""
from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks.analytic.soak import check_bounded, summarize
from benchmarks.report.soak import soak_markdown


def ranks(rss_growth: float = 0.0, cache: int = 4, misses: int = 40, slow_end: float = 1.0) -> list[dict[str, Any]]:
    steps = 40
    out = []
    for _ in range(2):
        samples = [{"step": s, "rss_mib": 300.0 + rss_growth * s / steps, "cache": min(s, cache), "peers": 1,
                    "logged": 3} for s in range(1, steps + 1, 5)]
        out.append({"steps": steps, "world": 2, "tokens": 128, "samples": samples, "cache_maxsize": 4,
                    "misses": misses, "hits": 0, "loss_first": 4.6, "loss_last": 4.5,
                    "step_s": [0.1] * 30 + [0.1 * slow_end] * 10})
    return out


def test_bounded_figures_pass_and_each_unbounded_one_fails() -> None:
    s = summarize(ranks())
    check_bounded(s)
    assert s["warmup"] == 10 and s["rss_growth_mib"] == 0 and s["drift"] == pytest.approx(0.0)
    assert summarize(ranks(slow_end=2.0))["drift"] == pytest.approx(-0.5)  # the last quarter at half the speed
    for bad in (ranks(rss_growth=400.0), ranks(cache=5), ranks(misses=39)):
        with pytest.raises(AssertionError):
            check_bounded(summarize(bad))


def test_the_section_renders_the_result() -> None:
    s = dict(summarize(ranks()), when="2026-01-01", commit="abc1234", seconds=1.0)
    text = soak_markdown(json.loads(json.dumps(s)))  # what the results JSON gives back
    assert text.startswith("## Soak") and "40 training steps" in text and "commit abc1234" in text
    assert "| plan cache entries (max) | 4 | <= 4 (LRU size) |" in text
