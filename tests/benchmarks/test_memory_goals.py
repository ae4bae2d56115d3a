"""The memory goals table and the memory sections of BENCHMARKS.md (benchmarks/report/memory.py) from results
files."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.report.memory import memory_goal_rows, memory_sections

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _levers(all_peak: float, all_time: float, growth: float) -> dict:
    rows = []
    for t in (1024, 2048):
        for scheme, peak, cpu in (("full", 100.0, 1.0), ("chunked", 40.0, 0.9), ("trl_fused", 50.0, 1.5),
                                  ("all", all_peak, all_time), ("alst", 30.0, 1.1)):
            rows.append({"tokens_per_rank": t, "scheme": scheme, "peak_mib": peak, "cpu_s": cpu, "wall_s": cpu,
                         "loss_err": 0.0, "grad_err": 1e-6, "at_peak": []})
    cfg = {"world": 2, "reps": 3, "model": dict(vocab=10, hidden=8, layers=1, heads=2, kv_heads=1, inter=16)}
    recipe = {name: {"short": {"rss_gib": 1, "tokens_per_rank": 10}, "long": {"rss_gib": 2, "tokens_per_rank": 20},
                     "kb_per_token": kb} for name, kb in (("no levers", 500.0), ("--gradient_checkpointing", growth))}
    return {"levers": {"config": cfg, "deepspeed": "ok", "rows": rows}, "recipe": recipe, "seconds": 1.0}


def test_each_goal_is_met_or_not_on_its_own_figure() -> None:
    met = memory_goal_rows(_levers(20.0, 1.2, 50.0), None)
    assert len(met) == 5 and {r[2] for r in met} == {"**met**"}
    missed = [r[0] for r in memory_goal_rows(_levers(35.0, 1.5, 120.0), None) if r[2] != "**met**"]
    assert len(missed) == 3  # the recipe's growth, the step time and the peak against ALST's
    assert "RSS growth" in missed[0] and "step time" in missed[1] and "ALST" in missed[2]


def test_the_committed_results_render() -> None:
    """The results files in the repository give the goal rows and both sections (the model's longest rows with
    ALST's figures beside them)."""
    res = {k: json.loads((RESULTS / f"{k}.json").read_text()) for k in ("memory_levers", "memory_model")}
    rows = memory_goal_rows(res["memory_levers"], res["memory_model"])
    assert any("Llama-3-8B on 8 ×" in r[0] for r in rows) and any("within 10%" in r[0] for r in rows)
    text = "\n".join(memory_sections(res))
    assert "## Memory levers, measured side by side on CPU" in text and "## Memory model and the longest row" in text
    assert "3,700,000" in text  # ALST's published 3.7M on 8 H100s, beside the prediction
