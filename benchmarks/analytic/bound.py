"""A lower bound of the one-layer step time that counts the transfers no placement can avoid.

:func:`hf_hsap.plan.cost.balance_bound` (the sweep's ``LB``) assumes every part equally loaded and nothing received. On
rows where one or a few long documents hold most of the pairs and KV is dear (one GPU per node), no placement
comes near it: every part that holds a row deep inside a long document must receive most of the keys before
that row, and a part can hide a transfer only behind the pairs among its own rows. :func:`transfer_bound`
proves how far above ``LB`` any placement within the token cap must be, by the cost model's own formula
(:meth:`.cost.CostModel.time_of`, one full-attention layer), so that the sweep can tell a layout where
``auto`` falls short from one where no plan meets the goal.

The argument, for a target time ``tau`` and one document of ``L`` rows (rows ``0 .. L - 1``):

* A part holding a row at or above ``y`` needs the keys of every row up to it and holds at most ``cap`` of
  them, so it receives at least ``y + 1 - cap`` keys, and its own-key pairs (what hides a transfer) are at most
  ``cap (cap + 1) / 2``: its exposed transfer is at least ``E(y) = max(0, kv (y + 1 - cap) - cap (cap + 1) / 2)``
  (``kv`` = ``kv_token_cost``; with ``overlap < 1`` a transfer is hidden less, so this still holds).
* Each of its rows at or above ``y`` costs at least ``token_cost + y + 1`` (its token and its pairs), so within
  ``tau`` it holds at most ``n(y) = min(cap, (tau - E(y)) / (token_cost + y + 1))`` of them; the ``L - y`` rows
  at or above ``y`` therefore need ``K(y) >= (L - y) / n(y)`` parts whose top row is at or above ``y``.
* Those parts expose at least ``sum_p E(top_p) >= E(0) K(0) + sum_y (E(y + 1) - E(y)) K(y + 1)`` (``E`` never
  decreases), and hold at most ``min(cap, (tau - E(top_p)) / token_cost)`` tokens each.
* Every part's time is at least its ``token_cost * tokens + pairs`` plus its exposed transfer, so the parts'
  times sum to at least ``P LB + sum_d (exposure of document d)`` (a part holding rows of several documents
  exposes at least the sum of each one's bound, since ``local`` is subtracted once). ``tau`` is feasible only if
  that sum is at most ``P tau``, ``K(y) <= P``, and the tokens fit.

The bound is the smallest feasible ``tau`` (a bisection: every test is monotone in ``tau``). It never exceeds
the time of a placement within the cap (a hypothesis test checks it against every placement the planner builds
and the oracle's). Host numpy over the rows of the documents longer than the cap only (a shorter one exposes
nothing and fits one part).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hf_hsap.plan.cost import CostModel, balance_bound
from hf_hsap.plan.layout import Layout

BOUND_TOLERANCE = 1e-5  # the bisection stops when the bound is known to this share


def transfer_bound(layout: Layout, n_parts: int, cost: CostModel, token_cap: float) -> float:
    """The smallest time (one full-attention layer, pairs) that the slowest part of any placement of ``layout``
    over ``n_parts`` parts, each holding at most ``token_cap`` tokens, can have by ``cost`` (module docstring).

    Args:
        layout: the documents. n_parts: parts. cost: the cost model (the plan's, all-to-all share included).
        token_cap: the most tokens a part may hold (``>= T / n_parts``).

    Returns:
        The bound, at least :func:`hf_hsap.plan.cost.balance_bound`.
    """
    lb = balance_bound(layout, n_parts, cost)
    cap = int(token_cap)
    hidden = cap * (cap + 1) / 2  # the most own-key pairs a part has
    lengths = [int(x) for x in layout.doc_lengths if x > cap]  # a shorter one exposes nothing and fits a part
    if not lengths:
        return lb
    T = layout.total_tokens

    def feasible(tau: float) -> bool:
        exposed = 0.0
        for L in lengths:
            f = _figures(L, tau, cost, cap, hidden)
            if f is None:
                return False
            k, e, tokens_lost = f
            if k > n_parts or n_parts * cap - tokens_lost < T:
                return False
            exposed += e
        return n_parts * tau >= n_parts * lb + exposed

    return max(lb, largest_infeasible(feasible, lb, 2.0 * lb, BOUND_TOLERANCE))


def largest_infeasible(feasible: Callable[[float], bool], lo: float, hi: float, tolerance: float) -> float:
    """A target below which no placement fits, for a test ``feasible`` monotone in the target: ``hi`` doubled until
    it passes, then a bisection down to ``tolerance`` (a share of the target); the last target that failed (``lo``
    when none did), within ``tolerance`` of the smallest that passes.

    Args:
        feasible: the test. lo: a target known to fail (or the compute bound). hi: a first guess above it.
        tolerance: the share of the target the bisection stops at.
    """
    while not feasible(hi):
        lo, hi = hi, 2.0 * hi
    while hi - lo > tolerance * hi:
        mid = (lo + hi) / 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return lo


def document_exposure(L: int, tau: float, cost: CostModel, cap: int) -> float | None:
    """The exposed transfer that the parts holding one document of ``L > cap`` rows have at least, summed, when
    every part takes at most ``tau`` (module docstring), or None when no placement holds it within ``tau``.

    Args:
        L: its rows. tau: the target time. cost: the cost model. cap: the token cap.
    """
    f = _figures(L, tau, cost, cap, cap * (cap + 1) / 2)
    return None if f is None else f[1]


def _figures(L: int, tau: float, cost: CostModel, cap: int, hidden: float) -> tuple[int, float, float] | None:
    """What one document of ``L`` rows demands at target ``tau`` (module docstring).

    Args:
        L: its rows. tau: the target time. cost: the cost model. cap: the token cap. hidden: the most own-key
            pairs of a part.

    Returns:
        ``(parts that hold its rows at least, their exposed transfer at least, the tokens they cannot hold
        below the cap at least)``, or None when not even its last row fits in ``tau``.

    Shapes:
        Every intermediate is ``[L]``, indexed by the row ``y``.
    """
    y = np.arange(L, dtype=np.float64)  # [L]
    exposed = np.maximum(0.0, cost.kv_token_cost * (y + 1 - cap) - hidden)  # E(y), never decreasing
    rows = np.minimum(cap, np.floor((tau - exposed) / (cost.token_cost + y + 1)))  # n(y)
    if rows[-1] < 1:
        return None
    # parts with a row at or above y: enough for the L - y rows there, and never fewer than above it
    parts = np.maximum.accumulate(np.ceil((L - y) / np.maximum(rows, 1.0))[::-1])[::-1]  # K(y)
    # sum_p f(top_p) >= f(0) K(0) + sum_y (f(y + 1) - f(y)) K(y + 1) for any non-decreasing f
    e = float(exposed[0] * parts[0] + (np.diff(exposed) * parts[1:]).sum())
    if cost.token_cost > 0:  # a part's tokens below the cap, at least (free tokens: none)
        lost = cap - np.minimum(cap, (tau - exposed) / cost.token_cost)
    else:
        lost = np.zeros(L)
    tokens_lost = float(lost[0] * parts[0] + (np.diff(lost) * parts[1:]).sum())
    return int(parts[0]), e, tokens_lost
