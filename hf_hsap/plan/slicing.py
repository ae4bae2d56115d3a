"""Sliced cuts: the ``sliced`` proposal of ``placement="auto"``, for documents longer than the token cap. Where KV is
dear, a part deep in such a document receives most of its earlier keys and runs out of time long before tokens, while
parts of short documents fill the cap with time to spare. :func:`sliced_cuts` lines up the long documents (longest
first) and the rest (row order); every part holds a range of each, as much of the long line as a target time allows,
the target searched as in :mod:`.cutting`.
"""
from __future__ import annotations

import math
import numpy as np

from .cost import CostModel, balance_bound
from .cutting import PRICED_TOLERANCE, _Filled, _Row, _search
from .layout import Layout, make_layout
from .placement import Placement, _finish


class _Lines:
    """The row's two lines (module docstring), each priced by a :class:`.cutting._Row` (None when empty)."""

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


def _most_long(lines: _Lines, a: int, lo: int, hi: int, b: int, b_end, *, target: float) -> tuple[int, float]:
    """The largest ``m`` in ``[lo, hi]`` (``lo`` must fit) whose part, ``m`` rows of the long line and the short line up
    to ``b_end(m)``, keeps within ``target``, and its time: a bisection."""
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
    """Cut both lines left to right under ``target``: while the short line lasts, every part takes as many tokens as
    the cap allows (leaving later parts their ``min_tokens``), the most of the long line within the target; then the
    long line alone; the last part takes the rest. The :class:`.cutting._Filled` cuts are ``(long, short)`` pairs."""
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
                              lambda m: min(b + most - m, B), target=target)
            if t > target:  # its fewest long rows (the short line nearly used up) do not keep within the target
                return stopped
            s = min(b + most - m, B)
            if s == B and m < min(most - (B - b), A - a):  # the short line ran out: the most of the long alone
                m, t = _most_long(lines, a, m, min(most - (B - b), A - a), b, lambda m: B, target=target)
        else:
            s = b
            if lines.time(a, a + min_tokens, b, b) > target:
                return stopped
            m, t = _most_long(lines, a, min_tokens, min(most, A - a), b, lambda m: b, target=target)
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
    """The sliced cuts (module docstring) whose slowest part's estimated time (one full-attention layer) is as low as
    the fill finds below ``beat``, or None (also when no document is longer than the cap).

    Args:
        layout: the documents. n_parts: parts. cost: the plan's cost model. beat: the time to beat.
        token_cap, min_tokens: the most and fewest tokens of a part.

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
    """The segments of every part's two ranges (the pieces between cuts and document starts), in row positions."""
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
