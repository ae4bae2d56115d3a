"""Sliced cuts: the ``sliced`` candidate of ``placement="auto"``, for rows whose long documents outrun the parts.

Where KV is dear (between nodes a received key costs ~1,200 pairs, a held token's projections and MLP ~18,000)
and documents longer than the token cap hold many of the pairs, a part holding rows deep in such a document
receives most of the keys before them, whatever else it holds, and those rows are dense in pairs: the part runs
out of time long before it runs out of tokens. :mod:`.cutting`'s contiguous cuts give such a part nothing else,
and the parts that hold only short documents are full at the token cap with time to spare, so the row runs out
of parts; the greedy splits of :mod:`.balanced` and :mod:`.density` pair an early and a late chunk of every split
document on every holder, so most holders receive most of it. :func:`benchmarks.relaxation.relaxed_bound` shows what is
possible: deep parts take a short slice of a long document and fill up with short documents to the cap, paying
their transfer once each while every part's tokens are used.

:func:`sliced_cuts` builds that. The documents longer than the cap go on one line (longest first), every other
document on another (row order); part ``p`` holds a contiguous range of each. Left to right, under a target time,
every part takes as many tokens as the cap allows, the most of the long line that keeps it within the target,
the rest from the short line; once the short line is used up, the most of the long line alone (the fill,
:func:`_fill`, priced exactly: :meth:`.cutting._Row.figures` of both ranges summed, one full-attention layer).
The target is searched as :mod:`.cutting` searches its own (:func:`.cutting._search`). A heuristic: ``auto``
prices its result like every other plan.

:func:`with_sliced_cuts` is ``auto``'s step after the priced cuts: the slices replace the plan only where the
one-layer model prices them faster (by more than :data:`.cutting.PRICED_MIN_GAIN`) and the plan's rounds
simulated forward and backward do not price them slower (:func:`.cutting.replaced_where_both_agree`, the rule of
both steps), so the step never makes a plan slower by either model. It is tried only where a document is longer
than the cap and the plan is at least :data:`SLICED_MIN_EXCESS` above the compute bound (so that the 2,000-document
planning row, just above the bound, pays nothing for it). Where it wins on the placement sweep, and by how much
against a fill that treats the short documents as divisible (solved exactly by dynamic programming over the slice
sizes), is in BENCHMARKS.md.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from .cost import CostModel, balance_bound
from .cutting import PRICED_TOLERANCE, _Filled, _Row, _search, replaced_where_both_agree
from .exposure import Simulations
from .layout import Layout, make_layout
from .placement import Placement, _finish, token_cap
from .transfers import Transfers
from .windows import Window

SLICED_MIN_EXCESS = 0.01  # auto tries the slices only on plans at least this far above the compute bound


class _Lines:
    """The two lines of a row (module docstring) and the closed form of each (:class:`.cutting._Row`).

    Args:
        layout: the documents. cost: the cost model. cap: the token cap.
    """

    def __init__(self, layout: Layout, cost: CostModel, cap: int) -> None:
        lengths = layout.doc_lengths
        self.long_docs = np.flatnonzero(lengths > cap)[np.argsort(-lengths[lengths > cap], kind="stable")]
        self.short_docs = np.flatnonzero(lengths <= cap)
        self.long, self.short = (_Row(make_layout(np.concatenate([[0], np.cumsum(lengths[docs])])), cost)
                                 if docs.shape[0] else None for docs in (self.long_docs, self.short_docs))
        self.n_long, self.n_short = (row.cu[-1] if row is not None else 0 for row in (self.long, self.short))
        self.cost = cost

    def time(self, a: int, a_end: int, b: int, b_end: int) -> float:
        """The estimated time of a part holding ``[a, a_end)`` of the long line and ``[b, b_end)`` of the short."""
        x = self.long.figures(a, a_end)
        if b_end <= b:
            return self.cost.time_of(*x)
        y = self.short.figures(b, b_end)
        return self.cost.time_of(x[0] + y[0], x[1] + y[1], x[2] + y[2], x[3] + y[3])


def _most_long(lines: _Lines, a: int, lo: int, hi: int, b: int, b_end, target: float) -> tuple[int, float]:
    """The largest ``m`` in ``[lo, hi]`` found by bisection with the part's time within ``target`` (``b_end(m)``:
    the end of its short range) and that time; ``lo`` must fit (its time is returned as found)."""
    t = lines.time(a, a + lo, b, b_end(lo))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        t_mid = lines.time(a, a + mid, b, b_end(mid))
        if t_mid <= target:
            lo, t = mid, t_mid
        else:
            hi = mid - 1
    return lo, t


def _fill(lines: _Lines, n_parts: int, target: float, cap: int, min_tokens: int) -> _Filled:
    """Cut both lines left to right under ``target`` (module docstring): every part as many tokens as the cap
    allows (and the parts after it their ``min_tokens``) while the short line lasts, the most of the long line
    within the target; then the long line alone; the last part takes the rest.

    Returns:
        The :class:`.cutting._Filled`; its cuts are ``(long end, short end)`` pairs, from ``(0, 0)``.
    """
    A, B = lines.n_long, lines.n_short
    a = b = 0
    cuts = [(0, 0)]
    slowest = total = 0.0
    stopped = _Filled(None, math.inf, math.nan)
    for p in range(n_parts - 1):
        rest, left = (A - a) + (B - b), n_parts - p - 1  # tokens to place; parts after this one
        if rest > (left + 1) * cap:  # the parts left cannot hold the rest
            return stopped
        most = min(cap, rest - left * min_tokens)  # the most this part may take
        if b < B:
            if lines.time(a, a, b, min(b + most, B)) > target:  # short documents alone fill it before the cap
                s, t = lines.short.longest(b, b + min_tokens, min(b + most, B), target)
                if s < b + min_tokens:
                    return stopped
                cuts.append((a, s))
                b, slowest, total = s, max(slowest, t), total + t
                continue
            m, t = _most_long(lines, a, max(0, min_tokens - (B - b)), min(most, A - a), b,
                              lambda m: min(b + most - m, B), target)
            if t > target:  # its fewest long rows (the short line nearly used up) do not keep within the target
                return stopped
            s = min(b + most - m, B)
            if s == B and m < min(most - (B - b), A - a):  # the short line ran out: the most of the long alone
                m, t = _most_long(lines, a, m, min(most - (B - b), A - a), b, lambda m: B, target)
        else:
            s = b
            if lines.time(a, a + min_tokens, b, b) > target:
                return stopped
            m, t = _most_long(lines, a, min_tokens, min(most, A - a), b, lambda m: b, target)
        a, b = a + m, s
        cuts.append((a, b))
        slowest, total = max(slowest, t), total + t
    if (A - a) + (B - b) > cap:
        return stopped
    t = lines.time(a, A, b, B)
    if t > target:
        return _Filled(None, math.inf, t - target)
    cuts.append((A, B))
    return _Filled(cuts, max(slowest, t), t - slowest, (total + t) / n_parts)


def sliced_cuts(layout: Layout, n_parts: int, cost: CostModel, token_cap: float, beat: float,
                min_tokens: int = 1) -> Placement | None:
    """The sliced cuts (module docstring) whose slowest part's estimated time (one full-attention layer) is below
    ``beat``, as low as the fill finds, or None (no document longer than the cap, or none below ``beat``).

    Args:
        layout: the documents. n_parts: parts. cost: the cost model (the plan's, all-to-all share included).
        token_cap: the most tokens a part may hold. beat: the time to beat. min_tokens: the fewest tokens a
            part may hold.

    Returns:
        The placement, named ``"sliced"``, or None.
    """
    cap = int(token_cap)
    T = layout.total_tokens
    if n_parts < 2 or cap * n_parts < T or min_tokens * n_parts > T or not (layout.doc_lengths > cap).any():
        return None
    lines = _Lines(layout, cost, cap)
    found = _fill(lines, n_parts, beat * (1 - PRICED_TOLERANCE), cap, min_tokens)
    if found.cuts is None:
        return None
    cuts = _search(lambda target: _fill(lines, n_parts, target, cap, min_tokens), balance_bound(layout, n_parts, cost),
                   found)
    return _placement(layout, lines, cuts, n_parts)


def _placement(layout: Layout, lines: _Lines, cuts: list[tuple[int, int]], n_parts: int) -> Placement:
    """The segments of every part's two ranges, in the row's positions.

    Shapes:
        Per line: the cut positions ``[n_parts + 1]``; the pieces between consecutive cuts and document starts,
        ``[pieces]``; the segments of both lines, ``[segments]``.
    """
    segs = []
    for k, (row, docs) in enumerate(((lines.long, lines.long_docs), (lines.short, lines.short_docs))):
        if row is None:
            continue
        ends = np.array([c[k] for c in cuts], dtype=np.int64)  # [n_parts + 1] this line's cuts
        line_cu = np.asarray(row.cu, dtype=np.int64)  # [docs on the line + 1]
        points = np.unique(np.concatenate([ends, line_cu]))  # every cut and document start of the line
        start, end = points[:-1], points[1:]
        on = np.searchsorted(line_cu, start, side="right") - 1  # [pieces] index of the piece's document
        part = np.searchsorted(ends, start, side="right") - 1  # [pieces] the part whose range holds it
        doc = docs[on]
        offset = layout.cu_seqlens[doc] - line_cu[on]  # line position -> row position
        segs.append((doc, start + offset, end + offset, part))
    doc, start, end, part = (np.concatenate(x) for x in zip(*segs))
    return _finish("sliced", n_parts, doc, start, end, part)


def with_sliced_cuts(layout: Layout, n_parts: int, cost: CostModel, token_slack: float, min_tokens: int,
                     layers: Mapping[Window, int], pl: Placement, tr: Mapping[Window, Transfers], best: float,
                     budget: int | None, rounds: str, sims: Simulations | None = None
                     ) -> tuple[Placement, Mapping[Window, Transfers], float]:
    """``auto``'s plan, or the sliced cuts where both models price them faster (module docstring). Full-attention
    plans only. Arguments and returns as :func:`.cutting.with_priced_cuts`."""
    if any(w is not None for w in layers):
        return pl, tr, best
    if best / layers[None] < (1 + SLICED_MIN_EXCESS) * balance_bound(layout, n_parts, cost):
        return pl, tr, best
    cut = sliced_cuts(layout, n_parts, cost, token_cap(layout.total_tokens, n_parts, token_slack),
                      best / layers[None], min_tokens)
    return replaced_where_both_agree(layout, cost, layers, (pl, tr, best), cut, budget, rounds, sims)
