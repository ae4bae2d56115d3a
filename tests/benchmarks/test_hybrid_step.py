"""benchmarks/suites/hybrid_step.py: its measurement in --quick mode on spawned ranks (never timed): the report's structure,
both hybrids' (default and priced plan) summary exchanges (one per recurrent mixer, layer and direction when a
document is split) and measured summary bytes equal to the formula, the priced plan's config, and its detail file
(benchmarks/results/hybrid.md) against the committed results."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import hf_hsap
from benchmarks.report.hybrid import hybrid_section
from benchmarks.suites.hybrid_step import DEFAULT_OUT, HYBRIDS, HybridStepConfig, model_facts, run_hybrid_step
from benchmarks.suites.hybrid_workers import VARIANTS, model_config, plan_config, priced_cost, state_formula
from hf_hsap.testing import DistPools


def test_the_formula_reads_the_state_shapes_of_the_config() -> None:
    c = model_config("hybrid", HybridStepConfig().sizes, 4096)
    f = state_formula(c)
    channels = 2 * 4 * 32 + 8 * 32  # q and k (4 heads of 32), v (8 heads of 32)
    conv = (channels * 3 + 3 * 3) * 4  # B: the last 3 inputs; A: a 3 x 3 shift
    rec = (8 * 32 * 32 + 8 * 32 * 32) * 4  # B: 8 value heads of 32 x 32; A: 8 x 32 x 32 (D_k x D_k)
    assert f == {"conv": conv, "recurrent": rec, "per_summary": conv + rec, "mixer_layers": 3}
    att = model_config("attention", HybridStepConfig().sizes, 4096)
    assert (att.hidden_size, att.num_hidden_layers, att.num_attention_heads, att.intermediate_size) == \
        (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size)
    assert set(att.layer_types) == {"full_attention"}


def test_the_priced_plan_differs_from_the_default_by_its_cost_model_only() -> None:
    c = model_config("hybrid", HybridStepConfig().sizes, 4096)
    cost = priced_cost(c)
    assert cost.mixer_token_cost > 0 and cost.handoff_cost > 0  # the recurrent layers are priced
    cfg = plan_config(c, 4)
    assert (cfg.sp_size, cfg.cost_model, cfg.placement) == (4, cost, "auto")
    assert plan_config(c, 4, hf_hsap.HSAPConfig(sp_size=4, ulysses_size=1)).cost_model == cost
    with pytest.raises(AssertionError):
        plan_config(c, 4, hf_hsap.HSAPConfig(sp_size=4, rounds="batched"))
    assert HYBRIDS == ("hybrid", "hybrid_priced") and VARIANTS["hybrid_priced"] == ("hybrid", "priced")


@pytest.mark.slow  # a quick benchmark run on spawned ranks (~30 s on 2 cores)
def test_quick_run_measures_the_state_bytes_of_the_formula(pools: DistPools) -> None:
    cfg = HybridStepConfig().quick()
    res = run_hybrid_step(cfg, pools, timeout_s=120.0)
    f = model_facts(cfg)["formula"]
    assert [r["sp"] for r in res["rows"]] == [1, 2] and res["row"]["tokens"] == sum(cfg.lengths)
    assert set(res["model"]["cost"]) >= {"link", "hardware", "mixer_token_cost", "handoff_cost"}
    for r in res["rows"]:
        assert set(r) == {"sp", *VARIANTS}
        for name in VARIANTS:
            s = r[name]
            assert s["peak_mib"] > 0 and len(s["peak_mib_ranks"]) == r["sp"] == len(s["tokens"])
            assert s["cpu_s"] is None  # never timed
            assert sum(s["tokens"]) == res["row"]["tokens"]
            assert len(s["runs"]) == r["sp"] and s["split_docs"] == len(s["doc_ranks"])
        for name in HYBRIDS:
            states, h = r[name]["states"], r[name]
            assert states["equal"], name
            for kind in ("conv", "recurrent"):
                layer = states["layer"][kind]
                assert layer["measured"] == layer["measured_backward"] == layer["formula"] == h["summaries"] * f[kind]
                assert states["exchanges"][kind] == {"forward": int(h["remote"]), "backward": int(h["remote"]),
                                                     "expected": int(h["remote"])}
            assert states["step"]["measured"] == states["step"]["formula"] == \
                2 * f["mixer_layers"] * h["summaries"] * f["per_summary"]
            assert len(h["continued"]) == r["sp"] and h["params"] == r["hybrid"]["params"]
        assert r["attention"]["summaries"] is None and "states" not in r["attention"]
        assert r["hybrid_priced"]["loss"] == pytest.approx(r["hybrid"]["loss"], rel=cfg.priced_tol)
    one, two = res["rows"]
    for name in HYBRIDS:
        assert one[name]["summaries"] == 0 and one[name]["comm_bytes"] == 0 and not one[name]["remote"]
        assert one[name]["states"]["exchanges"]["recurrent"]["forward"] == 0
        # the 60-token document is split: a run continued on another rank, one exchange per layer each way
        assert two[name]["split_docs"] >= 1 and two[name]["summaries"] >= 1 and two[name]["remote"]
        assert sum(two[name]["continued"]) >= 1
        assert two[name]["states"]["exchanges"]["recurrent"]["forward"] == 1
        assert two[name]["comm_bytes"] >= two[name]["states"]["step"]["measured"] > 0
    assert max(res["loss_err"].values()) <= cfg.loss_tol and res["priced_err"] <= cfg.priced_tol
    text = hybrid_section(res)
    assert text.startswith("## Hybrid model training step") and text.count("\n| ") == 9  # 3 tables: header + 2 SPs
    assert "### The hybrid, planned for it" in text


def test_the_detail_file_renders_from_the_committed_results() -> None:
    res = json.loads(Path(DEFAULT_OUT).read_text())
    assert [r["sp"] for r in res["rows"]] == [1, 2, 4]
    assert all(r[name]["states"]["equal"] for r in res["rows"] for name in HYBRIDS)
    detail = (Path(DEFAULT_OUT).parent / "hybrid.md").read_text()
    assert detail.startswith("# Hybrid model training step") and hybrid_section(res).strip() in detail
