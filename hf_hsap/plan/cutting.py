"""Contiguous cuts priced with their transfers: the ``contiguous-priced`` proposal of ``placement="auto"``. Where KV
is dear and a few long documents hold most of the pairs, the greedy splits give every holder of a split document an
early and a late chunk, so most holders receive most of its keys; contiguous ranges receive less. :func:`priced_cuts`
searches the lowest target time at which a left-to-right fill, every part as long as its estimated time allows,
reaches the end of the row. A heuristic: :mod:`.search` prices it like any other proposal.
"""
from __future__ import annotations

import bisect
import math
from typing import Callable, NamedTuple

import numpy as np

from .cost import CostModel, balance_bound
from .layout import Layout
from .placement import Placement, _cut

PRICED_TOLERANCE = 5e-4  # the bisection stops when the target is known to this share
PRICED_MAX_STEPS = 16  # and after at most this many fills


class _Row:
    """Closed-form estimated time of a part holding one contiguous range of the row (what :func:`.cost.part_times`
    prices, one full-attention layer)."""

    def __init__(self, layout: Layout, cost: CostModel) -> None:
        lengths = layout.doc_lengths
        self.cu = layout.cu_seqlens.tolist()
        self.cost = cost
        self.diag = diag = cost.diag_block
        work = lengths * (lengths + 1) // 2  # pairs of every whole document
        work_before = np.concatenate([[0], np.cumsum(work)])  # [n_docs + 1]
        self.work_before = work_before.tolist()
        self.masked_before = (np.concatenate([[0.0], np.cumsum(cost.masked_pairs(lengths.astype(np.float64)))]).tolist()
                              if diag else None)
        # the row's prefix at every document start: token_cost * cu[d] + the pairs of the documents before d
        self.doc_prefix = (cost.token_cost * layout.cu_seqlens.astype(np.float64) + work_before).tolist()

    def longest(self, s: int, lo: int, hi: int, target: float) -> tuple[int, float]:
        """The largest end ``e`` in ``[lo, hi]`` with :meth:`time` ``(s, e) <= target`` and that time, else
        ``(lo - 1, inf)``. With ``overlap == 1`` and no masked pairs, each term of the time is solved for ``e`` in
        closed form, then settled by :meth:`time`; otherwise a bisection."""
        cost = self.cost
        if cost.overlap != 1 or cost.diag_block:
            return _bisect_end(self, s, lo, hi, target)
        cu, tc, kv = self.cu, cost.token_cost, cost.kv_token_cost
        d0 = bisect.bisect_right(cu, s) - 1
        a = s - cu[d0]
        # the first term: token_cost * (e - s) + the pairs of rows s..e-1 = prefix(e) - prefix(s)
        e1 = self._prefix_end(target + tc * s + self.work_before[d0] + a * (a + 1) // 2)  # prefix(s)
        # the second: token_cost * n + a * min(n, m0) + kv * a <= target
        m0 = cu[d0 + 1] - s
        room = target - kv * a
        if room < 0:  # the received keys alone take longer than the target
            return lo - 1, math.inf
        n = room / (tc + a) if tc + a > 0 else math.inf
        if n > m0:
            n = (room - a * m0) / tc if tc > 0 else math.inf
        e = max(min(e1, s + int(n) if n < hi - s else hi, hi), lo)
        t = self._time(s, d0, e)  # rounding: settle it exactly
        if t <= target:
            while e < hi:
                t_next = self._time(s, d0, e + 1)
                if t_next > target:
                    break
                e, t = e + 1, t_next
            return e, t
        while e > lo:
            e -= 1
            t = self._time(s, d0, e)
            if t <= target:
                return e, t
        return lo - 1, math.inf

    def _prefix_end(self, t: float) -> int:
        """The largest position ``e`` with ``prefix(e) <= t`` (``token_cost * e`` plus the pairs of every row before
        ``e``): a bisection over the document starts, then a quadratic inside one document."""
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
        """The estimated time, in pairs (:meth:`.cost.CostModel.time_of`), of the part holding ``[s, e)`` (``s < e``):
        its tokens, its pairs (those against its own keys run while KV is in flight) and the keys it receives."""
        return self._time(s, bisect.bisect_right(self.cu, s) - 1, e)

    def _time(self, s: int, d0: int, e: int) -> float:
        """:meth:`time`, the document ``d0`` that holds ``s`` known."""
        return self.cost.time_of(*self._figures(s, d0, e))

    def figures(self, s: int, e: int) -> tuple[int, float, float, int]:
        """What :meth:`.cost.CostModel.time_of` reads of a part holding ``[s, e)``: tokens, pairs, pairs against its
        own keys (masked pairs in both), keys received; zeros if ``e <= s``. Ranges of several rows add up."""
        if e <= s:
            return 0, 0.0, 0.0, 0
        return self._figures(s, bisect.bisect_right(self.cu, s) - 1, e)

    def _figures(self, s: int, d0: int, e: int) -> tuple[int, float, float, int]:
        """:meth:`figures`, ``d0`` holding ``s`` (:func:`.placement.rows_work` written out: the fill's inner loop)."""
        cu = self.cu
        a = s - cu[d0]  # rows of its first document before it: received
        end0 = cu[d0 + 1]
        if e <= end0:  # within one document
            n = e - s
            b = a + n
            work, local = (b * (b + 1) - a * (a + 1)) // 2, n * (n + 1) // 2
            masked = self._masked(n) if self.diag else 0.0
        else:  # its first document's last rows, whole documents between, and the first rows of the last
            n = end0 - s
            b = end0 - cu[d0]
            d1 = bisect.bisect_right(cu, e - 1, d0 + 1) - 1
            x = e - cu[d1]
            whole = self.work_before[d1] - self.work_before[d0 + 1] + x * (x + 1) // 2
            work, local = (b * (b + 1) - a * (a + 1)) // 2 + whole, n * (n + 1) // 2 + whole
            masked = (self._masked(n) + self.masked_before[d1] - self.masked_before[d0 + 1] + self._masked(x)
                      if self.diag else 0.0)
        return e - s, work + masked, local + masked, a


class _Filled(NamedTuple):
    """What one fill found: ``cuts``, ``[n_parts + 1]`` positions from 0 to ``T`` (position pairs in :mod:`.slicing`)
    or None short of the end; the ``slowest`` part's time (inf without cuts); the ``excess`` of the last part's time
    over the slowest other's (without cuts: over the target, nan if the fill stopped earlier); the ``mean`` part time
    (nan without cuts). The excess and the mean guide :func:`_search`."""

    cuts: list[int] | None
    slowest: float
    excess: float
    mean: float = math.nan


def _fill(row: _Row, T: int, n_parts: int, target: float, cap: int, min_tokens: int) -> _Filled:
    """Cut the row left to right, every part as long as its time stays within ``target`` and the rest still fits
    ``[min_tokens, cap]`` tokens a part. Any target from the slowest part's time up to ``target`` cuts the same."""
    cuts = [0]
    s = 0
    slowest = total = 0.0
    stopped = _Filled(None, math.inf, math.nan)
    for p in range(n_parts - 1):
        left = n_parts - p - 1  # parts after this one
        lo, hi = max(s + min_tokens, T - left * cap), min(s + cap, T - left * min_tokens)
        if lo > hi:
            return stopped
        e, t = row.longest(s, lo, hi, target)
        if e < lo:  # not even its fewest tokens keep within the target
            return stopped
        s, slowest, total = e, max(slowest, t), total + t
        cuts.append(s)
    if T - s < min_tokens:
        return stopped
    t = row.time(s, T)
    if t > target or T - s > cap:
        return _Filled(None, math.inf, t - target if T - s <= cap else math.nan)
    cuts.append(T)
    return _Filled(cuts, max(slowest, t), t - slowest, (total + t) / n_parts)


def _bisect_end(row: _Row, s: int, lo: int, hi: int, target: float) -> tuple[int, float]:
    """:meth:`_Row.longest` by bisection (any cost model)."""
    t = row.time(s, lo)
    if t > target:
        return lo - 1, math.inf
    while lo < hi:
        mid = (lo + hi + 1) // 2
        t_mid = row.time(s, mid)
        if t_mid <= target:
            lo, t = mid, t_mid
        else:
            hi = mid - 1
    return lo, t


def _search(fill: Callable[[float], _Filled], lo: float, found: _Filled) -> list:
    """The cuts of the lowest target at which ``fill`` reaches the end, to :data:`PRICED_TOLERANCE`, searched between
    ``lo`` (none below it does) and ``found`` (a fill that did). The next target is the last successful fill's mean
    part time while inside the bracket (there the parts would take about as long), else false position on the excess
    (Illinois rule), else a bisection. A fill that reaches the end lowers the bracket to its slowest part's time."""
    best, hi, g_hi = found.cuts, found.slowest, found.excess
    g_lo = math.nan  # the excess at lo, once a fill there is known
    side = 0  # which end the last fill moved (-1: lo, 1: hi)
    guess = found.mean
    for _ in range(PRICED_MAX_STEPS):
        width = hi - lo
        if width <= PRICED_TOLERANCE * hi:
            break
        if lo < guess < hi:  # the mean part time of the last fill that reached the end
            mid = guess
        elif g_lo > 0 and g_hi <= 0:  # false position, kept off the ends
            mid = hi - g_hi * width / (g_hi - g_lo)
            mid = min(max(mid, lo + width / 16), hi - width / 16)
        else:
            mid = lo + width / 2
        f = fill(mid)
        guess = f.mean
        if f.cuts is None:
            lo, g_lo = mid, f.excess
            if side < 0:  # the same end kept twice: halve its excess (Illinois)
                g_hi /= 2
            side = -1
        else:
            best, hi, g_hi = f.cuts, f.slowest, f.excess
            if side > 0:
                g_lo /= 2
            side = 1
    return best


def priced_cuts(layout: Layout, n_parts: int, cost: CostModel, token_cap: float, beat: float,
                min_tokens: int = 1) -> Placement | None:
    """Contiguous ranges whose slowest part's estimated time (one full-attention layer) is as low as the fill finds
    below ``beat``, or None.

    Args:
        layout: the documents. n_parts: parts. cost: the plan's cost model. beat: the time to beat.
        token_cap, min_tokens: the most and fewest tokens of a part.

    Returns:
        The placement, named ``"contiguous-priced"``, or None.
    """
    T = layout.total_tokens
    cap = int(token_cap)
    if n_parts < 2 or cap * n_parts < T or min_tokens * n_parts > T:
        return None
    row = _Row(layout, cost)
    found = _fill(row, T, n_parts, beat * (1 - PRICED_TOLERANCE), cap, min_tokens)
    if found.cuts is None:
        return None
    best = _search(lambda target: _fill(row, T, n_parts, target, cap, min_tokens),
                   balance_bound(layout, n_parts, cost), found)
    return _cut(layout, np.asarray(best, dtype=np.int64), np.arange(n_parts, dtype=np.int64), "contiguous-priced",
                n_parts)
