"""Work refinement of a placement: move boundaries inside split documents to even out the work a greedy pass leaves.
An *exchange* between parts sharing two boundaries hands ``x`` late rows one way and ``x`` early rows back (tokens
stay, about ``x * (late - early)`` pairs move); priced by a cost model, a *slide* hands ``x`` rows across one boundary
to a neighbour with tokens to spare. No move changes the (part, document) pairs. Plain Python scalars: runs per batch.
"""
from __future__ import annotations

import math
from typing import Callable

from .placement import rows_work
from .segments import Segments

Sides = tuple[list[list[tuple[int, int, bool]]], dict[int, dict[int, list[int]]]]  # what boundary_sides returns


def refine_moves(doc_first: list[int], segs: Segments, wrk: list[float], max_moves: int, *,
                 tok: list[float] | None = None, token_cost: float = 0.0, cap_t: float = math.inf,
                 bounds: list[int] | None = None, sides: Sides | None = None) -> int:
    """Lower the largest part load by repeating the busiest part's best move until none lowers it.

    Args:
        doc_first: every document's first position (``cu_seqlens[:-1]``). max_moves: the most moves.
        segs: the segments, each document's consecutive and in order; their bounds are moved in place.
        wrk: every part's work (pairs), updated in place.
        tok: every part's tokens, updated in place (None: exchanges only). token_cost: a token's price in pairs
            (load: ``work + token_cost * tokens``). cap_t: no slide takes a part above it. bounds: :func:`boundaries`.
        sides: :func:`boundary_sides` of ``bounds``, if known.

    Returns:
        The number of moves made.
    """
    bounds = boundaries(segs) if bounds is None else bounds
    if not bounds:
        return 0
    by_part, by_nbr = boundary_sides(bounds, segs.part, len(wrk)) if sides is None else sides
    tokens = tok if tok is not None else [0.0] * len(wrk)  # token-neutral: the load is the work
    load = [w + token_cost * t for w, t in zip(wrk, tokens)]
    moves = 0
    while moves < max_moves:
        p = load.index(max(load))  # the busiest part (the first of equals)
        mine = by_part[p]
        if p not in by_nbr:
            by_nbr[p] = {}
            for a, q, _ in mine:  # neighbours in the order of their first boundary
                by_nbr[p].setdefault(q, []).append(a)
        exchange = _best_exchange(p, by_nbr[p], doc_first, segs, load)
        slide = None
        if tok is not None:
            slide = _best_slide(p, mine, doc_first, segs, load, tok=tok, token_cost=token_cost, cap_t=cap_t)
        if slide is not None and (exchange is None or slide[0] < exchange[0]):
            _, q, x, a, work = slide
            _shift(a, segs.part[a] == p, x, segs)
            tokens[p] -= x
            tokens[q] += x
        elif exchange is not None:
            _, q, x, give, take, work = exchange
            _shift(give, segs.part[give] == p, x, segs)
            _shift(take, segs.part[take] == q, x, segs)
        else:
            return moves
        wrk[p] -= work
        wrk[q] += work
        for i in (p, q):
            load[i] = wrk[i] + token_cost * tokens[i]
        moves += 1
    return moves


def boundaries(segs: Segments) -> list[int]:
    """The movable boundaries, ascending, each named by its left segment ``a``: segments ``a`` and ``a + 1`` are
    adjacent rows of one document on different parts."""
    seg_doc, seg_start, seg_end, seg_part = segs.doc, segs.start, segs.end, segs.part
    return [a for a in range(len(seg_doc) - 1)
            if seg_doc[a] == seg_doc[a + 1] and seg_end[a] == seg_start[a + 1] and seg_part[a] != seg_part[a + 1]]


def boundary_sides(bounds: list[int], seg_part: list[int], n_parts: int) -> Sides:
    """Every part's boundaries (fixed: moves never change a segment's part): ``(by_part, by_nbr)``, ``by_part[p]`` the
    ``(a, neighbour, p holds the left segment)`` ascending, ``by_nbr`` empty until :func:`refine_moves` fills it."""
    by_part: list[list[tuple[int, int, bool]]] = [[] for _ in range(n_parts)]
    for a in bounds:
        left, right = seg_part[a], seg_part[a + 1]
        by_part[left].append((a, right, True))
        by_part[right].append((a, left, False))
    return by_part, {}


def _shift(a: int, left_gives: bool, x: int, segs: Segments) -> None:
    """Move ``x`` rows across boundary ``a``: from the left segment to the right one, or back."""
    d = -x if left_gives else x
    segs.end[a] += d
    segs.start[a + 1] += d


def _moved(a: int, left_gives: bool, x: int, doc_first: list[int], segs: Segments) -> tuple[int, int]:
    """Work of the ``x`` rows that would cross boundary ``a``, and the rows left in the giving segment."""
    seg_start, seg_end = segs.start, segs.end
    pos = seg_end[a] - doc_first[segs.doc[a]]  # the boundary, in document coordinates
    if left_gives:
        return rows_work(pos - x, pos), seg_end[a] - seg_start[a] - x
    return rows_work(pos, pos + x), seg_end[a + 1] - seg_start[a + 1] - x


def _best_exchange(p: int, shared: dict[int, list[int]], doc_first: list[int], segs: Segments,
                   load: list[float]) -> tuple[float, int, int, int, int, float] | None:
    """The exchange of ``p`` with a neighbour (``shared``: ``p``'s boundaries by neighbour) that lowers the pair's peak
    most: ``(new peak, q, x, give boundary, take boundary, work moved)``, or None. Only the two latest boundaries give
    and the two earliest take (the most work per row)."""
    seg_doc, seg_end, seg_part = segs.doc, segs.end, segs.part
    best, best_peak = None, load[p]
    for q, bs in shared.items():
        gap = load[p] - load[q]
        if gap <= 0 or len(bs) < 2:
            continue
        if (load[p] + load[q]) / 2 > best_peak * (1 + 1e-12):  # no exchange with q ends below the pair's mean
            continue  # (the margin absorbs a peak rounded an ulp below the mean)
        js = sorted([(seg_end[a] - doc_first[seg_doc[a]], a) for a in bs])  # (position in its document, a)
        for pos_g, g in js[-2:]:
            g_left = seg_part[g] == p
            for pos_t, t in js[:2]:
                if pos_g <= pos_t:
                    continue
                t_left = seg_part[t] == q
                x = max(1, round(gap / (2 * (pos_g - pos_t))))
                for xx in (x - 1, x, x + 1):
                    if xx < 1:
                        continue
                    w_g, left_g = _moved(g, g_left, xx, doc_first, segs)
                    w_t, left_t = _moved(t, t_left, xx, doc_first, segs)
                    if left_g < 1 or left_t < 1:
                        continue
                    delta = w_g - w_t
                    peak = max(load[p] - delta, load[q] + delta)
                    if peak < best_peak:
                        best, best_peak = (peak, q, xx, g, t, float(delta)), peak
    return best


def _best_slide(p: int, mine: list[tuple[int, int, bool]], doc_first: list[int], segs: Segments,
                load: list[float], *, tok: list[float], token_cost: float,
                cap_t: float) -> tuple[float, int, int, int, float] | None:
    """The slide over one of ``p``'s boundaries (``mine``, as ``by_part[p]``) that lowers the pair's peak load most:
    ``(new peak, q, x, boundary, work moved)`` or None. ``p`` keeps a row of the segment; ``q`` stays within ``cap_t``
    tokens."""
    seg_doc, seg_start, seg_end = segs.doc, segs.start, segs.end
    best, best_peak = None, load[p]
    nbr = [(load[q], a, q, left) for a, q, left in mine]  # (load, a) sort them: a is unique
    if not nbr or min(nbr)[0] + token_cost >= best_peak:  # the loop below would stop at its first neighbour
        return None
    nbr.sort()
    # lightest first: no slide to q ends below the pair's mean, nor below q's load plus a row's
    for load_q, a, q, left in nbr:
        if (load[p] + load_q) / 2 >= best_peak or load_q + token_cost >= best_peak:
            break
        gap = load[p] - load[q]
        x_max = (seg_end[a] - seg_start[a] if left else seg_end[a + 1] - seg_start[a + 1]) - 1
        if gap <= 0 or x_max < 1:
            continue
        pos = seg_end[a] - doc_first[seg_doc[a]]  # the boundary, in document coordinates
        delta = _slide_delta(pos, left, token_cost)
        x_cap = int(cap_t - tok[q]) if math.isfinite(cap_t) else x_max
        for x in _slide_rows(delta, min(x_max, x_cap), load[p], best_peak, gap):
            d = delta(x)
            peak = max(load[p] - d, load[q] + d)
            if peak < best_peak:
                best, best_peak = (peak, q, x, a, float(d - token_cost * x)), peak
    return best


def _slide_rows(delta: Callable[[int], float], x_max: int, load_p: float, best_peak: float,
                gap: float) -> tuple[int, ...]:
    """The slide lengths :func:`_best_slide` weighs over one boundary, ascending: none if no slide of at most ``x_max``
    rows beats ``best_peak``, ``x_max`` if it moves at most half the ``gap``, else the longest within half the gap and
    one more. ``delta``: the load ``x`` rows move (non-decreasing)."""
    if x_max < 1:
        return ()
    d_max = delta(x_max)  # the longest slide moves the most
    if load_p - d_max >= best_peak:  # no slide ends below the best peak
        return ()
    if d_max <= gap / 2:
        return (x_max,)
    lo = _largest_within(delta, x_max, gap / 2)
    return (lo,) if lo >= x_max else (lo, lo + 1)


def _slide_delta(pos: int, left_gives: bool, token_cost: float) -> Callable[[int], float]:
    """``x -> load moved`` by sliding ``x`` rows across a boundary at document position ``pos``: the rows' pairs
    (``rows_work`` written out: a hot path) plus ``token_cost * x``; ``left_gives``: the rows below ``pos`` move."""
    tri = pos * (pos + 1)
    if left_gives:
        return lambda x: (tri - (pos - x) * (pos - x + 1)) // 2 + token_cost * x
    return lambda x: ((pos + x) * (pos + x + 1) - tri) // 2 + token_cost * x


def _largest_within(delta: Callable[[int], float], x_max: int, limit: float) -> int:
    """The largest ``x`` in ``[1, x_max]`` with ``delta(x) <= limit`` (1 if none) for a non-decreasing ``delta``."""
    lo, hi = 1, x_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if delta(mid) <= limit else (lo, mid - 1)
    return lo
