"""``placement="auto"`` as one search (:mod:`hf_hsap.plan.auto`; its state, price and rule: :mod:`hf_hsap.plan.search`):
one price, one acceptance rule, refinements that never make a plan slower by either cost model."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import ci_examples, cu_of
from hf_hsap.plan import search
from hf_hsap.plan.candidates import cheapest_candidate
from hf_hsap.plan.cost import CostModel, part_times, step_time
from hf_hsap.plan.group import GroupSpec
from hf_hsap.plan.layout import make_layout
from hf_hsap.plan.placement import contiguous
from hf_hsap.plan.planner import plan_layout
from hf_hsap.plan.search import Option, Search
from hf_hsap.plan.simulation import simulated_time

LENGTHS = st.lists(st.one_of(st.integers(1, 300), st.integers(1000, 9000)), min_size=2, max_size=40)


@settings(max_examples=ci_examples(25), deadline=None)
@given(lengths=LENGTHS, P=st.integers(2, 20), link=st.sampled_from(["nvlink", "network"]))
def test_the_search_never_ends_slower_than_its_start_by_either_model(lengths, P, link):
    """auto's plan is no slower than the cheapest candidate, by the one-layer model and with its rounds
    simulated, and its reported name and figures are those of a plan the rule accepted."""
    layout = make_layout(cu_of(lengths))
    if layout.total_tokens < P:
        return
    group = GroupSpec.offline(P, 1, P if link == "nvlink" else 1)
    cost = CostModel.for_link(group.link)
    plan = plan_layout(layout, group, "auto")
    start = cheapest_candidate(Search(layout, P, cost, 0.10))
    t = float(part_times(layout, plan.placement, None, cost).max())
    assert t <= start.time * (1 + 1e-12)
    assert simulated_time(layout, plan.placement, plan.transfers, cost) <= \
        simulated_time(layout, start.placement, start.transfers[None], cost) * (1 + 1e-12)
    if plan.placement.name != start.placement.name:  # replaced: faster by more than the margin
        assert t < start.time * (1 - search.MARGIN)


def _row(P=8, link="network"):
    from hf_hsap.data.lengths import sweep_lengths

    layout = make_layout(cu_of(sweep_lengths("lognormal-1.6", 2048 * P, 0).tolist()))
    return Search(layout, P, CostModel.for_link(link), 0.10)


def test_the_rule_needs_the_margin_and_the_simulation(monkeypatch):
    """A proposal replaces the plan only when faster by more than MARGIN by the one-layer model and no slower with
    the rounds simulated; on windowed plans the simulation is not asked."""
    s = _row()
    current = cheapest_candidate(s)
    same = Option(current.placement, current.transfers, current.time * (1 - search.MARGIN / 2))
    assert not s.accepts(current, same)  # within the margin
    cut = s.price(contiguous(s.layout, s.n_parts))
    faster = Option(cut.placement, cut.transfers, current.time * (1 - 2 * search.MARGIN))
    sims = {current.placement.name: 1.0, cut.placement.name: 2.0}
    monkeypatch.setattr(search, "simulated", lambda layout, pl, *a: (sims[pl.name], {}))
    assert not s.accepts(current, faster)  # slower simulated
    s.sims.clear()
    sims[cut.placement.name] = 0.5
    assert s.accepts(current, faster)
    windowed = dataclasses.replace(s, layers={None: 1, 64: 1}, sims={})
    sims[cut.placement.name] = 2.0
    assert windowed.accepts(current, faster)


def test_each_plan_is_simulated_once(monkeypatch):
    """The memo: a plan weighed twice is simulated once."""
    s = _row()
    current = cheapest_candidate(s)
    other = s.price(contiguous(s.layout, s.n_parts))
    runs = []
    real = search.simulated
    monkeypatch.setattr(search, "simulated", lambda layout, pl, *a: (runs.append(pl.name), real(layout, pl, *a))[1])
    fast = Option(other.placement, other.transfers, 0.0)
    s.accepts(current, fast)
    s.accepts(current, fast)
    assert sorted(runs) == sorted([current.placement.name, other.placement.name])


def test_the_plan_reuses_the_round_orders_the_search_simulated(monkeypatch):
    """plan_layout chooses the final plan's round order from the search's simulation when it ran one (no second
    simulation of the same plan), and from its own otherwise: the same choice either way."""
    s = _row()
    group = GroupSpec.offline(8, 1, 1)
    plan = plan_layout(s.layout, group, "auto")
    monkeypatch.setattr(Search, "orders", lambda self, pl, tr: None)
    again = plan_layout(s.layout, group, "auto")
    assert plan.round_order == again.round_order and plan.placement_name == again.placement_name


def test_a_hybrid_plan_is_priced_with_its_summary_exchange():
    """With recurrent layers priced (mixer_token_cost, handoff_cost) every option's time includes the summarising
    calls and the summary exchange (cost.step_time), so auto's plan is never slower than contiguous cuts by that
    price."""
    s = _row(P=4, link="nvlink")
    cost = dataclasses.replace(s.cost, mixer_token_cost=5e4, handoff_cost=1e8)
    plan = plan_layout(s.layout, GroupSpec.offline(4, 1, 4), "auto", cost=cost)
    cut = contiguous(s.layout, 4)
    layers = {None: 1}
    t_plan = step_time(s.layout, plan.placement, {None: plan.transfers}, layers, cost)
    assert t_plan <= step_time(s.layout, cut, {None: None}, layers, cost) * (1 + 1e-12)
    plain = plan_layout(s.layout, GroupSpec.offline(4, 1, 4), "auto", cost=s.cost)
    assert not np.array_equal(plan.placement.part, plain.placement.part) or plan.placement_name == "contiguous"


def test_unknown_placement_is_refused():
    with pytest.raises(ValueError, match="unknown placement"):
        plan_layout(make_layout([0, 10, 20]), GroupSpec.offline(2, 1, 2), "best")
