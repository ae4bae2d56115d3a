"""The sliced cuts (``hf_hsap.plan.slicing``): every part a range of the long documents and a range of the rest.
They hold every token once within the cap and ``min_tokens``, beat the time they were asked to beat, and auto's
step takes them only where both cost models price them faster (never slower than the plan without the step)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import assert_covers_once, ci_examples, cu_of, plans_with_and_without
from hf_hsap.plan import auto
from hf_hsap.plan.cost import CostModel, balance_bound, part_times
from hf_hsap.plan.group import GroupSpec
from hf_hsap.plan.layout import make_layout
from hf_hsap.plan.placement import token_cap
from hf_hsap.plan.simulation import simulated_time
from hf_hsap.plan.auto import SLICED_MIN_EXCESS
from hf_hsap.plan.slicing import sliced_cuts
from hf_hsap.plan.windows import window_transfers

LENGTHS = st.lists(st.one_of(st.integers(1, 300), st.integers(1000, 9000)), min_size=1, max_size=25)
COSTS = st.sampled_from([CostModel.for_link("network"), CostModel.for_link("nvlink"), CostModel(diag_block=64.0),
                         CostModel(overlap=0.5), CostModel.for_link("network").for_ulysses(4)])


def _line_ranges(layout, pl, p, cap):
    """Part ``p``'s pieces on each line (the documents longer than ``cap``, longest first; then the others in row
    order), as sorted ``(starts, ends)`` in line positions (written out here from the module docstring)."""
    lengths = layout.doc_lengths
    out = []
    for docs in (np.flatnonzero(lengths > cap)[np.argsort(-lengths[lengths > cap], kind="stable")],
                 np.flatnonzero(lengths <= cap)):
        line_start = np.full(lengths.shape[0], -1)
        line_start[docs] = np.concatenate([[0], np.cumsum(lengths[docs])[:-1]]) if docs.shape[0] else []
        mine = (pl.part == p) & (line_start[pl.doc] >= 0)
        shift = line_start[pl.doc[mine]] - layout.cu_seqlens[pl.doc[mine]]
        a, b = pl.start[mine] + shift, pl.end[mine] + shift
        order = np.argsort(a)
        out.append((a[order], b[order]))
    return out


@settings(max_examples=ci_examples(60), deadline=None)
@given(lengths=LENGTHS, P=st.integers(2, 24), cost=COSTS, slack=st.sampled_from([0.01, 0.1]),
       min_tokens=st.sampled_from([1, 16]))
def test_every_token_once_within_the_cap_and_below_the_time_to_beat(lengths, P, cost, slack, min_tokens):
    """Cut at no limit, then asked to beat the first cuts by 1 %: both hold every token once, no part above the cap
    or below ``min_tokens``, each part at most one range of each line; the second is below its limit or None."""
    layout = make_layout(cu_of(lengths))
    T = layout.total_tokens
    cap = token_cap(T, P, slack)
    cut = sliced_cuts(layout, P, cost, cap, float("inf"), min_tokens)
    if min_tokens * P > T or not (layout.doc_lengths > int(cap)).any():
        assert cut is None
        return
    assert cut is not None and cut.name == "sliced"
    t = float(part_times(layout, cut, None, cost).max())
    faster = sliced_cuts(layout, P, cost, cap, 0.99 * t, min_tokens)
    for pl in [cut] + ([faster] if faster is not None else []):
        assert_covers_once(layout, pl)
        tokens = pl.tokens_per_part()
        assert tokens.max() <= cap and tokens.min() >= min_tokens
        for p in range(P):  # one range per line: the part's pieces of each line are consecutive on it
            for a, b in _line_ranges(layout, pl, p, int(cap)):
                assert (a[1:] == b[:-1]).all()
    if faster is not None:
        assert float(part_times(layout, faster, None, cost).max()) < 0.99 * t


def test_the_fill_never_goes_below_the_compute_bound():
    """Below LB no fill reaches the end, so no cuts beat it."""
    layout = make_layout(cu_of([9000, 300, 200, 1000, 50] * 3))
    cost = CostModel.for_link("network")
    lb = balance_bound(layout, 8, cost)
    assert sliced_cuts(layout, 8, cost, token_cap(layout.total_tokens, 8, 0.1), lb) is None
    assert sliced_cuts(layout, 8, cost, token_cap(layout.total_tokens, 8, 0.1), 3 * lb) is not None


def test_refused_where_the_simulation_disagrees(monkeypatch):
    """Two dominant documents, 24 parts over the network: the slices are 11 % faster by the one-layer model but
    4 % slower with the rounds simulated; auto keeps its plan."""
    from hf_hsap.data.lengths import sweep_lengths

    P, T = 24, 49152
    layout = make_layout(cu_of(sweep_lengths("two-dominant", T, 0).tolist()))
    cost = CostModel.for_link("network")
    cut = sliced_cuts(layout, P, cost, token_cap(T, P, 0.1), float("inf"))
    plan, without = plans_with_and_without(layout, GroupSpec.offline(P, 1, 1), monkeypatch, "_sliced_cuts")
    assert float(part_times(layout, cut, None, cost).max()) < 0.9 * float(part_times(layout, plan.placement, None,
                                                                                       cost).max())
    assert simulated_time(layout, cut, window_transfers(cut, layout, None), cost) > \
        1.03 * simulated_time(layout, plan.placement, plan.transfers, cost)
    assert plan.placement_name == without.placement_name != "sliced"
    assert np.array_equal(plan.placement.start, without.placement.start)


def test_not_tried_near_the_compute_bound(monkeypatch):
    """The planning row (2,000 documents, P = 64: one document is longer than the cap, auto's plan is within
    SLICED_MIN_EXCESS of LB): the slices are never cut."""
    import hf_hsap
    from hf_hsap.data.lengths import planning_lengths

    monkeypatch.setattr(auto, "sliced_cuts", lambda *a: pytest.fail("cut near the compute bound"))
    cu = cu_of(planning_lengths(524288, 2000, 0).tolist())
    layout = make_layout(cu)
    assert (layout.doc_lengths > token_cap(524288, 64, 0.1)).any()
    plan = hf_hsap.plan_sequence(cu, 64, "auto")
    cost = CostModel.for_link("network")
    assert float(part_times(layout, plan.placement, None, cost).max()) < \
        (1 + SLICED_MIN_EXCESS) * balance_bound(layout, 64, cost)
