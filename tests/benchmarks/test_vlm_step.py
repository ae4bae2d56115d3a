"""benchmarks/suites/vlm_step.py: its measurement in --quick mode on spawned ranks (memory only, never timed),
and its detail file (benchmarks/results/vlm.md) against the committed results."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.report.vlm import vlm_section

from benchmarks.suites.vlm_step import DEFAULT_OUT, VLMStepConfig, run_vlm_step
from benchmarks.suites.vlm_workers import SCHEMES, VIDEO_SCHEMES
from hf_hsap.testing import DistPools


def test_quick_run_encodes_fewer_images_per_rank_than_the_baseline(pools: DistPools) -> None:
    cfg = VLMStepConfig().quick()
    res = run_vlm_step(cfg, pools, timeout_s=120.0)
    assert [r["sp"] for r in res["rows"]] == [1, 2]
    for r in res["rows"]:
        for name in SCHEMES:
            s = r[name]
            assert s["peak_mib"] > 0 and len(s["peak_mib_ranks"]) == r["sp"] == len(s["pixel_rows"])
            assert s["cpu_s"] is None and s["vision_cpu_s"] is None  # memory only
            assert s["loss_err"] <= cfg.loss_tol and sum(s["tokens"]) == res["row"]["tokens"]
        assert r["baseline"]["pixel_rows"] == [res["row"]["pixel_rows"]] * r["sp"]  # every rank: every image
    one, two = res["rows"]
    assert one["hf_hsap"]["pixel_rows"] == one["baseline"]["pixel_rows"]
    assert max(two["hf_hsap"]["pixel_rows"]) < max(two["baseline"]["pixel_rows"])
    (video,) = res["video_rows"]  # the long video row at SP 2: a video split across the ranks
    once, holders, base, once_b, holders_b = (video[name] for name in VIDEO_SCHEMES)
    for s in (once, holders, base, once_b, holders_b):
        assert s["loss_err"] <= cfg.loss_tol and s["grad_err"] <= 1e-5 and s["cpu_s"] is None
        # the planner's per-part encoder + decoder work (not for the baseline, which runs the tower on every rank)
        assert (len(s["predicted"]) == 2 and min(s["predicted"]) > 0) if s is not base else s["predicted"] == []
    # the encoder-weighed plans: the busiest part's predicted encoder + decoder work is never above today's
    assert max(holders_b["predicted"]) <= max(holders["predicted"]) * (1 + 1e-9)
    assert max(once_b["predicted"]) <= max(once["predicted"]) * (1 + 1e-9)
    assert base["pixel_rows"] == [res["video_row"]["pixel_rows"]] * 2
    assert sum(once["sent"]) == sum(once["received"]) > 0 == sum(holders["received"])  # rows moved once only
    assert sum(once["pixel_rows"]) < sum(holders["pixel_rows"])  # the split video encoded by one rank
    text = vlm_section(res)
    # headers + 2 SP sizes + one video line per scheme
    assert text.startswith("## VLM training step") and text.count("\n| ") == 4 + len(VIDEO_SCHEMES)


def test_the_detail_file_renders_from_the_committed_results() -> None:
    res = json.loads(Path(DEFAULT_OUT).read_text())
    assert [r["sp"] for r in res["rows"]] == [1, 2, 4]
    detail = (Path(DEFAULT_OUT).parent / "vlm.md").read_text()
    assert detail.startswith("# VLM training step") and vlm_section(res).strip() in detail
