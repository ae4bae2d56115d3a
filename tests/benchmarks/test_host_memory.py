"""The host-memory suite's arithmetic and page (benchmarks/suites/host_memory.py, benchmarks/report/memory.py) and the
longest-row search (benchmarks/suites/longest_rows.py), without measuring."""
from __future__ import annotations

import pytest

from benchmarks.report.memory import host_memory_section, memory_goal_rows
from benchmarks.suites.host_memory import CONFIGS, HOST_TOL, MMAP_ENV, error_row, predict_host
from benchmarks.suites.longest_rows import LLAMA3_8B, best_rows, longest_rows, settings_here
from benchmarks.suites.memory_model import DENSE


def test_the_prediction_is_the_footprint_plus_every_tensor_term() -> None:
    footprint = 300 * 2**20
    step, host = predict_host(DENSE, 4096, {}, 1, "fp32", "adamw", footprint)
    assert host.per_process == pytest.approx(footprint + step.total) and step.host == 0
    assert step.weights > 0 and step.optimizer > 0  # weights and AdamW's states are host memory on CPU
    row = error_row("x", {"peak": host.per_process * 1.25, "footprint": footprint, "loss": [1.0]}, step, host)
    assert row["error"] == pytest.approx(1 / 1.25 - 1)
    assert row["tensors_measured_mib"] == pytest.approx((host.per_process * 1.25 - footprint) / 2**20)


def _results(errors: list[float]) -> dict:
    rows = [{"name": f"c{i}", "tokens": 1024, "sp": 1, "footprint_mib": 400.0, "tensors_measured_mib": 100.0,
             "tensors_predicted_mib": 100.0 * (1 + e), "measured_mib": 500.0, "predicted_mib": 500.0 * (1 + e),
             "error": e, "default_measured_mib": 600.0, "default_error": -0.2} for i, e in enumerate(errors)]
    return {"command": "python -m benchmarks host_memory", "seconds": 1.0, "steps": 2, "validation": rows,
            "max_abs_error": max(abs(e) for e in errors), "tolerance": HOST_TOL, "mmap_env": MMAP_ENV,
            "default_max_abs_error": 0.2}


def test_the_goal_needs_eight_configurations_within_ten_percent() -> None:
    assert len(CONFIGS) >= 8 and {c[4] for c in CONFIGS} == {1, 2} and {c[6] for c in CONFIGS} == {"adamw", "sgd"}
    assert memory_goal_rows(None, None, host=_results([0.05] * 8))[0][2] == "**met**"
    assert memory_goal_rows(None, None, host=_results([0.05] * 7))[0][2] == "**not met**"
    assert memory_goal_rows(None, None, host=_results([0.05] * 7 + [-0.12]))[0][2] == "**not met**"
    text = host_memory_section(_results([0.05] * 8))
    assert "## Host memory" in text and "+5.0%" in text and "-20.0%" in text and "MALLOC_MMAP_THRESHOLD_" in text


def test_the_search_skips_levers_this_branch_lacks_and_keeps_the_longest() -> None:
    settings = [("all", dict(gradient_checkpointing=True, activation_offloading=True), {}),
                ("unknown", dict(no_such_lever=True), {})]
    assert [s[0] for s in settings_here(settings)] == ["all"]
    rows = longest_rows((8,), {"Llama-3-8B": LLAMA3_8B}, settings, host_memory_gib=2048)
    assert {r["offload"] for r in rows} == {"none", "optimizer", "params"} and len(rows) == 3 * 3
    assert all(r["tokens"] == min(r["device_tokens"], r["host_tokens"]) for r in rows)
    (best,) = best_rows(rows)
    assert best["tokens"] == max(r["tokens"] for r in rows)
    assert best["device_only"] == max(r["device_tokens"] for r in rows) and best["goal"] == 6_000_000
