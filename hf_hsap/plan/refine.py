"""Work refinement of a placement: move segment boundaries inside split documents.

A greedy placement leaves some attention-work imbalance (the last documents it places are whole and
coarse). Where two parts ``p`` and ``q`` meet at two boundaries of split documents (a dual-chunk
split always gives neighbouring holders one early and one late boundary), ``p`` can hand ``x`` of its
rows at a late position to ``q`` and take ``x`` of ``q``'s rows at an early position: both keep their
token counts, and about ``x * (late - early)`` (query, key) pairs of work move from ``p`` to ``q``
(a row at position ``r`` of its document attends to ``r + 1`` keys).

:func:`refine_work` repeats the best move for the busiest part until it no longer lowers the
maximum. Exchanges keep token counts; neither move changes segment counts or the set of (part,
document) pairs, so the KV a part needs changes by at most the rows moved. Plain Python scalars (it
runs per batch, inside the planning budget).

Priced by a cost model (``tok`` and ``token_cost`` given), a part may also *slide* one boundary: it
hands ``x`` rows to the neighbour on the other side, which has free tokens under the cap. Its load
``work + token_cost * tokens`` drops by ``x * token_cost`` plus the rows' work. This reaches parts
that share only one boundary and trades a little token balance for work balance where attention
dominates the step (long rows). The set of (part, document) pairs still never changes.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .placement import rows_work

Sides = tuple[list[list[tuple[int, int, bool]]], dict[int, dict[int, list[int]]]]  # what boundary_sides returns


def refine_work(doc_first: list[int], seg_doc: list[int], seg_start: list[int], seg_end: list[int],
                seg_part: list[int], wrk: list[float], max_moves: int, tok: list[float] | None = None,
                token_cost: float = 0.0, cap_t: float = math.inf, bounds: list[int] | None = None) -> int:
    """Lower the largest per-part load by boundary exchanges and slides (module docstring).

    Args:
        doc_first: global position of every document's first token (``cu_seqlens[:-1]``).
        seg_doc, seg_start, seg_end, seg_part: the placement's segments (global ``[start, end)``), each
            document's segments consecutive and in position order (as the greedy appends them);
            updated in place.
        wrk: work of every part (pairs), updated in place.
        max_moves: the most moves made.
        tok: tokens of every part, updated in place; ``None``: token-neutral exchanges only, the load is
            the work.
        token_cost: price of one token in pairs (the load is ``work + token_cost * tokens``).
        cap_t: no slide takes a part above this many tokens.
        bounds: :func:`boundaries` of the segments as given, if known (moves never add or remove one).

    Returns:
        The number of moves made.
    """
    return refine_moves(doc_first, seg_doc, seg_start, seg_end, seg_part, wrk, max_moves, tok, token_cost, cap_t,
                        bounds)[0]


def refine_moves(doc_first: list[int], seg_doc: list[int], seg_start: list[int], seg_end: list[int],
                 seg_part: list[int], wrk: list[float], max_moves: int, tok: list[float] | None = None,
                 token_cost: float = 0.0, cap_t: float = math.inf,
                 bounds: list[int] | None = None, extra: list[float] | None = None,
                 sides: Sides | None = None) -> tuple[int, bool]:
    """:func:`refine_work`, and whether ``cap_t`` shortened a slide it weighed; when not, the same refinement
    at any larger cap makes the same moves.

    Args:
        As :func:`refine_work`, and ``extra``: a fixed offset of every part's load (pairs; None: 0), what a
            move does not change (:mod:`.exposure`: each part's exposed transfer). sides: :func:`boundary_sides`
            of ``bounds``, if known (every refinement of one greedy pass reads the same).

    Returns:
        ``(moves made, whether the cap shortened a slide)``.
    """
    bounds = boundaries(seg_doc, seg_start, seg_end, seg_part) if bounds is None else bounds
    if not bounds:
        return 0, False
    by_part, by_nbr = boundary_sides(bounds, seg_part, len(wrk)) if sides is None else sides
    capped = False
    tokens = tok if tok is not None else [0.0] * len(wrk)  # token-neutral: the load is the work
    extra = extra if extra is not None else [0.0] * len(wrk)
    load = [w + token_cost * t + e for w, t, e in zip(wrk, tokens, extra)]
    moves = 0
    while moves < max_moves:
        p = load.index(max(load))  # the busiest part (the first of equals)
        mine = by_part[p]
        if p not in by_nbr:
            by_nbr[p] = {}
            for a, q, _ in mine:  # neighbours in the order of their first boundary
                by_nbr[p].setdefault(q, []).append(a)
        exchange = _best_exchange(p, by_nbr[p], doc_first, seg_doc, seg_start, seg_end, seg_part, load)
        slide = None
        if tok is not None:
            slide, short = _best_slide(p, mine, doc_first, seg_doc, seg_start, seg_end, load, tok, token_cost,
                                       cap_t)
            capped = capped or short
        if slide is not None and (exchange is None or slide[0] < exchange[0]):
            _, q, x, a, work = slide
            _shift(a, seg_part[a] == p, x, seg_start, seg_end)
            tokens[p] -= x
            tokens[q] += x
        elif exchange is not None:
            _, q, x, give, take, work = exchange
            _shift(give, seg_part[give] == p, x, seg_start, seg_end)
            _shift(take, seg_part[take] == q, x, seg_start, seg_end)
        else:
            return moves, capped
        wrk[p] -= work
        wrk[q] += work
        for i in (p, q):
            load[i] = wrk[i] + token_cost * tokens[i] + extra[i]
        moves += 1
    return moves, capped


def boundaries(seg_doc: list[int], seg_start: list[int], seg_end: list[int], seg_part: list[int]) -> list[int]:
    """The boundaries a refinement may move, each named by its left segment ``a``: segments ``a`` and
    ``a + 1`` are adjacent rows of one document on different parts (the greedy appends a document's
    segments together and in order).

    Args:
        seg_doc, seg_start, seg_end, seg_part: the segments, as :func:`refine_work` takes them.

    Returns:
        The ``a`` of every boundary, ascending.
    """
    return [a for a in range(len(seg_doc) - 1)
            if seg_doc[a] == seg_doc[a + 1] and seg_end[a] == seg_start[a + 1] and seg_part[a] != seg_part[a + 1]]


def array_boundaries(seg_doc: np.ndarray, seg_start: np.ndarray, seg_end: np.ndarray,
                     seg_part: np.ndarray) -> list[int]:
    """:func:`boundaries` of segments held as ``[n]`` int64 arrays (a placement's, sorted by start), in numpy.

    Returns:
        The ``a`` of every boundary, ascending.
    """
    same = (seg_doc[1:] == seg_doc[:-1]) & (seg_end[:-1] == seg_start[1:]) & (seg_part[1:] != seg_part[:-1])
    return np.flatnonzero(same).tolist()


def boundary_sides(bounds: list[int], seg_part: list[int], n_parts: int) -> Sides:
    """Every part's boundaries, as a refinement reads them: moves never change a segment's part, so neither
    changes while the segments are refined (one greedy pass's refinements share them).

    Args:
        bounds: :func:`boundaries` of the segments. seg_part: the segments' parts. n_parts: P.

    Returns:
        ``(by_part, by_nbr)``: ``by_part[p]``, the ``(a, neighbour across it, whether p holds the left
        segment)`` of every boundary of part ``p``, ascending; ``by_nbr``, a part's boundaries by neighbour, in
        the order of their first boundary, filled by :func:`refine_moves` for a part when it is first the busiest.
    """
    by_part: list[list[tuple[int, int, bool]]] = [[] for _ in range(n_parts)]
    for a in bounds:
        left, right = seg_part[a], seg_part[a + 1]
        by_part[left].append((a, right, True))
        by_part[right].append((a, left, False))
    return by_part, {}


def refine_floor(seg_part: list[int], bounds: list[int], load: list[float]) -> float:
    """A lower bound of the largest load any refinement of these segments can reach: every move hands load
    between two parts that share a boundary and keeps their sum, so the parts joined by boundaries (a
    connected group) keep their total, and the busiest part of a group holds at least its mean.

    Args:
        seg_part: the segments' parts. bounds: their :func:`boundaries`.
        load: ``work + token_cost * tokens`` of every part (any ``token_cost``: moves keep the sum of either).

    Returns:
        The largest mean load of a connected group of parts (a part without boundaries is one alone).
    """
    comp = list(range(len(load)))  # every part's group; a merge relabels the smaller group (at most P - 1 merges)
    members = [[p] for p in range(len(load))]
    for a in bounds:
        x, y = comp[seg_part[a]], comp[seg_part[a + 1]]
        if x != y:
            if len(members[x]) < len(members[y]):
                x, y = y, x
            for p in members[y]:
                comp[p] = x
            members[x] += members[y]
            members[y] = []
            if len(members[x]) == len(load):  # one group holds every part: the rest joins nothing new
                break
    return max(sum([load[p] for p in m]) / len(m) for m in members if m)


def _shift(a: int, left_gives: bool, x: int, seg_start: list[int], seg_end: list[int]) -> None:
    """Move ``x`` rows across boundary ``a``: from the left segment to the right one, or back."""
    d = -x if left_gives else x
    seg_end[a] += d
    seg_start[a + 1] += d


def _moved(a: int, left_gives: bool, x: int, doc_first: list[int], seg_doc: list[int],
           seg_start: list[int], seg_end: list[int]) -> tuple[int, int]:
    """Work of the ``x`` rows that would cross boundary ``a``, and the rows left in the giving segment."""
    pos = seg_end[a] - doc_first[seg_doc[a]]  # the boundary, in document coordinates
    if left_gives:
        return rows_work(pos - x, pos), seg_end[a] - seg_start[a] - x
    return rows_work(pos, pos + x), seg_end[a + 1] - seg_start[a + 1] - x


def _best_exchange(p: int, shared: dict[int, list[int]], doc_first: list[int],
                   seg_doc: list[int], seg_start: list[int], seg_end: list[int], seg_part: list[int],
                   load: list[float]) -> tuple[float, int, int, int, int, float] | None:
    """The exchange of ``p`` with one neighbour that lowers ``max(load[p], load[q])`` the most:
    ``(new peak, q, x, give boundary, take boundary, work moved)``, or None. ``shared``: ``p``'s boundaries by
    neighbour (neighbours in the order of their first boundary, each's ascending). Per neighbour only the two
    latest boundaries are tried for giving and the two earliest for taking (the most work per row moved)."""
    best, best_peak = None, load[p]
    for q, bs in shared.items():
        gap = load[p] - load[q]
        if gap <= 0 or len(bs) < 2:
            continue
        if (load[p] + load[q]) / 2 > best_peak * (1 + 1e-12):  # no exchange with q ends below the pair's mean
            continue  # (the margin: a peak rounded below the mean by an ulp still never beats best_peak)
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
                    w_g, left_g = _moved(g, g_left, xx, doc_first, seg_doc, seg_start, seg_end)
                    w_t, left_t = _moved(t, t_left, xx, doc_first, seg_doc, seg_start, seg_end)
                    if left_g < 1 or left_t < 1:
                        continue
                    delta = w_g - w_t
                    peak = max(load[p] - delta, load[q] + delta)
                    if peak < best_peak:
                        best, best_peak = (peak, q, xx, g, t, float(delta)), peak
    return best


def _best_slide(p: int, mine: list[tuple[int, int, bool]], doc_first: list[int], seg_doc: list[int],
                seg_start: list[int], seg_end: list[int], load: list[float], tok: list[float],
                token_cost: float, cap_t: float) -> tuple[tuple[float, int, int, int, float] | None, bool]:
    """The slide of one of ``p``'s boundaries that lowers ``max(load[p], load[q])`` the most:
    ``(new peak, q, x, boundary, work moved)``, or None; and whether ``cap_t`` shortened one it weighed.
    ``mine``: ``p``'s boundaries ``(a, neighbour, whether p holds the left segment)``. ``p`` keeps at least one
    row of the segment and ``q`` stays within ``cap_t`` tokens."""
    best, best_peak = None, load[p]
    capped = False
    nbr = [(load[q], a, q, left) for a, q, left in mine]  # (load, a) sort them: a is unique
    if not nbr or min(nbr)[0] + token_cost >= best_peak:  # the loop below would stop at its first neighbour
        return None, False
    nbr.sort()
    # lightest neighbours first: no slide to q ends below (load[p] + load[q]) / 2, nor below q's load plus a row's
    # (a row costs its token and >= 0 pairs; neither test depends on cap_t: capped keeps its meaning)
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

        def estimate() -> float:
            return _slide_estimate(pos, left, token_cost, gap / 2)

        xs = _slide_rows(delta, min(x_max, x_cap), load[p], best_peak, gap, estimate)
        if x_cap < x_max:  # the cap shortened the slide: did it change what is weighed?
            capped = capped or _slide_rows(delta, x_max, load[p], best_peak, gap, estimate) != xs
        if not xs:
            continue
        for x in xs:
            d = delta(x)
            peak = max(load[p] - d, load[q] + d)
            if peak < best_peak:
                best, best_peak = (peak, q, x, a, float(d - token_cost * x)), peak
    return best, capped


def _slide_rows(delta: Callable[[int], float], x_max: int, load_p: float, best_peak: float, gap: float,
                estimate: Callable[[], float]) -> tuple[int, ...]:
    """The slide lengths :func:`_best_slide` weighs over one boundary: none when no slide of at most ``x_max``
    rows takes ``load_p`` below ``best_peak``, the longest when it stays within half the ``gap``
    (what :func:`_largest_within` would return), else the longest within half the gap and one row more.
    What decides whether a token cap changed the outcome: a refinement whose weighed slides are the same
    below and above the cap makes the same moves at any larger cap.

    Args:
        delta: the load moved by ``x`` rows (non-decreasing). x_max: the most rows (< 1: none). load_p: the
            busiest part's load. best_peak: the best peak so far. gap: the two parts' load difference.
        estimate: a guess of the longest slide within half the gap (called only when needed).

    Returns:
        The lengths, ascending, without repeats.
    """
    if x_max < 1:
        return ()
    d_max = delta(x_max)  # the longest slide (delta increases with x: no other moves more)
    if load_p - d_max >= best_peak:  # no slide ends below the best peak
        return ()
    if d_max <= gap / 2:
        return (x_max,)
    lo = _largest_within(delta, x_max, gap / 2, estimate())
    return (lo,) if lo >= x_max else (lo, lo + 1)


def _slide_delta(pos: int, left_gives: bool, token_cost: float) -> Callable[[int], float]:
    """The load moved by sliding ``x`` rows across a boundary at document position ``pos`` (increases with
    ``x``): the rows' pairs (:func:`_moved`'s ``rows_work``, written out: it runs a few times per neighbour
    of every move) plus ``token_cost * x``.

    Args:
        pos: the boundary, in document coordinates. left_gives: the rows below ``pos`` move (else those from
            ``pos`` on). token_cost: a token's price in pairs.

    Returns:
        ``x -> load moved``.
    """
    tri = pos * (pos + 1)
    if left_gives:
        return lambda x: (tri - (pos - x) * (pos - x + 1)) // 2 + token_cost * x
    return lambda x: ((pos + x) * (pos + x + 1) - tri) // 2 + token_cost * x


def _slide_estimate(pos: int, left_gives: bool, token_cost: float, limit: float) -> float:
    """Where the load moved by sliding ``x`` rows across a boundary at document position ``pos`` reaches
    ``limit``, by the quadratic formula: ``pos x - x (x - 1) / 2`` pairs (rows below ``pos`` given) or
    ``pos x + x (x + 1) / 2`` (rows from ``pos`` on), plus ``token_cost x``. A starting point only: the
    rounding of floats makes it off by a row or so (:func:`_largest_within` settles it)."""
    c = pos + 0.5 + token_cost
    disc = c * c - 2 * limit if left_gives else c * c + 2 * limit
    if disc < 0:  # the left rows never move that much (x <= pos < c: the quadratic grows all the way)
        return math.inf
    return 2 * limit / (c + math.sqrt(disc))  # the smaller root, written so that it keeps its digits


def _largest_within(delta, x_max: int, limit: float, estimate: float) -> int:
    """The largest ``x`` in ``[1, x_max]`` with ``delta(x) <= limit``, or 1 when there is none, for a
    ``delta`` that never decreases: what a binary search over ``[1, x_max]`` returns, found by stepping a few
    rows from ``estimate`` (two or three calls of ``delta`` instead of ``log2(x_max)``), by the binary search
    when the estimate is further off.

    Args:
        delta: the non-decreasing function of ``x``. x_max: the largest ``x``. limit: the bound.
        estimate: a guess of the answer (any float; clamped to ``[1, x_max]``).

    Returns:
        The ``x``.
    """
    x = int(min(max(estimate, 1.0), float(x_max)))
    for _ in range(4):
        if x < x_max and delta(x + 1) <= limit:
            x += 1
        elif x > 1 and delta(x) > limit:
            x -= 1
        else:
            return x
    lo, hi = 1, x_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if delta(mid) <= limit else (lo, mid - 1)
    return lo
