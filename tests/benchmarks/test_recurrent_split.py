"""benchmarks/suites/recurrent_split.py: its measurement in --quick mode on spawned ranks (never timed): row A's
document really split (continued runs on every rank but the first), row B's documents one whole per rank, the summary
bytes of both directions equal to the formula, each row's loss at SP P equal to its SP 1 loss, the results' slot for a
mode not built yet, the report's structure; and the detail file against the committed results."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.report.recurrent_split import split_headline, split_section
from benchmarks.suites.recurrent_split import (DEFAULT_OUT, RecurrentSplitConfig, _own_out, run_recurrent_split)
from benchmarks.suites.recurrent_split_workers import MODELS, MODES, ROWS, model_config, row_lengths, summary_rows
from hf_hsap.testing import DistPools


def test_the_summary_rows_read_the_configs() -> None:
    cfg = RecurrentSplitConfig()
    rows = {name: summary_rows(name, model_config(name, cfg.sizes, cfg.vocab)) for name in MODELS}
    # gated delta rule: C = q, k (4 heads of 32) + v (8 heads of 32); state 8 x 32 x 32, transition 8 x 32 x 32
    assert rows["gated_delta_rule"] == {"conv": (512 * 3 + 9) * 4, "recurrent": (8 * 32 * 32 * 2) * 4,
                                        "per_summary": (512 * 3 + 9) * 4 + 65536, "layers": 4, "channels": 512}
    # Mamba2: C = expand x hidden + 2 x groups x N = 512 + 128; state 8 heads x 64 x 64, transition 8
    assert rows["mamba2"] == {"conv": (640 * 3 + 9) * 4, "recurrent": (8 * 64 * 64 + 8) * 4,
                              "per_summary": (640 * 3 + 9) * 4 + (8 * 64 * 64 + 8) * 4, "layers": 4, "channels": 640}
    # KDA: C = q, k, v (8 heads of 32 each); state and transition 8 x 32 x 32
    assert rows["kda"] == {"conv": (768 * 3 + 9) * 4, "recurrent": 65536, "per_summary": (768 * 3 + 9) * 4 + 65536,
                           "layers": 4, "channels": 768}
    assert row_lengths("A", 8192, 4) == [8192] and row_lengths("B", 8192, 4) == [2048] * 4


def test_the_models_are_recurrent_only() -> None:
    cfg = RecurrentSplitConfig()
    for name in ("gated_delta_rule", "kda"):
        assert set(model_config(name, cfg.sizes, cfg.vocab).layer_types) == {"linear_attention"}
    assert model_config("mamba2", cfg.sizes, cfg.vocab).model_type == "mamba2"


def test_the_second_step_of_the_hybrid_command_writes_its_own_file() -> None:
    assert _own_out(["--quick", "--out", "/x/h.json"]) == ["--quick", "--out", "/x/h.recurrent_split.json"]
    assert _own_out(["--out=/x/h.json"]) == ["--out=/x/h.recurrent_split.json"]
    assert _own_out(["--quick"]) == ["--quick"]


@pytest.mark.slow  # a quick benchmark run on spawned ranks (~25 s on 2 cores)
def test_quick_run_splits_row_a_and_measures_the_formula(pools: DistPools) -> None:
    cfg = RecurrentSplitConfig().quick()
    res = run_recurrent_split(cfg, pools, timeout_s=120.0)
    assert set(res["modes"]) == set(MODES)
    for mode_name in MODES:
        mode = res["modes"][mode_name]
        assert mode["status"] == "measured" and [r["sp"] for r in mode["rows"]] == list(cfg.sp_sizes)
    for r in res["modes"]["summary_exchange"]["rows"]:
        p = r["sp"]
        assert set(r["models"]) == set(MODELS)
        for name, m in r["models"].items():
            f = m["formula"]
            a, b = m["A"], m["B"]
            for row in ROWS:
                assert sum(m[row]["tokens"]) == cfg.tokens and len(m[row]["tokens"]) == p
                assert m[row]["cpu_s"] is None and m[row]["wait_s_ranks"] == [None] * p  # never timed
                assert m[row]["loss_rel_err"] <= 1e-4 and m[row]["loss"] == pytest.approx(m[row]["loss_sp1"], rel=1e-4)
                assert m[row]["equal"], (name, p, row)
            # A: one document on every rank in order, each run after the first continued, one summary to each later
            # holder (contiguous placement: P (P - 1) / 2 per layer)
            assert a["doc_ranks"] == {0: list(range(p))} and a["continued"] == [0] + [1] * (p - 1) and a["remote"]
            assert a["summaries"] == p * (p - 1) // 2
            for kind in ("conv", "recurrent"):
                assert a["bytes"][kind]["forward"] == a["bytes"][kind]["backward"] == a["summaries"] * f[kind] > 0
                assert a["exchanges"][kind] == {"forward": 1, "backward": 1, "expected": 1}
            # B: document r whole on rank r, nothing exchanged
            assert b["docs_per_rank"] == [[i] for i in range(p)] and b["summaries"] == 0 and not b["remote"]
            assert b["bytes"]["total"] == {"forward": 0, "backward": 0, "formula": 0}
            assert b["exchanges"]["recurrent"] == {"forward": 0, "backward": 0, "expected": 0}
    # the heads mode: every kernel's heads divide the group here, so no summary moves; A's kernels all-to-all (every
    # rank runs the whole row for its heads), B's run their whole documents where they are; the losses are SP 1's
    for r in res["modes"]["heads_all_to_all"]["rows"]:
        for name, m in r["models"].items():
            for row in ROWS:
                assert m[row]["equal"] and m[row]["bytes"]["total"] == {"forward": 0, "backward": 0, "formula": 0}
                assert (m[row]["a2a_bytes_per_layer"] > 0) == (row == "A") and m[row]["loss_rel_err"] <= 1e-4
    assert res["loss_err"] <= cfg.loss_tol and len(res["load"]) == 2
    text = split_section(res)
    assert text.startswith("## Recurrent layers under SP") and "### Mode: heads all-to-all" in text
    assert "Not measured" not in text
    # the models table (header + a row per model), a results table per mode (header + a row per SP size and model)
    assert text.count("\n| ") == (1 + len(MODELS)) + 2 * (1 + len(cfg.sp_sizes) * len(MODELS))
    head = "\n".join(split_headline(res))
    assert "Not measured yet" not in head and head.count("\n| ") == 1 + len(MODELS)


def test_the_detail_file_renders_from_the_committed_results() -> None:
    res = json.loads(Path(DEFAULT_OUT).read_text())
    rows = res["modes"]["summary_exchange"]["rows"]
    assert [r["sp"] for r in rows] == [2, 4] and res["config"]["tokens"] == 8192
    assert all(m[row]["equal"] for r in rows for m in r["models"].values() for row in ROWS)
    assert all(m["cpu_ratio"] is not None for r in rows for m in r["models"].values())
    detail = (Path(DEFAULT_OUT).parent / "hybrid.md").read_text()
    assert split_section(res).strip() in detail
