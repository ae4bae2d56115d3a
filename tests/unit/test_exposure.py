"""The exposure-aware refinement of ``auto``'s winner (:mod:`hf_hsap.plan.exposure`): never slower by the cost
model, within the token cap, deterministic, the same (part, document) pairs; ``auto`` keeps it only where it
gains and the rounds simulated forward and backward agree."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import assert_covers_once, ci_examples, cu_of
from hf_hsap.plan.cost import CostModel, part_times
from hf_hsap.plan.simulation import simulated_time
from hf_hsap.plan.exposure import EXPOSURE_MIN_GAIN, refine_exposure
from hf_hsap.plan.group import GroupSpec
from hf_hsap.plan.layout import Layout, make_layout
from hf_hsap.plan.placement import token_cap
from hf_hsap.plan.planner import _best_candidate, plan_layout
from hf_hsap.plan.polishing import exposure_evened, polished
from hf_hsap.plan.refine import refine_moves
from hf_hsap.plan.windows import window_transfers

PLACED = ("contiguous", "zigzag", "balanced", "density")


def pairs_of(pl) -> set[tuple[int, int]]:
    """The (part, document) pairs a placement holds."""
    return set(zip(pl.part.tolist(), pl.doc.tolist()))


@settings(max_examples=ci_examples(40), deadline=None)
@given(lengths=st.lists(st.one_of(st.integers(1, 200), st.integers(500, 4000)), min_size=1, max_size=30),
       P=st.integers(2, 24), name=st.sampled_from(PLACED), link=st.sampled_from(["nvlink", "network"]))
def test_never_slower_within_the_cap_and_deterministic(lengths, P, name, link):
    layout = make_layout(cu_of(lengths))
    if layout.total_tokens < P:
        return
    cost = CostModel.for_link(link)
    start = plan_layout(layout, GroupSpec.offline(P, 1, P), name, cost=cost).placement
    cap = token_cap(layout.total_tokens, P, 0.10)
    t0 = float(part_times(layout, start, None, cost).max())
    t, pl = refine_exposure(layout, start, cost, cap)
    assert t <= t0 and t == float(part_times(layout, pl, None, cost).max())
    assert_covers_once(layout, pl)
    assert pl.tokens_per_part().max() <= max(cap, start.tokens_per_part().max())  # slides stay within the cap
    assert pl.tokens_per_part().min() >= 1
    assert pairs_of(pl) == pairs_of(start)  # boundaries move; no part gains or loses a document
    again = refine_exposure(layout, start, cost, cap)[1]  # every rank must find the same plan
    assert np.array_equal(again.start, pl.start) and np.array_equal(again.part, pl.part)


def test_offsets_steer_the_refinement():
    """``refine_moves``' per-part offsets count in a part's load: one document split over two parts at nearly
    equal work (250,278 and 250,222 pairs) is left alone without them, and moved off the part with the larger
    offset with it."""
    L = 1000
    # rows [0, 707) and [707, 1000) of one document hold nearly equal pairs (707^2 / 2 against the rest)
    args = lambda: ([0], [0, 0], [0, 707], [707, L], [0, 1])  # noqa: E731
    tri = lambda n: n * (n + 1) // 2  # noqa: E731
    wrk = [float(tri(707)), float(tri(L) - tri(707))]
    tok = [707.0, 293.0]
    doc_first, doc, start, end, part = args()
    moves, _ = refine_moves(doc_first, doc, start, end, part, list(wrk), 8, list(tok), 0.0, math.inf)
    assert moves == 0 and end[0] == 707
    doc_first, doc, start, end, part = args()
    extra = [0.0, 0.2 * wrk[1]]  # part 1 waits for its KV: it should hold fewer late rows
    moves, _ = refine_moves(doc_first, doc, start, end, part, list(wrk), 8, list(tok), 0.0, math.inf, extra=extra)
    assert moves > 0 and end[0] > 707 and start[1] == end[0]


def sweep_row(dist: str, seed: int, P: int, U: int, link: str) -> tuple[Layout, GroupSpec, CostModel]:
    """A layout and group of the sweep (``benchmarks/sweep.py``) and the cost the planner prices it with."""
    from benchmarks.sweep import sweep_lengths

    layout = make_layout(cu_of(sweep_lengths(dist, min(65536, 2048 * P), seed).tolist()))
    group = GroupSpec.offline(P, U, P if link == "nvlink" else U)
    return layout, group, CostModel.for_link(group.link).for_ulysses(U)


def test_auto_keeps_the_step_when_both_models_agree():
    """A network-priced sweep row (P = 48 > POLISH_MAX_PARTS: nothing is searched after it): evening out the
    exposed transfers makes the slowest part 0.6 % faster by the one-layer model and no slower with the rounds
    simulated; auto's plan is that placement."""
    layout, group, cost = sweep_row("pareto-1.5", 1, 48, 1, "network")
    winner, tr, t_winner = _best_candidate(layout, 48, 0.10, cost, 1, {None: 1})
    t, evened = refine_exposure(layout, winner, cost, token_cap(layout.total_tokens, 48, 0.10))
    assert t < (1 - EXPOSURE_MIN_GAIN) * t_winner
    assert simulated_time(layout, evened, window_transfers(evened, layout, None), cost) <= \
        simulated_time(layout, winner, tr[None], cost)
    plan = plan_layout(layout, group, "auto")
    assert plan.placement_name == f"{winner.name}+polish"
    assert float(part_times(layout, plan.placement, plan.transfers, cost).max()) == t
    assert np.array_equal(plan.placement.start, evened.start) and np.array_equal(plan.placement.part, evened.part)
    assert_covers_once(layout, plan.placement)


def test_auto_drops_the_step_when_the_simulation_disagrees():
    """An NVLink sweep row where the one-layer model prices the evened placement 0.7 % faster but the rounds
    simulated forward and backward over consecutive layers price it 0.9 % slower (the one-layer model waits for all
    of a part's KV at once): the step keeps the winner as it was."""
    layout, group, cost = sweep_row("lognormal-2.2", 1, 64, 1, "nvlink")
    winner, tr, t_winner = _best_candidate(layout, 64, 0.10, cost, 1, {None: 1})
    t, evened = refine_exposure(layout, winner, cost, token_cap(layout.total_tokens, 64, 0.10))
    assert t < (1 - EXPOSURE_MIN_GAIN) * t_winner
    assert simulated_time(layout, evened, window_transfers(evened, layout, None), cost) > \
        simulated_time(layout, winner, tr[None], cost)
    plain = polished(layout, 64, cost, 0.10, 1, {None: 1}, winner, tr, t_winner)
    kept = exposure_evened(layout, 64, cost, 0.10, 1, {None: 1}, winner, t_winner, plain, None, "auto")
    assert kept is plain and kept[0] is winner and kept[2] == t_winner


def test_the_distributed_exactness_row_is_evened_out():
    """``tests/distributed/test_sap_attention.py::test_polished_auto_placement_is_exact`` runs the row below to
    check that a placement moved by this step stays exact: there auto's plan is the evened-then-searched
    placement, 3 % faster than the winner searched alone, and the simulation agrees."""
    layout = make_layout(cu_of([276, 535, 272]))
    cost = CostModel.for_link("network")
    winner, tr, t_winner = _best_candidate(layout, 4, 0.10, cost, 1, {None: 1})
    plain = polished(layout, 4, cost, 0.10, 1, {None: 1}, winner, tr, t_winner)
    evened, evened_tr, t = exposure_evened(layout, 4, cost, 0.10, 1, {None: 1}, winner, t_winner, plain, None, "auto")
    assert evened is not plain[0] and t < 0.97 * plain[2]
    assert simulated_time(layout, evened, evened_tr[None], cost) <= \
        simulated_time(layout, plain[0], plain[1][None], cost)
    plan = plan_layout(layout, GroupSpec.offline(4, 1, 1), "auto", cost=cost)
    assert plan.placement_name == "contiguous+polish"
    assert np.array_equal(plan.placement.start, evened.start) and np.array_equal(plan.placement.part, evened.part)


@settings(max_examples=ci_examples(30), deadline=None)
@given(lengths=st.lists(st.one_of(st.integers(1, 200), st.integers(300, 3000)), min_size=1, max_size=20),
       P=st.integers(2, 12), link=st.sampled_from(["nvlink", "network"]))
def test_auto_is_never_slower_than_its_winner_searched_alone(lengths, P, link):
    """Whatever the step does, auto's plan is no slower than the winner searched alone (the path without it) by
    the one-layer model, nor with the plan's rounds simulated."""
    layout = make_layout(cu_of(lengths))
    if layout.total_tokens < P:
        return
    cost = CostModel.for_link(link)
    winner, tr, t_winner = _best_candidate(layout, P, 0.10, cost, 1, {None: 1})
    plain = polished(layout, P, cost, 0.10, 1, {None: 1}, winner, tr, t_winner)
    plan = plan_layout(layout, GroupSpec.offline(P, 1, P if link == "nvlink" else 1), "auto", cost=cost)
    t = float(part_times(layout, plan.placement, plan.transfers, cost).max())
    assert t <= plain[2] * (1 + 1e-12)
    assert simulated_time(layout, plan.placement, plan.transfers, cost) <= \
        simulated_time(layout, plain[0], plain[1][None], cost) * (1 + 1e-12)


def test_auto_simulates_each_plan_once(monkeypatch):
    # auto's steps weigh the plan so far against the evened winner, the searches from other starts and the priced
    # cuts: on this row the plan so far meets two of them, and its simulation is reused (the memo), not rerun
    import hf_hsap.plan.exposure as exposure_mod

    simulated = []
    real = exposure_mod.simulated

    def counting(layout, pl, tr, *args):
        simulated.append(pl)
        return real(layout, pl, tr, *args)

    monkeypatch.setattr(exposure_mod, "simulated", counting)
    layout = make_layout(cu_of([1780, 3812, 1737, 127, 736]))
    plan = plan_layout(layout, GroupSpec.offline(4, 1, 1), "auto")
    assert len(simulated) >= 3  # three steps asked
    assert len({id(pl) for pl in simulated}) == len(simulated)
    # the memo changes no decision: the same plan as each step simulating afresh
    monkeypatch.setattr(exposure_mod, "_simulated", lambda layout, plan, cost, budget, rounds, sims:
                        real(layout, plan[0], plan[1], cost, budget, rounds)[0])
    again = plan_layout(layout, GroupSpec.offline(4, 1, 1), "auto")
    for f in ("doc", "start", "end", "part"):
        assert np.array_equal(getattr(plan.placement, f), getattr(again.placement, f))


def test_the_final_plan_reads_the_round_orders_its_check_simulated(monkeypatch):
    """The priced cuts win this row after a simulated check: the plan's rounds are read from that simulation (the
    same round orders, not simulated again), and they are the ones planning the kind afresh gives."""
    from benchmarks.sweep import sweep_lengths
    import hf_hsap.plan.kinds as kinds
    from hf_hsap.plan.simulation import round_order_times

    layout = make_layout(cu_of(sweep_lengths("lognormal-2.2", 65536, 0).tolist()))
    group = GroupSpec.offline(32, 1, 1)
    again = []
    monkeypatch.setattr(kinds, "round_order_times", lambda *a: again.append(a) or round_order_times(*a))
    plan = plan_layout(layout, group, "auto")
    assert plan.placement.name.startswith("contiguous-priced") and again == []
    fresh = kinds.plan_kind(layout, plan.placement, None, plan.cost, None, "auto", plan.transfers)
    assert len(again) == 1 and fresh.round_order == plan.round_order
    for f in ("round", "src", "dst", "start", "end", "src_local"):
        assert np.array_equal(getattr(fresh.pieces, f), getattr(plan.pieces, f))


@settings(max_examples=ci_examples(40))
@given(lengths=st.lists(st.one_of(st.integers(1, 200), st.integers(500, 4000)), min_size=1, max_size=30),
       P=st.integers(2, 12), name=st.sampled_from(["contiguous", "zigzag", "balanced", "density", "auto"]),
       link=st.sampled_from(["nvlink", "network"]), kv_scale=st.sampled_from([1.0, 30.0]),
       round_cost=st.sampled_from([0.0, 5e4]), budget=st.sampled_from([None, 600]),
       rounds=st.sampled_from(["auto", "batched", "by_peer"]))
def test_the_simulated_floor_is_below_the_simulation(lengths, P, name, link, kv_scale, round_cost, budget, rounds):
    """simulated_floor bounds the simulated time from below at every budget, round order and price: what lets a
    check skip a simulation (test_a_check_skips_a_simulation_that_cannot_change_its_answer)."""
    from hf_hsap.plan.simulation import simulated_floor

    layout = make_layout(cu_of(lengths))
    if layout.total_tokens < P:
        return
    base = CostModel.for_link(link)
    cost = CostModel(token_cost=base.token_cost, kv_token_cost=base.kv_token_cost * kv_scale, round_cost=round_cost)
    pl = plan_layout(layout, GroupSpec.offline(P), name, cost=cost).placement
    tr = window_transfers(pl, layout, None)
    floor = simulated_floor(layout, pl, cost)
    t = simulated_time(layout, pl, tr, cost, budget, rounds)
    assert floor <= t * (1 + 1e-12), (floor, t)
    # never below the compute alone (the pairs, projections and MLP every part runs whatever it waits for)
    pairs = pl.work_per_part(layout).astype(float)
    assert floor >= float((cost.token_cost * pl.tokens_per_part() + pairs).max()) * (1 - 1e-12)


def test_a_check_skips_a_simulation_that_cannot_change_its_answer(monkeypatch):
    """The planning benchmark's row (P = 64, network): the priced cuts' simulated time is below the floor of the
    plan they replace, so that plan is not simulated; skipping changes no plan (the same as simulating both)."""
    import torch

    import hf_hsap
    import hf_hsap.plan.exposure as exposure_mod
    from benchmarks.planning import planning_lengths

    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(planning_lengths(524288, 2000, 0))]))
    simulated = []
    real = exposure_mod.simulated
    monkeypatch.setattr(exposure_mod, "simulated", lambda layout, pl, *a: simulated.append(pl.name) or
                        real(layout, pl, *a))
    plan = hf_hsap.plan_sequence(cu, 64, "auto")
    assert plan.placement_name == "contiguous-priced" and simulated == ["contiguous-priced"]
    simulated.clear()
    monkeypatch.setattr(exposure_mod, "simulated_floor", lambda *a: -math.inf)  # never skip
    again = hf_hsap.plan_sequence(cu, 64, "auto")
    assert len(simulated) == 2 and again.round_order == plan.round_order
    for f in ("doc", "start", "end", "part"):
        assert np.array_equal(getattr(plan.placement, f), getattr(again.placement, f))
