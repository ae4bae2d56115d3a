"""The transfer-counting lower bound (``benchmarks.analytic.bound``): no placement within the token cap is faster than
it by the cost model, it is at least the compute bound, it only falls as the cap grows, and on a sweep row where
one document holds most of the pairs it proves the network goal out of every placement's reach."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import built_placements, ci_examples, cu_of
from benchmarks.analytic.bound import BOUND_TOLERANCE, transfer_bound
from benchmarks.analytic.relaxation import relaxed_bound
from hf_hsap.plan.cost import CostModel, balance_bound, part_times
from hf_hsap.plan.cutting import priced_cuts
from hf_hsap.plan.group import GroupSpec
from hf_hsap.plan.layout import make_layout
from benchmarks.analytic.placement_search import optimise_placement
from hf_hsap.plan.placement import token_cap
from hf_hsap.plan.planner import _place, plan_layout
from hf_hsap.plan.search import Search

LENGTHS = st.one_of(
    st.lists(st.one_of(st.integers(1, 200), st.integers(1000, 6000)), min_size=1, max_size=30),
    st.tuples(st.integers(3000, 12000), st.lists(st.integers(1, 300), max_size=30)).map(lambda x: [x[0]] + x[1]))
COSTS = st.sampled_from([CostModel.for_link("network"), CostModel.for_link("nvlink"),
                         CostModel.for_link("network").for_ulysses(2), CostModel(overlap=0.5),
                         CostModel(token_cost=0.0, kv_token_cost=102.0, diag_block=512)])
SLACK = 0.10


BOUNDS = {"transfer": transfer_bound,  # and benchmarks.analytic.relaxation's, at least it (coarse blocks: fast)
          "relaxed": lambda layout, P, cost, cap: relaxed_bound(layout, P, cost, cap, blocks=8)}


@pytest.mark.parametrize("bound_of", BOUNDS.values(), ids=BOUNDS.keys())
@settings(max_examples=ci_examples(30), deadline=None)
@given(lengths=LENGTHS, P=st.integers(2, 24), cost=COSTS)
def test_no_placement_within_the_cap_beats_the_bound(bound_of, lengths, P, cost):
    """Every placement the planner builds (each within the token cap: the named ones, auto's plan, the priced and
    the sliced cuts) is at least the bound; the bound is at least the transfer bound, which is at least LB."""
    layout = make_layout(cu_of(lengths))
    T = layout.total_tokens
    if T < P:
        return
    cap = token_cap(T, P, SLACK)
    bound = bound_of(layout, P, cost, cap)
    assert bound >= transfer_bound(layout, P, cost, cap) >= balance_bound(layout, P, cost)
    for pl in built_placements(layout, P, cost, SLACK):
        assert pl.tokens_per_part().max() <= cap
        assert float(part_times(layout, pl, None, cost).max()) >= bound * (1 - 1e-12), pl.name


@pytest.mark.parametrize("bound_of", BOUNDS.values(), ids=BOUNDS.keys())
@settings(max_examples=ci_examples(8), deadline=None)
@given(lengths=LENGTHS, P=st.integers(2, 6))
def test_the_offline_optimiser_does_not_beat_the_bound(bound_of, lengths, P):
    """The oracle's local search (which moves rows freely within the cap) stays at or above the bound."""
    layout = make_layout(cu_of(lengths))
    if layout.total_tokens < P:
        return
    cost = CostModel.for_link("network")
    start = _place(Search(layout, P, cost, SLACK), "auto")[0]
    best = optimise_placement(layout, P, cost, start, max_moves=40)
    cap = token_cap(layout.total_tokens, P, SLACK)
    if best.tokens_per_part().max() <= cap:
        assert float(part_times(layout, best, None, cost).max()) >= bound_of(layout, P, cost, cap) * (1 - 1e-12)


@settings(max_examples=ci_examples(40), deadline=None)
@given(lengths=LENGTHS, P=st.integers(2, 24), cost=COSTS, slacks=st.tuples(st.sampled_from([0.0, 0.01, 0.1]),
                                                                           st.sampled_from([0.03, 0.1, 0.5])))
def test_a_larger_cap_never_raises_the_bound(lengths, P, cost, slacks):
    layout = make_layout(cu_of(lengths))
    T = layout.total_tokens
    if T < P:
        return
    small, large = (token_cap(T, P, s) for s in sorted(slacks))
    assert transfer_bound(layout, P, cost, large) <= transfer_bound(layout, P, cost, small) * (1 + 2 * BOUND_TOLERANCE)


def test_a_dominant_document_puts_the_network_goal_out_of_reach():
    """A sweep row (Pareto tail, one document of 35,035 of 65,536 tokens, 48 parts, one GPU per node): every part
    holding a row deep in that document receives most of it, so no placement within the cap comes within 1.10 of
    LB; auto's plan is within 1.5x of the bound. Over NVLink the same row's bound is within 1.05 of LB (the
    document's late rows are dense in pairs, its transfers cheap) and auto is within 1.15 of it."""
    from benchmarks.analytic.sweep import sweep_lengths

    P, T = 48, 65536
    lengths = sweep_lengths("pareto-1.5", T, 1)
    assert int(lengths.max()) == 35035
    layout = make_layout(cu_of(lengths.tolist()))
    cap = token_cap(T, P, SLACK)
    for link, low, high in (("network", 1.40, 1.50), ("nvlink", 1.0, 1.05)):
        cost = CostModel.for_link(link)
        lb = balance_bound(layout, P, cost)
        bound = transfer_bound(layout, P, cost, cap)
        assert low * lb <= bound <= high * lb
        plan = plan_layout(layout, GroupSpec.offline(P, 1, P if link == "nvlink" else 1), "auto")
        est = float(part_times(layout, plan.placement, plan.transfers, cost).max())
        assert bound <= est <= (1.5 if link == "network" else 1.15) * bound


def test_short_documents_leave_the_compute_bound():
    """No document longer than the cap: nothing is forced over the network, the bound is LB."""
    layout = make_layout(cu_of([100] * 64))
    cost = CostModel.for_link("network")
    assert transfer_bound(layout, 8, cost, token_cap(6400, 8, SLACK)) == balance_bound(layout, 8, cost)
    np.testing.assert_equal(transfer_bound(layout, 8, cost, 800), balance_bound(layout, 8, cost))


def test_the_bound_holds_on_dense_sweep_rows():
    """Sweep rows where one document's late rows are dense in pairs (the layouts that decide the bound's token and
    part counts) over both links: auto's plan, balanced's and the priced cuts are never below the bound."""
    from benchmarks.analytic.sweep import sweep_lengths

    for dist, seed in (("pareto-1.5", 1), ("pareto-1.1", 0), ("one-dominant", 0), ("two-dominant", 1)):
        for P in (24, 64):
            T = min(65536, 2048 * P)
            layout = make_layout(cu_of(sweep_lengths(dist, T, seed).tolist()))
            cap = token_cap(T, P, SLACK)
            for link in ("network", "nvlink"):
                cost = CostModel.for_link(link)
                bound = transfer_bound(layout, P, cost, cap)
                plan = plan_layout(layout, GroupSpec.offline(P, 1, P if link == "nvlink" else 1), "auto")
                others = [plan.placement, _place(Search(layout, P, cost, SLACK), "balanced")[0]]
                cut = priced_cuts(layout, P, cost, cap, 1e30)
                for pl in others + ([cut] if cut is not None else []):
                    assert float(part_times(layout, pl, None, cost).max()) >= bound, (dist, P, link, pl.name)
