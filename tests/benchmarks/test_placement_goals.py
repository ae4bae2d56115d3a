"""benchmarks.report.placement_goals: the placement and peers goals table reads its figures from the sweep, the peers' run and the planning
rows, and each status follows the figures (rows built by hand, so a wrong rule flips an asserted status)."""
from benchmarks.report.placement_goals import placement_goal_rows


def _sweep_row(link, lb, auto, bound, others=None, oracle=None, tokens=1.0, T=4096, P=4, U=1):
    row = {"link": link, "lb": lb, "bound": bound, "T": T, "P": P, "U": U, "tokens": tokens,
           "est": {"auto": auto, **{o: others or auto for o in ("contiguous", "zigzag", "balanced", "density")}}}
    if oracle is not None:
        row["oracle"] = oracle
    return row


def _peer_config(hsap_mib, ds_ratio, alst_ratio, ds_mib=50.0, alst_mib=60.0):
    def scheme(ratio, mib):
        return {"ratio": ratio, "ratio_q1": ratio - 0.02, "noise": 0.05, "tensor_mib": mib, "peak_mib": mib * 2,
                "cpu_ratio": ratio}

    return {"results": {"hsap": scheme(1.0, hsap_mib), "deepspeed_ulysses": scheme(ds_ratio, ds_mib),
                        "alst": scheme(alst_ratio, alst_mib)}}


def _by_goal(rows):
    return {goal: (value, status) for goal, value, status in rows}


def test_every_goal_met():
    sweep = {"rows": [_sweep_row("nvlink", 1.0, 1.0, 1.0, oracle=1.0),
                      _sweep_row("network", 1.0, 1.05, 1.0, oracle=1.04, tokens=1.1001, T=65536, P=48)]}
    peers = {"configs": [_peer_config(40.0, 1.02, 1.00), _peer_config(30.0, 1.2, 1.1)]}
    planning = [{"P": 64, "placement": "auto", "cold_cpu_ms": 19.0, "cached_ms": 0.05}]
    rows = placement_goal_rows({"sweep": sweep, "peers": peers, "planning": planning})
    assert len(rows) == 10 and all(status.startswith("**met**") for _, _, status in rows), rows
    goals = _by_goal(rows)
    tokens = next(v for g, v in goals.items() if g.startswith("tokens"))
    assert "worst 1.1001; above the cap on 0 layouts" in tokens[0]  # 1502 tokens = floor(1.10 · 1366)
    assert any(v[0].startswith("≤ on 2/2 rows") for v in goals.values())


def test_each_goal_fails_on_its_own_figure():
    sweep = {"rows": [_sweep_row("nvlink", 1.0, 1.06, 1.0, others=1.05, oracle=1.0),
                      _sweep_row("network", 1.0, 1.2, 1.15, oracle=1.1, tokens=1.2)]}
    peers = {"configs": [_peer_config(60.0, 1.02, 0.98)]}  # slower than ALST, above DeepSpeed's memory
    planning = [{"P": 64, "placement": "auto", "cold_cpu_ms": 21.0, "cached_ms": 0.05}]
    rows = placement_goal_rows({"sweep": sweep, "peers": peers, "planning": planning})
    statuses = [status for _, _, status in rows]
    assert all(s.startswith("**not met**") for s in statuses), rows
    goals = _by_goal(rows)
    assert "slower than one of them on 1 of 2 layouts" in next(v for g, v in goals.items() if g.startswith("`auto`"))[0]
    default = next(s for g, (_, s) in goals.items() if g.startswith("the default"))
    assert default == "**not met** (1/2)"  # ALST's CPU time below hf_hsap's on the row
    network = next(v for g, v in goals.items() if "network pricing" in g)[0]
    assert network.startswith("0.0%; no placement within the token cap can on 100.0%")
    assert "(1/2)" in next(v for g, v in goals.items() if g.startswith("CPU measured"))[1]
    oracle = next(v for g, v in goals.items() if g.endswith("where it runs (network)"))[0]
    assert oracle.startswith("0.0% of 1 (worst 1.091)") and oracle.endswith("on 0 of the 1 misses")  # nothing simulated
    sweep["rows"][1].update(sim=1.3, oracle_sim=1.4)
    oracle = _by_goal(placement_goal_rows({"sweep": sweep}))["est max within 1.02 of the oracle where it runs (network)"]
    assert oracle[0].endswith("slower with the rounds simulated on 1 of the 1 misses")


def test_the_default_is_judged_by_the_interval_of_its_cpu_ratio():
    """A median CPU ratio below 1 whose interval holds 1 is a tie (met); an interval wholly below 1 is slower."""
    def default_status(hi):
        cfg = _peer_config(40.0, 1.02, 0.98)
        cfg["results"]["alst"]["cpu_hi"] = hi
        rows = _by_goal(placement_goal_rows({"peers": {"configs": [cfg]}}))
        return next(v for g, v in rows.items() if g.startswith("the default"))

    value, status = default_status(1.01)
    assert status == "**met** (2/2)" and "≥ 1.00 on 1/2" in value
    assert default_status(0.995)[1] == "**not met** (1/2)"


def test_missing_figures_give_no_rows():
    assert placement_goal_rows({}) == []
    assert placement_goal_rows({"planning": [{"P": 8, "placement": "auto", "cold_cpu_ms": 1, "cached_ms": 0.01}]}) == []
