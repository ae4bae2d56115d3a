"""Contiguous cuts priced with their transfers: the ``contiguous-priced`` candidate of ``placement="auto"``.

``contiguous`` cuts the row into equal token ranges; a part that starts inside a document receives every key
of it before its first row. Where KV is dear (between nodes) and one or a few documents hold most of the
pairs, the greedy splits of :mod:`.balanced` and :mod:`.density` pair an early and a late chunk of each
split document on every holder, so most holders receive most of the document. Contiguous ranges receive
less (a part receives only the keys before its start, in the document it starts in), and cut where the
cost model prices every part alike they trade tokens, pairs and received KV against each other:
the parts deep inside a long document hold fewer rows, the parts of short documents more.

:func:`priced_cuts` finds such cuts: the smallest target time for which a left-to-right fill reaches the
end of the row, every part taking as many tokens as its estimated time (:meth:`.cost.CostModel.time_of`,
one full-attention layer, the formula :func:`.cost.part_times` prices) keeps within the target and the
token cap allows (bisection over the target; per part, its end solved in closed form and checked: its time
never decreases as it grows). The fill is a heuristic, not an optimum (a longer part makes the next one start
later in its document and receive more), so ``auto`` prices its result like every other candidate. Plain
Python scalars: a few thousand closed-form evaluations per plan.

:func:`with_priced_cuts` is the last step ``auto`` takes on groups of at least ``CUT_MIN_PARTS`` parts (smaller
ones are searched from ``contiguous`` and other starts instead, :mod:`.polishing`): the cuts replace the plan
(the winner, polished) where the one-layer model prices them faster *and* the plan's rounds simulated forward
and backward do not price them slower (:func:`.exposure.simulation_agrees`), so it never makes a plan slower by
either model. The cuts win by their transfer term, which is where
the two models part: a part deep inside a long document receives many keys from many senders, and with NVLink
pricing the one-layer model often prefers cuts whose senders then wait for their dK/dV in the simulation (on the
sweep, taking them by the one-layer model alone took NVLink's simulated p95 from 1.05 to 1.15 of the bound).
"""
from __future__ import annotations

import bisect
import math
from typing import Mapping

import numpy as np

from .cost import CostModel, balance_bound, step_time
from .exposure import simulation_agrees
from .layout import Layout
from .placement import Placement, _cut, rows_work, token_cap
from .transfers import Transfers
from .windows import Window, window_transfers

PRICED_TOLERANCE = 5e-4  # the bisection stops when the target is known to this share
PRICED_MAX_STEPS = 16  # and after at most this many fills


class _Row:
    """Closed-form step time of a contiguous range ``[s, e)`` of the row (:func:`.cost.part_times` of a part
    holding exactly it, one full-attention layer).

    Args:
        layout: the documents. cost: the cost model.
    """

    def __init__(self, layout: Layout, cost: CostModel) -> None:
        lengths = layout.doc_lengths
        self.cu = layout.cu_seqlens.tolist()
        self.cost = cost
        diag = cost.diag_block
        work = lengths * (lengths + 1) // 2  # pairs of every whole document
        self.work_before = np.concatenate([[0], np.cumsum(work)]).tolist()  # [n_docs + 1]
        masked = cost.masked_pairs(lengths.astype(np.float64)) if diag else np.zeros(len(lengths))
        self.masked_before = np.concatenate([[0.0], np.cumsum(masked)]).tolist()
        # token_cost * cu[d] + the pairs of every document before d: the row's prefix at each document start
        self.doc_prefix = [cost.token_cost * c + w for c, w in zip(self.cu, self.work_before)]

    def longest(self, s: int, lo: int, hi: int, target: float) -> int:
        """The largest end ``e`` in ``[lo, hi]`` with :meth:`time` ``(s, e) <= target``, or ``lo - 1`` when there
        is none (the time never decreases with ``e``). With ``overlap == 1`` and no masked pairs the time is
        ``max(token_cost n + pairs, token_cost n + a m + kv_token_cost a)`` (``n`` rows, ``a`` keys received,
        ``m`` rows in the first document): each term is solved for ``e`` in closed form (the first over the
        documents' prefix sums, then a quadratic inside one document), then checked by :meth:`time`;
        otherwise a bisection.

        Args:
            s: the part's start. lo, hi: the range of its end. target: the time it may take.

        Returns:
            The end.
        """
        cost = self.cost
        if cost.overlap != 1 or cost.diag_block:
            return _bisect_end(self, s, lo, hi, target)
        cu, tc, kv = self.cu, cost.token_cost, cost.kv_token_cost
        d0 = bisect.bisect_right(cu, s) - 1
        a = s - cu[d0]
        # the first term: token_cost * (e - s) + the pairs of rows s..e-1 = _prefix(e) - _prefix(s)
        e1 = self._prefix_end(target + self._prefix(s))
        # the second: token_cost * n + a * min(n, m0) + kv * a <= target
        m0 = cu[d0 + 1] - s
        room = target - kv * a
        if room < 0:  # the received keys alone take longer than the target
            return lo - 1
        n = room / (tc + a) if tc + a > 0 else math.inf
        if n > m0:
            n = (room - a * m0) / tc if tc > 0 else math.inf
        e = min(e1, s + int(n) if n < hi - s else hi, hi)
        e = max(e, lo)
        while e < hi and self.time(s, e + 1) <= target:  # rounding: settle it exactly
            e += 1
        while e > lo and self.time(s, e) > target:
            e -= 1
        return e if e > lo or self.time(s, lo) <= target else lo - 1

    def _prefix(self, e: int) -> float:
        """``token_cost * e`` plus the pairs of every row before global position ``e`` (within its document)."""
        d = bisect.bisect_right(self.cu, e) - 1
        x = e - self.cu[d]
        return self.cost.token_cost * e + self.work_before[d] + rows_work(0, x)

    def _prefix_end(self, t: float) -> int:
        """The largest global position ``e`` with :meth:`_prefix` ``(e) <= t`` (one bisection over the
        documents' prefix, then the quadratic ``token_cost x + x (x + 1) / 2`` inside one)."""
        d = bisect.bisect_right(self.doc_prefix, t) - 1
        if d >= len(self.cu) - 1:
            return self.cu[-1]
        rest = t - self.doc_prefix[d]
        b = self.cost.token_cost + 0.5  # x (x + 1) / 2 + token_cost x = x^2 / 2 + b x
        x = int((math.sqrt(b * b + 2 * rest) - b)) if rest > 0 else 0  # token_cost x + x (x + 1) / 2 <= rest
        return min(self.cu[d] + x, self.cu[d + 1])

    def _masked(self, rows: int) -> float:
        """Masked pairs of one causal piece of ``rows`` rows (:meth:`.cost.CostModel.masked_pairs`)."""
        return float(self.cost.masked_pairs(rows)) if self.cost.diag_block else 0.0

    def time(self, s: int, e: int) -> float:
        """The estimated time of the part holding ``[s, e)`` (``s < e``): tokens, the pairs of its rows, the
        pairs against its own keys (run while KV is in flight) and the keys before ``s`` in its first
        document (received).

        Args:
            s, e: the range's global ends.

        Returns:
            The time, in pairs (:meth:`.cost.CostModel.time_of`).
        """
        cu = self.cu
        d0 = bisect.bisect_right(cu, s) - 1
        d1 = bisect.bisect_right(cu, e - 1) - 1
        a = s - cu[d0]  # rows of its first document before it: received
        n = (e if d0 == d1 else cu[d0 + 1]) - s  # its rows of the first document
        work = rows_work(a, a + n)
        local = rows_work(0, n)
        masked = self._masked(n)
        if d1 > d0:  # whole documents between, and the first rows of the last
            x = e - cu[d1]
            whole = self.work_before[d1] - self.work_before[d0 + 1] + rows_work(0, x)
            work, local = work + whole, local + whole
            masked += self.masked_before[d1] - self.masked_before[d0 + 1] + self._masked(x)
        return self.cost.time_of(e - s, work + masked, local + masked, a)


def _fill(row: _Row, T: int, n_parts: int, target: float, cap: int, min_tokens: int) -> list[int] | None:
    """Cut the row left to right, every part as long as its time stays within ``target`` (and the parts after
    it can still hold the rest within ``[min_tokens, cap]`` tokens each).

    Args:
        row: the closed form. T: tokens. n_parts: parts. target: the time no part may exceed.
        cap, min_tokens: the most and fewest tokens of a part.

    Returns:
        ``[n_parts + 1]`` cut positions from 0 to ``T``, or None when the fill does not reach the end.
    """
    cuts = [0]
    s = 0
    for p in range(n_parts - 1):
        left = n_parts - p - 1  # parts after this one
        lo, hi = max(s + min_tokens, T - left * cap), min(s + cap, T - left * min_tokens)
        if lo > hi:
            return None
        e = row.longest(s, lo, hi, target)
        if e < lo:  # not even its fewest tokens keep within the target
            return None
        s = e
        cuts.append(s)
    if T - s > cap or T - s < min_tokens or row.time(s, T) > target:
        return None
    cuts.append(T)
    return cuts


def _bisect_end(row: _Row, s: int, lo: int, hi: int, target: float) -> int:
    """:meth:`_Row.longest` by bisection (any cost model)."""
    if row.time(s, lo) > target:
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if row.time(s, mid) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def priced_cuts(layout: Layout, n_parts: int, cost: CostModel, token_cap: float, beat: float,
                min_tokens: int = 1) -> Placement | None:
    """Contiguous ranges whose slowest part's estimated time (one full-attention layer) is below ``beat``,
    as low as the fill finds (module docstring), or None when the fill finds none below it.

    Args:
        layout: the documents. n_parts: parts. cost: the cost model (the plan's, all-to-all share included).
        token_cap: the most tokens a part may hold. beat: the time to beat (the best candidate's so far).
        min_tokens: the fewest tokens a part may hold.

    Returns:
        The placement, named ``"contiguous-priced"``, or None.
    """
    T = layout.total_tokens
    cap = int(token_cap)
    if n_parts < 2 or cap * n_parts < T or min_tokens * n_parts > T:
        return None
    row = _Row(layout, cost)
    lo, hi = balance_bound(layout, n_parts, cost), beat * (1 - PRICED_TOLERANCE)
    best = _fill(row, T, n_parts, hi, cap, min_tokens)
    if best is None:
        return None
    for _ in range(PRICED_MAX_STEPS):
        if hi - lo <= PRICED_TOLERANCE * hi:
            break
        mid = (lo + hi) / 2
        cuts = _fill(row, T, n_parts, mid, cap, min_tokens)
        if cuts is None:
            lo = mid
        else:
            hi, best = mid, cuts
    return _cut(layout, np.asarray(best, dtype=np.int64), np.arange(n_parts, dtype=np.int64), "contiguous-priced",
                n_parts)


def with_priced_cuts(layout: Layout, n_parts: int, cost: CostModel, token_slack: float, min_tokens: int,
                     layers: Mapping[Window, int], pl: Placement, tr: Mapping[Window, Transfers], best: float,
                     budget: int | None, rounds: str) -> tuple[Placement, Mapping[Window, Transfers], float]:
    """``auto``'s plan, or the contiguous cuts priced with their transfers where both models price them faster
    (module docstring). Full-attention plans only (a windowed one is returned as it is).

    Args:
        layout: the documents. n_parts: parts. cost: the plan's cost model. token_slack: the token cap's slack.
        min_tokens: the fewest tokens a part holds. layers: layers per mask kind. pl, tr, best: the plan so far
            (the winner, polished), its transfers of every kind and its step time. budget, rounds: the plan's
            receive budget and rounds option (what its simulation runs).

    Returns:
        ``(placement, transfers of every kind, step time)``.
    """
    if any(w is not None for w in layers):
        return pl, tr, best
    cut = priced_cuts(layout, n_parts, cost, token_cap(layout.total_tokens, n_parts, token_slack),
                      best / layers[None], min_tokens)
    if cut is None:
        return pl, tr, best
    tr_cut = {None: window_transfers(cut, layout, None)}
    t_cut = step_time(layout, cut, tr_cut, layers, cost)
    if t_cut < best and simulation_agrees(layout, (pl, tr[None]), (cut, tr_cut[None]), cost, budget, rounds):
        return cut, tr_cut, t_cut
    return pl, tr, best
