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
token cap allows (a search over the target: first the mean part time of the last fill that reached the end, where
every part would take about as long; else false position on how far the last part is over, a bisection step
where a fill stops early; per part, its end solved in closed form and checked: its time never decreases as it
grows). The fill is a heuristic, not an optimum (a longer part makes the next one start
later in its document and receive more), so ``auto`` prices its result like every other candidate. Plain
Python scalars: a few thousand closed-form evaluations per plan.

:func:`with_priced_cuts` is the last step ``auto`` takes (on groups of at least ``planner.CUT_MIN_PARTS`` parts:
every group; small ones are also searched from ``contiguous`` and other starts before it, :mod:`.polishing`): the
cuts replace the plan (the winner, polished) where the one-layer model prices them faster (by more than
:data:`PRICED_MIN_GAIN`) *and* the plan's rounds simulated forward and backward do not price them slower
(:func:`.exposure.simulation_agrees`), so it never makes a plan slower by either model. The cuts win by their
transfer term, which is where the two models part: a part deep inside a long document receives many keys from
many senders, and the one-layer model sometimes prefers cuts whose senders then wait for their dK/dV in the
simulation (the ranks deep in a dominant document hold fewer tokens, so their returns do not come sooner). The
simulation runs consecutive layers in steady state: one layer that every part started at once would charge those
waits to every layer and refuse the cuts on most NVLink rows.
"""
from __future__ import annotations

import bisect
import math
from typing import Callable, Mapping, NamedTuple

import numpy as np

from .cost import CostModel, balance_bound, step_time
from .exposure import Simulations, simulation_agrees
from .layout import Layout
from .placement import Placement, _cut, token_cap
from .transfers import Transfers
from .windows import Window, window_transfers

PRICED_TOLERANCE = 5e-4  # the bisection stops when the target is known to this share
PRICED_MAX_STEPS = 16  # and after at most this many fills
PRICED_MIN_GAIN = 0.001  # the cuts replace auto's plan only when faster by more than this share (one-layer model):
# below it the gain is noise to the model, and the cuts trade work balance for it (the traffic section's SFT rows
# show the trade; BENCHMARKS.md)


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
        self.diag = diag = cost.diag_block
        work = lengths * (lengths + 1) // 2  # pairs of every whole document
        work_before = np.concatenate([[0], np.cumsum(work)])  # [n_docs + 1]
        self.work_before = work_before.tolist()
        # masked pairs of every document's causal square before d (read only with diag_block)
        self.masked_before = (np.concatenate([[0.0], np.cumsum(cost.masked_pairs(lengths.astype(np.float64)))]).tolist()
                              if diag else None)
        # token_cost * cu[d] + the pairs of every document before d: the row's prefix at each document start
        self.doc_prefix = (cost.token_cost * layout.cu_seqlens.astype(np.float64) + work_before).tolist()

    def longest(self, s: int, lo: int, hi: int, target: float) -> tuple[int, float]:
        """The largest end ``e`` in ``[lo, hi]`` with :meth:`time` ``(s, e) <= target`` and that time, or
        ``(lo - 1, inf)`` when there is none (the time never decreases with ``e``). With ``overlap == 1`` and no
        masked pairs the time is ``max(token_cost n + pairs, token_cost n + a m + kv_token_cost a)`` (``n`` rows,
        ``a`` keys received, ``m`` rows in the first document): each term is solved for ``e`` in closed form (the
        first over the documents' prefix sums, then a quadratic inside one document), then checked by
        :meth:`time`; otherwise a bisection.

        Args:
            s: the part's start. lo, hi: the range of its end. target: the time it may take.

        Returns:
            ``(end, its time)``.
        """
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
        """The largest global position ``e`` with ``prefix(e) <= t``, ``prefix(e)`` being ``token_cost * e`` plus
        the pairs of every row before ``e`` (within its document) (one bisection over the
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
        return self._time(s, bisect.bisect_right(self.cu, s) - 1, e)

    def _time(self, s: int, d0: int, e: int) -> float:
        """:meth:`time`, the document ``d0`` that holds ``s`` known."""
        return self.cost.time_of(*self._figures(s, d0, e))

    def figures(self, s: int, e: int) -> tuple[int, float, float, int]:
        """What :meth:`.cost.CostModel.time_of` reads of a part holding ``[s, e)`` (zeros when ``e <= s``): its
        tokens, its pairs, the pairs against its own keys (masked pairs included in both) and the keys it
        receives; a part holding ranges of several rows sums them (:mod:`.slicing`)."""
        if e <= s:
            return 0, 0.0, 0.0, 0
        return self._figures(s, bisect.bisect_right(self.cu, s) - 1, e)

    def _figures(self, s: int, d0: int, e: int) -> tuple[int, float, float, int]:
        """:meth:`figures`, the document ``d0`` that holds ``s`` known (the pairs of rows ``u..v-1`` of a
        document are :func:`.placement.rows_work`, written out: this is the fill's inner loop)."""
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
    """What one fill (:func:`_fill`) found.

    Attributes:
        cuts: ``[n_parts + 1]`` cut positions from 0 to ``T`` (:mod:`.slicing`: a pair of positions, one per line),
            or None when the fill did not reach the end.
        slowest: the slowest part's time (inf when ``cuts`` is None).
        excess: the last part's time minus the slowest other part's (``cuts``), or minus the target (None
            ``cuts``; nan where the fill stopped before the last part): the search's measure of how far the
            target is from the lowest one that reaches the end.
        mean: the parts' mean time (``cuts``; nan otherwise): about the target at which every part would take
            as long, the search's next guess.
    """

    cuts: list[int] | None
    slowest: float
    excess: float
    mean: float = math.nan


def _fill(row: _Row, T: int, n_parts: int, target: float, cap: int, min_tokens: int) -> _Filled:
    """Cut the row left to right, every part as long as its time stays within ``target`` (and the parts after
    it can still hold the rest within ``[min_tokens, cap]`` tokens each).

    The same fill at any target from the slowest part's time up to ``target`` makes the same cuts (every
    part's end is the longest within the target, and each kept within the lower one).

    Args:
        row: the closed form. T: tokens. n_parts: parts. target: the time no part may exceed.
        cap, min_tokens: the most and fewest tokens of a part.

    Returns:
        The :class:`_Filled`.
    """
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
    """The cuts of the lowest target a fill reaches the end at, known to :data:`PRICED_TOLERANCE`: a search over
    the target between ``lo`` (below which none does) and a fill that did (``found``): at the mean part time of the
    last fill that reached the end while it lies inside the bracket (the parts of a fill at a target far above the
    lowest take what they can, the last ones little; at their mean they would take about as long), else by false
    position on the fills' excess (the Illinois rule; a bisection step where a fill stopped early). On the 2,000-
    document row at P = 64 (network) the guess needs 3 fills where false position and bisection took 7.

    A fill that reaches the end lowers the bracket to its slowest part's time (the fill there makes the same
    cuts, :func:`_fill`).

    Args:
        fill: the fill at a target (:func:`_fill` of one row; :mod:`.slicing`'s of two lines). lo: a target no
            fill reaches the end at (or the compute bound, none below it can). found: a fill that reached the end.

    Returns:
        The cuts of the lowest fill that reached the end.
    """
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
    found = _fill(row, T, n_parts, beat * (1 - PRICED_TOLERANCE), cap, min_tokens)
    if found.cuts is None:
        return None
    best = _search(lambda target: _fill(row, T, n_parts, target, cap, min_tokens),
                   balance_bound(layout, n_parts, cost), found)
    return _cut(layout, np.asarray(best, dtype=np.int64), np.arange(n_parts, dtype=np.int64), "contiguous-priced",
                n_parts)


def with_priced_cuts(layout: Layout, n_parts: int, cost: CostModel, token_slack: float, min_tokens: int,
                     layers: Mapping[Window, int], pl: Placement, tr: Mapping[Window, Transfers], best: float,
                     budget: int | None, rounds: str, sims: Simulations | None = None
                     ) -> tuple[Placement, Mapping[Window, Transfers], float]:
    """``auto``'s plan, or the contiguous cuts priced with their transfers where both models price them faster (the
    one-layer model by more than :data:`PRICED_MIN_GAIN`; module docstring). Full-attention plans only (a windowed
    one is returned as it is).

    Args:
        layout: the documents. n_parts: parts. cost: the plan's cost model. token_slack: the token cap's slack.
        min_tokens: the fewest tokens a part holds. layers: layers per mask kind. pl, tr, best: the plan so far
            (the winner, polished), its transfers of every kind and its step time. budget, rounds: the plan's
            receive budget and rounds option (what its simulation runs). sims: the simulated times so far
            (``auto``'s memo, updated; :func:`.exposure.simulation_agrees`).

    Returns:
        ``(placement, transfers of every kind, step time)``.
    """
    if any(w is not None for w in layers):
        return pl, tr, best
    cut = priced_cuts(layout, n_parts, cost, token_cap(layout.total_tokens, n_parts, token_slack),
                      best / layers[None], min_tokens)
    return replaced_where_both_agree(layout, cost, layers, (pl, tr, best), cut, budget, rounds, sims)


def replaced_where_both_agree(layout: Layout, cost: CostModel, layers: Mapping[Window, int],
                              current: tuple[Placement, Mapping[Window, Transfers], float], cut: Placement | None,
                              budget: int | None, rounds: str, sims: Simulations | None
                              ) -> tuple[Placement, Mapping[Window, Transfers], float]:
    """``cut`` (full attention), its transfers and step time where the one-layer model prices it faster than the
    plan ``current`` by more than :data:`PRICED_MIN_GAIN` and the plan's rounds simulated do not price it slower
    (:func:`.exposure.simulation_agrees`); else ``current``. The rule of this step and of :mod:`.slicing`'s."""
    if cut is None:
        return current
    pl, tr, best = current
    tr_cut = {None: window_transfers(cut, layout, None)}
    t_cut = step_time(layout, cut, tr_cut, layers, cost)
    faster = t_cut < best * (1 - PRICED_MIN_GAIN)
    if faster and simulation_agrees(layout, (pl, tr[None]), (cut, tr_cut[None]), cost, budget, rounds, sims):
        return cut, tr_cut, t_cut
    return current
