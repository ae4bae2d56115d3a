"""Token-neutral work refinement of a placement: slide segment boundaries inside split documents.

A greedy placement leaves some attention-work imbalance (the last documents it places are whole and
coarse). Where two parts ``p`` and ``q`` meet at two boundaries of split documents (a dual-chunk
split always gives neighbouring holders one early and one late boundary), ``p`` can hand ``x`` of its
rows at a late position to ``q`` and take ``x`` of ``q``'s rows at an early position: both keep their
token counts, and about ``x * (late - early)`` (query, key) pairs of work move from ``p`` to ``q``
(a row at position ``r`` of its document attends to ``r + 1`` keys).

:func:`refine_work` repeats the best such exchange for the busiest part until it no longer lowers
the maximum. Token counts, segment counts and the set of (part, document) pairs never change, so
the KV a part needs changes by at most the rows moved. Plain Python scalars (it runs per batch,
inside the planning budget).
"""
from __future__ import annotations

from .placement import rows_work


def refine_work(doc_first: list[int], seg_doc: list[int], seg_start: list[int], seg_end: list[int],
                seg_part: list[int], wrk: list[float], max_moves: int) -> int:
    """Lower the largest per-part work by token-neutral boundary exchanges (module docstring).

    Args:
        doc_first: global position of every document's first token (``cu_seqlens[:-1]``).
        seg_doc, seg_start, seg_end, seg_part: the placement's segments (global ``[start, end)``), each
            document's segments consecutive and in position order (as the greedy appends them);
            updated in place.
        wrk: work of every part (pairs), updated in place.
        max_moves: the most exchanges made.

    Returns:
        The number of exchanges made.
    """
    # a boundary is named by its left segment ``a``: segments ``a`` and ``a + 1`` are adjacent rows of
    # one document on different parts (the greedy appends a document's segments together and in order)
    by_part: dict[int, list[int]] = {}
    for a in range(len(seg_doc) - 1):
        if seg_doc[a] == seg_doc[a + 1] and seg_end[a] == seg_start[a + 1] and seg_part[a] != seg_part[a + 1]:
            by_part.setdefault(seg_part[a], []).append(a)
            by_part.setdefault(seg_part[a + 1], []).append(a)
    if not by_part:
        return 0
    moves = 0
    while moves < max_moves:
        p = max(range(len(wrk)), key=wrk.__getitem__)
        best = _best_exchange(p, by_part.get(p, []), doc_first, seg_doc, seg_start, seg_end, seg_part, wrk)
        if best is None:
            return moves
        q, x, give, take, delta = best
        _shift(give, seg_part[give] == p, x, seg_start, seg_end)
        _shift(take, seg_part[take] == q, x, seg_start, seg_end)
        wrk[p] -= delta
        wrk[q] += delta
        moves += 1
    return moves


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


def _best_exchange(p: int, mine: list[int], doc_first: list[int],
                   seg_doc: list[int], seg_start: list[int], seg_end: list[int], seg_part: list[int],
                   wrk: list[float]) -> tuple[int, int, int, int, float] | None:
    """The exchange of ``p`` with one neighbour that lowers ``max(wrk[p], wrk[q])`` the most:
    ``(q, x, give boundary, take boundary, work moved)``, or None. Per neighbour only the two latest
    boundaries are tried for giving and the two earliest for taking (the most work per row moved)."""
    shared: dict[int, list[tuple[int, int]]] = {}  # neighbour -> [(boundary position in its document, a)]
    for a in mine:
        q = seg_part[a + 1] if seg_part[a] == p else seg_part[a]
        shared.setdefault(q, []).append((seg_end[a] - doc_first[seg_doc[a]], a))
    best, best_peak = None, wrk[p]
    for q, js in shared.items():
        gap = wrk[p] - wrk[q]
        if gap <= 0 or len(js) < 2:
            continue
        js.sort()
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
                    peak = max(wrk[p] - delta, wrk[q] + delta)
                    if peak < best_peak:
                        best, best_peak = (q, xx, g, t, float(delta)), peak
    return best
