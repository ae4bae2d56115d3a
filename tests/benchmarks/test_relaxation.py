"""The linear-programming lower bound (``benchmarks.analytic.relaxation``): no placement within the token cap is faster
by the cost model (every placement of small rows enumerated here; every placement the planner builds and the
oracle's on random rows in tests/benchmarks/test_bound.py, beside the transfer bound), and on a sweep row where one
document holds most of the pairs it proves more of the network goal out of reach than the transfer bound does."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from helpers import cu_of
from benchmarks.analytic.bound import transfer_bound
from hf_hsap.plan.cost import CostModel, balance_bound, part_times
from hf_hsap.plan.group import GroupSpec
from hf_hsap.plan.layout import make_layout
from hf_hsap.plan.placement import _finish, token_cap
from hf_hsap.plan.planner import plan_layout
from benchmarks.analytic.relaxation import RELAXED_TOLERANCE, relaxed_bound

SLACK = 0.10


def _exhaustive_times(lengths: list[int], P: int, cost: CostModel, cap: int) -> np.ndarray:
    """The slowest part's time of every assignment of the row's tokens to ``P`` parts within ``cap`` tokens
    each, computed from the cost model's definition (not from ``part_times``): a part's tokens, its pairs (a row
    at offset ``x`` attends ``x + 1`` keys), its local pairs (keys it holds itself) and the keys it receives
    (every key of a document up to its last row there that it does not hold).

    Shapes:
        ``owner`` ``[assignments, T]``; per-part figures ``[assignments]``; the result ``[feasible assignments]``.
    """
    T = sum(lengths)
    owner = np.array(list(itertools.product(range(P), repeat=T)), dtype=np.int8)  # [A, T]
    offset = np.concatenate([np.arange(L) for L in lengths])  # [T] offset of every token in its document
    doc = np.repeat(np.arange(len(lengths)), lengths)  # [T]
    times = []
    for p in range(P):
        mine = owner == p  # [A, T]
        tokens = mine.sum(1)
        work = (mine * (offset + 1)).sum(1)
        local = np.zeros(owner.shape[0])
        recv = np.zeros(owner.shape[0])
        for d, L in enumerate(lengths):
            m = mine[:, doc == d]  # [A, L]
            held_before = np.cumsum(m, axis=1)  # own keys at offsets <= x
            local += (m * held_before).sum(1)
            top = np.where(m.any(1), L - np.argmax(m[:, ::-1], axis=1), 0)  # one past its last row
            recv += top - m.sum(1)
        times.append(cost.time_of(tokens.astype(np.float64), work.astype(np.float64), local, recv))
        if p == 0:
            fits = tokens <= cap
        else:
            fits &= tokens <= cap
    return np.max(times, axis=0)[fits]


TIGHTER = {((9, 2, 1), 1.0), ((10, 1, 1), 10.0), ((9, 1, 1, 1), 1.0)}  # where the LP beats the transfer bound


@pytest.mark.parametrize("lengths", [(9, 2, 1), (10, 1, 1), (9, 1, 1, 1), (7, 4, 1), (6, 6)])
@pytest.mark.parametrize("token_cost,kv_token_cost", [(1.0, 6.0), (10.0, 5.0), (0.5, 3.0)])
def test_no_placement_of_a_small_row_beats_the_bound(lengths, token_cost, kv_token_cost):
    """Every assignment of every token to 3 parts (3^12), priced from the cost model's definition: the fastest
    one within the cap (4 tokens) is at least the bound; on some rows the bound is well above the transfer
    bound (so the linear program, not the transfer bound, is what the assertion checks there)."""
    P = 3
    layout = make_layout(cu_of(list(lengths)))
    cost = CostModel(token_cost=token_cost, kv_token_cost=kv_token_cost)
    cap = int(token_cap(layout.total_tokens, P, 0.0))
    best = float(_exhaustive_times(list(lengths), P, cost, cap).min())
    bound = relaxed_bound(layout, P, cost, cap, blocks=4)
    assert bound <= best * (1 + 1e-12)
    if (lengths, token_cost) in TIGHTER:
        assert bound > 1.05 * transfer_bound(layout, P, cost, cap)


def test_the_enumeration_prices_as_the_planner_does():
    """The enumeration's figures equal ``part_times`` on placements it can express (a check of the test itself)."""
    lengths, P = [5, 3], 2
    layout = make_layout(cu_of(lengths))
    cost = CostModel(token_cost=6.0, kv_token_cost=2.0)
    owner = np.array([0, 1, 0, 1, 1, 0, 0, 1])
    segs = [(d, s, s + 1, int(owner[s])) for d, (a, b) in enumerate([(0, 5), (5, 8)]) for s in range(a, b)]
    doc, start, end, part = (np.array(x, dtype=np.int64) for x in zip(*sorted(segs, key=lambda t: (t[3], t[1]))))
    pl = _finish("hand", P, doc, start, end, part)
    times = _exhaustive_times(lengths, P, cost, cap=8)
    index = int("".join(map(str, owner)), P)  # itertools.product's order
    assert float(part_times(layout, pl, None, cost).max()) == pytest.approx(float(times[index]))


def test_a_dominant_document_needs_more_than_its_transfers():
    """The sweep's worst network row (one document of 18,549 of 49,152 tokens, 24 parts, one GPU per node): its
    holders deep in the document run out of time before they run out of tokens, so the other documents fill the
    rest to the cap. The relaxation proves 1.22 x LB, where the transfer bound proves 1.08; auto's plan is above
    both, and a hint (a reachable time) gives the same bound as the doubling."""
    from benchmarks.analytic.sweep import sweep_lengths

    P, T = 24, 49152
    lengths = sweep_lengths("one-dominant", T, 0)
    assert int(lengths.max()) == 18549
    layout = make_layout(cu_of(lengths.tolist()))
    cap = token_cap(T, P, SLACK)
    cost = CostModel.for_link("network")
    lb = balance_bound(layout, P, cost)
    plan = plan_layout(layout, GroupSpec.offline(P, 1, 1), "auto")
    est = float(part_times(layout, plan.placement, plan.transfers, cost).max())
    bound = relaxed_bound(layout, P, cost, cap)
    assert transfer_bound(layout, P, cost, cap) < 1.09 * lb < 1.22 * lb < bound <= est
    hinted = relaxed_bound(layout, P, cost, cap, hint=est)
    assert abs(hinted - bound) <= 2 * RELAXED_TOLERANCE * bound


def test_a_solver_that_cannot_tell_never_raises_the_bound(monkeypatch):
    """Where HiGHS ends without a verdict (status 4, as its simplex does on about 7 % of the sweep's programs; then
    the interior-point method is asked), the program counts as feasible: the bound stays the transfer bound. Were
    doubt counted as infeasible, the search would double the target without end (stopped here after 50 solves)."""
    import types

    import scipy.optimize

    from benchmarks.analytic.sweep import sweep_lengths

    calls = []

    def undecided(*args, **kwargs):
        calls.append(kwargs["method"])
        assert len(calls) <= 50, "the search does not end: doubt is taken for infeasible"
        return types.SimpleNamespace(status=4)

    monkeypatch.setattr(scipy.optimize, "linprog", undecided)
    P, T = 24, 49152
    layout = make_layout(cu_of(sweep_lengths("one-dominant", T, 0).tolist()))
    cost = CostModel.for_link("network")
    cap = token_cap(T, P, SLACK)
    assert relaxed_bound(layout, P, cost, cap) == transfer_bound(layout, P, cost, cap)
    assert calls[:2] == ["highs", "highs-ipm"]
