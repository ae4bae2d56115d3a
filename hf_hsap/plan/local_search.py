"""A bounded local search of placements under the cost model (:func:`polish`): the ``auto`` search (:mod:`.auto`) runs
it on its best placement for small groups, ``benchmarks.analytic.placement_search.optimise_placement``
unbounded, offline.

The objective is the time of the slowest part (:func:`.cost.part_times`, one full-attention layer). A part's time
is a sum over its documents of terms that depend only on its own segments, so a move re-prices the one document it
touches on the two parts it touches (:class:`_Part`). A move takes one of the slowest part's segments (those with
the latest rows), whole or a head / tail of 1/2 ... 1/64 of it, to another part within the token cap; the search
makes the move that lowers ``max(t_p, t_q)`` the most, until none does.
"""
from __future__ import annotations

import math
from collections import defaultdict

from .cost import CostModel
from .layout import Layout
from .placement import DEFAULT_TOKEN_SLACK, Placement, _finish

__all__ = ["part_time", "polish"]

Seg = tuple[int, int, int]  # (document, start, end) in global positions
SEGMENTS_TRIED = 16  # per move, the slowest part's segments with the latest rows are tried


def _doc_terms(rows: list[tuple[int, int]], cost: CostModel) -> tuple[float, float, float, float]:
    """One document's share of a part's time: ``(tokens, work, local, recv)`` of the part's rows of it
    (document-relative ``[a, b)``, any order). Every term is an integer or a half (exact in float64), so a part's
    sums do not depend on their order, which lets the search re-price one document at a time."""
    if len(rows) == 1:  # one segment (the search's commonest case): the loop's terms at once
        a, b = rows[0]
        n = b - a
        masked = float(cost.masked_pairs(n)) if cost.diag_block else 0.0
        return n, (b * (b + 1) - a * (a + 1)) // 2 + masked, n * (n + 1) // 2 + masked, b - n
    tokens = work = local = 0
    last = 0
    for a, b in sorted(rows):
        n = b - a
        work += (b * (b + 1) - a * (a + 1)) // 2
        local += n * (n + 1) // 2 + n * tokens  # own keys: this segment causally, earlier ones in full
        tokens += n
        last = b
    masked = float(cost.masked_pairs(tokens)) if cost.diag_block else 0.0  # its causal piece's diagonal
    return tokens, work + masked, local + masked, last - tokens  # recv: keys up to the last query it does not hold


def _time(terms: list[float], cost: CostModel) -> float:
    """A part's time from its summed ``(tokens, work, local, recv)``."""
    return float(cost.time_of(*terms))


def part_time(segs: list[Seg], doc_start: list[int], cost: CostModel) -> float:
    """The cost model's time of one part holding ``segs`` (any order), from scratch: ``token_cost * tokens +
    max(local, kv_token_cost * recv) + (work - local)``. ``doc_start``: first global position of every document."""
    return _Part(segs, doc_start, cost).time


class _Part:
    """One part of the search: its segments, each document's rows and terms (:func:`_doc_terms`) and their sums,
    so that a move re-prices only the document it touches."""

    def __init__(self, segs: list[Seg], doc_start: list[int], cost: CostModel) -> None:
        self.segs = segs
        self.rows: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for d, a, b in segs:
            self.rows[d].append((a - doc_start[d], b - doc_start[d]))
        self.terms = {d: _doc_terms(r, cost) for d, r in self.rows.items()}
        self.total = [sum(t[j] for t in self.terms.values()) for j in range(4)]
        self.tokens = int(self.total[0])
        self.time = _time(self.total, cost)

    def time_with(self, d: int, drop: tuple[int, int] | None, add: tuple[int, int] | None, cost: CostModel) -> float:
        """The part's time with document ``d``'s rows ``drop`` removed and ``add`` added (relative ``[a, b)``).
        Written out: the search's inner loop."""
        have = self.rows.get(d)
        rows = [] if not have else [r for r in have if r != drop] if drop is not None else list(have)
        if add is not None:
            rows.append(add)
        tok, wrk, loc, rcv = new = _doc_terms(rows, cost) if rows else (0, 0.0, 0.0, 0)
        old = self.terms.get(d)
        if old is None:  # the same float64 sums as subtracting zero terms first
            return self.time_plus(new, cost)
        total = self.total
        return float(cost.time_of(total[0] - old[0] + tok, total[1] - old[1] + wrk, total[2] - old[2] + loc,
                                  total[3] - old[3] + rcv))

    def time_plus(self, terms: tuple[float, float, float, float], cost: CostModel) -> float:
        """The part's time with a document it does not hold added: ``terms`` its :func:`_doc_terms`."""
        total = self.total
        return float(cost.time_of(total[0] + terms[0], total[1] + terms[1], total[2] + terms[2], total[3] + terms[3]))


def polish(layout: Layout, n_parts: int, cost: CostModel, start: Placement, *,
           token_slack: float = DEFAULT_TOKEN_SLACK, max_moves: int = 30,
           max_rows: int = 20000) -> tuple[float, Placement]:
    """The local search (module docstring) from ``start``. Deterministic, as every rank must find the same plan:
    it stops at a local optimum, after ``max_moves`` moves or once its re-pricings have read ``max_rows`` segments
    (a whole part's segments per re-pricing), never by a clock. Moves that cannot bring the peak below the best so
    far are not priced.

    Args:
        layout: the documents. n_parts: parts P. cost: the cost model. start: the placement to improve.
        token_slack: no part holds more than ``ceil(T/P) * (1 + token_slack)`` tokens.
        max_moves, max_rows: the bounds above.

    Returns:
        ``(time of the slowest part, placement)``: ``start``'s segments moved (name ``"oracle"``), never slower
        than ``start`` by the cost model.
    """
    P = n_parts
    doc_start = layout.cu_seqlens[:-1].tolist()
    cap = math.ceil(layout.total_tokens / P) * (1.0 + token_slack)
    segs: list[list[Seg]] = [[] for _ in range(P)]
    for d, a, b, p in zip(start.doc.tolist(), start.start.tolist(), start.end.tolist(), start.part.tolist()):
        segs[p].append((d, a, b))
    parts = [_Part(s, doc_start, cost) for s in segs]
    read = 0  # segments re-priced so far (the deterministic work bound)
    for _ in range(max_moves):
        if read >= max_rows:
            break
        p = max(range(P), key=lambda i: parts[i].time)
        mine = parts[p]
        best = None  # (new max of the two, q, index of the moved segment, moved segment, kept segment)
        for i, moved, kept, x in _moves(mine.segs, doc_start):
            if read >= max_rows:
                break
            d, o = moved[0], doc_start[moved[0]]
            _, a, b = mine.segs[i]
            t_p = mine.time_with(d, (a - o, b - o), None if kept is None else (kept[1] - o, kept[2] - o), cost)
            read += len(mine.segs) - (kept is None)
            bar = mine.time if best is None else min(mine.time, best[0])  # a move must bring the peak below
            if t_p >= bar:
                continue
            add = (moved[1] - o, moved[2] - o)
            alone = None  # the moved rows' terms: what a part without document d gains (the same for every one)
            for q in range(P):
                if q == p or parts[q].tokens + x > cap:
                    continue
                if d in parts[q].rows:
                    t_q = parts[q].time_with(d, None, add, cost)
                elif parts[q].time >= bar:
                    continue  # rows of a document it does not hold add to all four terms: t_q >= its time now
                else:
                    alone = alone or _doc_terms([add], cost)
                    t_q = parts[q].time_plus(alone, cost)
                read += len(parts[q].segs) + 1
                peak = max(t_p, t_q)
                if peak < mine.time and (best is None or peak < best[0]):
                    best = (peak, q, i, moved, kept)
        if best is None:
            break
        _, q, i, moved, kept = best
        new_p = mine.segs[:i] + mine.segs[i + 1:] + ([kept] if kept is not None else [])
        parts[p] = _Part(_merge(new_p), doc_start, cost)
        parts[q] = _Part(_merge(parts[q].segs + [moved]), doc_start, cost)
    seg = [(d, a, b, p) for p, part in enumerate(parts) for d, a, b in part.segs]
    return max(part.time for part in parts), _finish("oracle", P, *zip(*seg))


def _moves(mine: list[Seg], doc_start: list[int]):
    """The moves tried from a part: ``(index, moved segment, kept segment or None, tokens moved)`` for its
    :data:`SEGMENTS_TRIED` segments with the latest rows (the most work per row), whole or a head / tail."""
    tries = sorted(range(len(mine)), key=lambda i: -(mine[i][2] - doc_start[mine[i][0]]))[:SEGMENTS_TRIED]
    for i in tries:
        d, a, b = mine[i]
        n = b - a
        for x in sorted({n, n // 2, n // 4, n // 8, n // 16, n // 32, n // 64} - {0}, reverse=True):
            if x == n:  # moving the whole segment: head and tail are the same move
                yield i, (d, a, b), None, n
                continue
            yield i, (d, a, a + x), (d, a + x, b), x
            yield i, (d, b - x, b), (d, a, b - x), x


def _merge(segs: list[Seg]) -> list[Seg]:
    """Adjacent segments of one document on one part as one segment (the part's time is unchanged)."""
    out: list[Seg] = []
    for d, a, b in sorted(segs):
        if out and out[-1][0] == d and out[-1][2] == a:
            out[-1] = (d, out[-1][1], b)
        else:
            out.append((d, a, b))
    return out
