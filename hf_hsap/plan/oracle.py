"""An offline optimiser of placements under the cost model: what the fast planner is measured against.

Slow on purpose (seconds, not milliseconds): tests and ``benchmarks/sweep.py`` use it to report how far
``placement="auto"`` is from the best placement the cost model can express. :func:`polish` is the same
search from one placement, bounded by a count of moves and of re-priced segments (deterministic, inside the
planning budget): ``auto`` runs it on its winner for small groups.

The objective is :func:`.cost.part_times`' step time of the slowest part (one full-attention layer).
A part's time depends only on its own segments (its tokens, its pairs, the pairs against its own keys
and the keys before its last query of every document it holds that it does not own), so a move that
touches two parts is re-priced on those two alone (:func:`part_time`, checked against
:func:`.cost.part_times` by the tests).

Search: from each start (every simpler placement, and the caller's), repeatedly take the slowest part
and try every move of one of its segments (the 16 with the latest rows), whole or a head / tail of 1/2,
1/4, ..., 1/64 of it, to every
other part within the token cap; make the move that lowers ``max(t_p, t_q)`` the most; stop when none
lowers it (a local optimum) or after ``max_moves``. The best local optimum wins.
"""
from __future__ import annotations

import math
from collections import defaultdict

from .cost import CostModel
from .layout import Layout
from .placement import DEFAULT_TOKEN_SLACK, Placement, _finish

__all__ = ["optimise_placement", "part_time", "polish"]

Seg = tuple[int, int, int]  # (document, start, end) in global positions
SEGMENTS_TRIED = 16  # per move, the slowest part's segments with the latest rows are tried
ZIGZAG_START_SEGMENTS = 4096  # zigzag is a start only up to this many segments (each move scans a part's)


def part_time(segs: list[Seg], doc_start: list[int], cost: CostModel) -> float:
    """The cost model's time of one part holding ``segs`` (one full-attention layer, attention pairs):
    ``token_cost * tokens + max(local, kv_token_cost * recv) + (work - local)``.

    Args:
        segs: the part's segments (any order). doc_start: first global position of every document.
        cost: the cost model.
    """
    by_doc: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for d, a, b in segs:
        by_doc[d].append((a - doc_start[d], b - doc_start[d]))
    tokens = work = local = recv = 0
    for rows in by_doc.values():
        rows.sort()
        own = 0
        for a, b in rows:
            n = b - a
            work += (b * (b + 1) - a * (a + 1)) // 2
            local += n * (n + 1) // 2 + n * own  # own keys: this segment causally, earlier ones in full
            own += n
        tokens += own
        recv += rows[-1][1] - own  # keys up to the last query that the part does not hold
        masked = float(cost.masked_pairs(own)) if cost.diag_block else 0  # its causal piece's diagonal
        work += masked
        local += masked
    return float(cost.time_of(tokens, work, local, recv))


def optimise_placement(layout: Layout, n_parts: int, cost: CostModel, start: Placement | None = None,
                       token_slack: float = DEFAULT_TOKEN_SLACK, max_moves: int = 2000) -> Placement:
    """Local search for the placement with the smallest step time of its slowest part (module docstring),
    from ``start`` and from every simpler placement (``zigzag`` up to 4096 segments, ``balanced``, ``density``, ``contiguous``):
    the best of the local optima.

    Args:
        layout: the documents. n_parts: parts P. cost: the cost model (priced as the plan's).
        start: a placement to start from as well (e.g. ``auto``'s).
        token_slack: no part holds more than ``ceil(T/P) * (1 + token_slack)`` tokens.
        max_moves: the most moves made from each start.

    Returns:
        The best placement found (name ``"oracle"``); never slower than any start by the cost model.
    """
    from .balanced import balanced
    from .density import density
    from .placement import contiguous, zigzag

    starts = [zigzag(layout, n_parts)] if 2 * n_parts * layout.n_docs <= ZIGZAG_START_SEGMENTS else []
    starts += [balanced(layout, n_parts, token_slack),
              density(layout, n_parts, cost.token_cost, token_slack),
              density(layout, n_parts, cost.token_cost, token_slack, spread="all"), contiguous(layout, n_parts)]
    starts += [start] if start is not None else []
    found = [_descend(layout, n_parts, cost, s, token_slack, max_moves) for s in starts]
    return min(found, key=lambda f: f[0])[1]


def polish(layout: Layout, n_parts: int, cost: CostModel, start: Placement, token_slack: float = DEFAULT_TOKEN_SLACK,
           max_moves: int = 30, max_rows: int = 20000) -> tuple[float, Placement]:
    """A bounded local search from one placement (the same moves as :func:`optimise_placement`): what
    ``placement="auto"`` runs on its winner for small groups, inside the planning budget.

    Deterministic (every rank must find the same plan): it stops after ``max_moves`` moves or once its
    re-pricings have read ``max_rows`` segments in all, never by a clock.

    Args:
        layout, n_parts, cost, token_slack: as :func:`optimise_placement`. start: the placement to improve.
        max_moves: the most moves. max_rows: the most segments read by :func:`part_time` in all.

    Returns:
        ``(time of the slowest part, placement)``; the placement is ``start``'s segments moved (name
        ``"oracle"``), never slower than ``start`` by the cost model.
    """
    return _descend(layout, n_parts, cost, start, token_slack, max_moves, max_rows)


def _descend(layout: Layout, n_parts: int, cost: CostModel, start: Placement, token_slack: float,
             max_moves: int, max_rows: float = math.inf) -> tuple[float, Placement]:
    """The local search from one start: (time of the slowest part, placement); it stops at a local optimum,
    after ``max_moves`` moves or once the re-pricings have read ``max_rows`` segments."""
    P = n_parts
    doc_start = layout.cu_seqlens[:-1].tolist()
    cap = math.ceil(layout.total_tokens / P) * (1.0 + token_slack)
    parts: list[list[Seg]] = [[] for _ in range(P)]
    for d, a, b, p in zip(start.doc.tolist(), start.start.tolist(), start.end.tolist(), start.part.tolist()):
        parts[p].append((d, a, b))
    times = [part_time(s, doc_start, cost) for s in parts]
    tokens = [sum(b - a for _, a, b in s) for s in parts]
    read = 0  # segments re-priced so far (the deterministic work bound)
    for _ in range(max_moves):
        if read >= max_rows:
            break
        p = max(range(P), key=times.__getitem__)
        best = None  # (new max of the two, q, new segments of p, new segments of q, their times, tokens moved)
        for i, moved, kept, x in _moves(parts[p], doc_start):
            if read >= max_rows:
                break
            new_p = parts[p][:i] + parts[p][i + 1:] + ([kept] if kept is not None else [])
            t_p = part_time(new_p, doc_start, cost)
            read += len(new_p)
            if t_p >= times[p]:
                continue
            for q in range(P):
                if q == p or tokens[q] + x > cap:
                    continue
                new_q = parts[q] + [moved]
                t_q = part_time(new_q, doc_start, cost)
                read += len(new_q)
                peak = max(t_p, t_q)
                if peak < times[p] and (best is None or peak < best[0]):
                    best = (peak, q, new_p, new_q, t_p, t_q, x)
        if best is None:
            break
        _, q, new_p, new_q, t_p, t_q, x = best
        parts[p], parts[q] = _merge(new_p), _merge(new_q)
        times[p], times[q] = t_p, t_q
        tokens[p] -= x
        tokens[q] += x
    seg = [(d, a, b, p) for p, s in enumerate(parts) for d, a, b in s]
    return max(times), _finish("oracle", P, *zip(*seg))


def _moves(mine: list[Seg], doc_start: list[int]):
    """The moves tried from a part: ``(index, moved segment, kept segment or None, tokens moved)`` for its
    :data:`SEGMENTS_TRIED` segments with the latest rows (the most work per row) first, each whole or a head /
    tail of 1/2 ... 1/64 of it."""
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
