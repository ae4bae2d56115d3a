"""The clock-free part of the benchmark runner: traffic / cost tables for a tiny configuration, and the page and
detail files rendered from them."""
import numpy as np
import pytest

from benchmarks.suites.measured import summarize_times
from benchmarks.analytic.distributions import planning_lengths
from benchmarks.suites.planning import PlanningConfig, run_planning
from benchmarks.analytic.predictions import CostConfig
from benchmarks.report.analysis import analysis
from benchmarks.report.page import MAX_LINES, render_page
from benchmarks.report.cpu import cpu_detail
from benchmarks.report.details import CORE_GOALS, cost_detail, goals_detail, planning_detail, traffic_detail
from benchmarks.report.memory import MEMORY_GOALS
from benchmarks.suites.core import run_tables
from benchmarks.analytic.traffic import TrafficConfig, recv_floor
from hf_hsap import plan_sequence

TCFG = TrafficConfig(dists=("longtail", "mixed"), Ts=(131072,), Ps=(8,), seeds=(0,))
CCFG = CostConfig(topologies=(("A100", 1),))


@pytest.fixture(scope="module")
def tables():
    return run_tables(TCFG, CCFG)


def test_traffic_rows_cover_every_scheme(tables):
    rows = tables["traffic_rows"]
    names = {r["scheme"] for r in rows}
    assert {"ring", "zigzag_ring", "allgather_kv", "ulysses", "te_p2p", "whole_doc", "torch_cp", "usp_U2xR4",
            "te_a2a_p2p_U4xR2", "hsap", "hsap_batched", "hsap_U1", "hsap_balanced", "hsap_contiguous", "hsap_U2", "hsap_U4",
            "hsap_U8"} <= names
    ring = [r for r in rows if r["scheme"] == "ring"]
    assert all(r["recv_max"] == pytest.approx(1.0) and r["tok_max_mean"] == pytest.approx(1.0) for r in ring)
    assert all(r["mb_inter_llama3-8b"] == 0 for r in rows)  # P = 8: one node


def test_hsap_row_equals_plan_stats(tables):
    from benchmarks.analytic.distributions import cu_seqlens, doc_lengths

    from benchmarks.analytic.traffic import RECV_SHAPE, planner_cost

    row = next(r for r in tables["traffic_rows"] if r["scheme"] == "hsap" and r["dist"] == "longtail")
    cost = planner_cost(RECV_SHAPE, "nvlink", TCFG.planner_hardware[0])  # the traffic table's plan: P = 8, one node
    st = plan_sequence(cu_seqlens(doc_lengths("longtail", 131072, 0)), 8, "auto", cost=cost).stats()
    w, t, rv = (np.array(getattr(st, k), dtype=float) for k in ("attn_work", "tokens", "recv_kv_tokens"))
    assert row["work_max_mean"] == pytest.approx(w.max() / w.mean())
    assert row["tok_max_mean"] == pytest.approx(t.max() / t.mean())
    assert row["recv_max"] == pytest.approx(rv.max() / (7 / 8 * 131072))


def test_goals_and_cost_rows(tables):
    goals = tables["traffic_goals"]
    assert {(g["dist"], g["P"]) for g in goals} == {("longtail", 8), ("mixed", 8)}
    mixed = next(g for g in goals if g["dist"] == "mixed")
    assert mixed["recv"] >= mixed["recv_floor"] > 0.3  # the T/2 document sets a floor
    cost = tables["cost_rows"]
    assert len(cost) == 2 * 2  # two models x two distributions
    for r in cost:
        assert {"hsap", "hsap_bestU", "ulysses", "ring", "bound", "ideal"} <= set(r["tgs"])
        assert r["tgs"]["bound"] >= r["tgs"]["ideal"] >= max(v for k, v in r["tgs"].items() if k not in ("bound", "ideal")) * 0.999
        assert r["hsap_vs_ulysses"] == pytest.approx(r["tgs"]["hsap"] / r["tgs"]["ulysses"])
        assert r["tgs"]["hsap_bestU"] >= r["tgs"]["hsap"]
    assert tables["cost_goals"]["counts"]["ulysses"][1] == 4
    assert tables["cost_goals_U1"]["counts"]["best_other"][1] == 4
    assert tables["cost_goals_batched"]["counts"]["best_other"][1] == 4


def test_local_work_and_floor_by_hand():
    lengths = [10, 6, 30]
    plan = plan_sequence(np.concatenate([[0], np.cumsum(lengths)]), 2, "contiguous")
    # part 0 holds [0, 23): docs 10, 6 and 7 tokens of the 30; part 1 the other 23 tokens of the 30
    assert plan.stats().local_attn_work == [55 + 21 + 28, 23 * 24 / 2]
    for U in (1, 2):  # a rank computes 1/U of its part's heads: per rank, the part's local work / U
        p4 = plan_sequence(np.concatenate([[0], np.cumsum([50, 7, 90, 3])]), 4, "balanced", ulysses_size=U)
        part_local = [sum(n * (n + 1) / 2 for n in np.bincount(p4.layout.doc_of(p4.part_token_indices(r)),
                                                                  minlength=4)) for r in range(p4.n_parts)]
        assert np.allclose(p4.stats().local_attn_work, np.repeat(part_local, U) / U)
    assert recv_floor(np.array(lengths), 2) == pytest.approx(max(0.0, 30 - 23 * 1.1) / 23)


def test_render_and_measured_summary(tables):
    per_rank = [{"times": {"hsap": [1.0, 2.0, 3.0], "ring": [2.0, 2.0, 8.0]},
                 "cpu": {"hsap": [1.0, 1.0, 1.0], "ring": [2.0, 2.0, 2.0]},
                 "bytes": {"hsap": 10, "ring": 30}, "errors": {"hsap": 0.0, "ring": 1e-7},
                 "info": {"hsap": {"placement": "balanced", "recv_kv_tokens": 5, "attn_work": 90}, "ring": {}}},
                {"times": {"hsap": [1.5, 1.0, 3.0], "ring": [1.0, 4.0, 1.0]},
                 "cpu": {"hsap": [1.0, 1.0, 1.0], "ring": [2.0, 2.0, 2.0]},
                 "bytes": {"hsap": 20, "ring": 30}, "errors": {"hsap": 0.0, "ring": 1e-7},
                 "info": {"hsap": {"placement": "balanced", "recv_kv_tokens": 7, "attn_work": 110}, "ring": {}}}]
    s = summarize_times(per_rank)
    assert s["hsap"]["ms"] == pytest.approx(2000.0) and s["ring"]["ms"] == pytest.approx(4000.0)
    assert s["ring"]["ratio"] == pytest.approx(2.0) and s["ring"]["cpu_ratio"] == pytest.approx(2.0)
    assert s["ring"]["min_ratio"] == pytest.approx(2.0 / 1.5)
    assert s["hsap"]["bytes_max"] == 20 and s["hsap"]["bytes_mean"] == 15
    lengths = planning_lengths(4096, 20, 0)
    assert len(lengths) == 20 and lengths.sum() == 4096 and lengths.min() >= 16
    res = dict(tables)
    res["planning"] = run_planning(PlanningConfig(T=4096, n_docs=20, Ps=(8,), placements=("auto",), cold_runs=3,
                                                  cached_runs=2))
    assert 0 < res["planning"][0]["cold_cpu_min_ms"] <= res["planning"][0]["cold_cpu_ms"]  # the minimum of the runs
    res["measured"] = {"torch_cp": "NotImplementedError: x", "world": 2, "configs": [
        {"dist": "longtail", "T": 64, "hq": 8, "hkv": 2, "d": 64, "n_docs": 3, "pairs": 100, "results": s}]}
    res["memory"] = None
    res["meta"] = {"date": "today", "commit": "abc", "cpu": "cpu", "cores": 2, "load_start": [0.1, 0, 0],
                   "load_end": [0.2, 0, 0], "torch": "x", "numpy": "y", "python": "z", "command": "cmd", "seconds": 1.0}
    md = "\n\n".join(f(res) for f in (goals_detail, traffic_detail, cost_detail, planning_detail, cpu_detail, analysis))
    for heading in (f"## Goals: {CORE_GOALS}", "## Exact traffic and balance", "## Cost model", "## Planning time",
                    "## Measured on CPU", "#### longtail, T = 131072 (128K), P = 8", "#### A100, 1 node(s)"):
        assert heading in md
    assert "**not met**" in md  # mixed cannot reach 0.35 of ring's
    assert "does not run on CPU / gloo" in md
    assert "busiest rank holds 1.100 × the mean pairs" in md  # 110 against the mean of 90 and 110
    assert "2026-" not in md and "profiler" not in md  # no dated remarks in the generated text
    page = render_page(res, {"traffic": "benchmarks/results/traffic.md"})  # no side results: their sections drop
    assert page.count("\n") <= MAX_LINES
    assert "[Exact traffic and balance (no clock)](benchmarks/results/traffic.md)" in page
    assert f"### Goals: {CORE_GOALS}" in page and "## Planning time" in page and "## Against the peers" in page
    assert f"### Goals: {MEMORY_GOALS}" not in page and "## Model coverage" not in page
    assert "\nCommand: `bash scripts/bench.sh` (`cmd`): `plan_sequence`" in page
