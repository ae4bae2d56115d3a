"""The ``balanced`` placement: document-aware packing of documents onto parts.

Short documents stay whole on one part (no transfer at all); a long document is cut into ``2k``
chunks over ``k`` parts (chunk ``i`` and ``2k-1-i`` on the i-th of them, which gives each of the k
parts the same attention work), with ``k`` as small as keeps every part within its token cap
(activation memory) and its work cap (time). Documents are placed longest first onto the parts with
the lowest load, like LPT scheduling for two resources.

Caps: tokens ``ceil(T/P) * (1 + token_slack)``, work ``mean_work * (1 + work_slack)``. When a document
fits nowhere within both caps it is cut contiguously over the parts with the most free tokens
(the token cap is never exceeded; only the work cap may be).
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from .layout import Layout
from .placement import (DEFAULT_TOKEN_SLACK, DEFAULT_WORK_SLACK, Placement, _finish, _zigzag_chunks,
                        _zigzag_segments)


def _pair_work(sizes: np.ndarray) -> np.ndarray:
    """Work of each chunk pair of one dual-chunk split. ``sizes [2k] -> [k]``."""
    offs = np.cumsum(sizes) - sizes
    b = offs + sizes
    w = (b * (b + 1) - offs * (offs + 1)) // 2  # [2k]
    k = sizes.shape[0] // 2
    return w[:k] + w[::-1][:k]


def balanced(layout: Layout, n_parts: int, token_slack: float = DEFAULT_TOKEN_SLACK,
             work_slack: float = DEFAULT_WORK_SLACK) -> Placement:
    """Document-aware placement (see module docstring).

    Args:
        layout: the documents.
        n_parts: number of parts P.
        token_slack: epsilon of the token cap ``ceil(T/P) * (1 + eps)``.
        work_slack: slack of the work cap over the mean.

    Returns:
        The placement.
    """
    lengths = layout.doc_lengths
    starts = layout.cu_seqlens[:-1]
    T = layout.total_tokens
    P = n_parts
    cap_t = math.ceil(T / P) * (1.0 + token_slack)
    work = lengths * (lengths + 1) // 2
    cap_w = float(work.sum()) / P * (1.0 + work_slack)
    tok = [0.0] * P  # python lists: P <= a few hundred, faster than numpy for scalar updates
    wrk = [0.0] * P
    seg_doc: list[int] = []
    seg_start: list[int] = []
    seg_end: list[int] = []
    seg_part: list[int] = []
    rot = 0
    heap = [(0.0, p) for p in range(P)]  # (score, part): least loaded part first, ties by index
    mean_t = T / P
    rem_t, rem_w = float(T), float(work.sum())  # not yet placed
    recv = [0] * P  # KV tokens each part will receive (from split documents)

    def score(p: int) -> float:
        return max(tok[p] / cap_t, wrk[p] / cap_w)

    def fits(p: int, t: float, w: float, rho: float) -> bool:
        """Within both caps, and (rho > 0) still within the work cap once the part is filled up to the
        mean token count with the remaining documents' average work per token ``rho``."""
        if tok[p] + t > cap_t or wrk[p] + w > cap_w:
            return False
        return wrk[p] + w + rho * max(0.0, mean_t - tok[p] - t) <= cap_w

    for d in np.argsort(-lengths, kind="stable").tolist():
        L, w, s0 = int(lengths[d]), float(work[d]), int(starts[d])
        rem_t -= L
        rem_w -= w
        rho = 0.5 * rem_w / rem_t if rem_t > 0 else 0.0
        k0 = max(1, math.ceil(L / cap_t), math.ceil(w / cap_w))
        if k0 == 1:  # fast path: the least loaded part takes the document whole
            best = heap[0][1]
            if fits(best, L, w, rho):
                seg_doc.append(d), seg_start.append(s0), seg_end.append(s0 + L), seg_part.append(best)
                tok[best] += L
                wrk[best] += w
                heapq.heapreplace(heap, (score(best), best))
                continue
        order = sorted(range(P), key=lambda p: (score(p), p))
        chosen = _choose_parts(order, L, w, k0, P, lambda p, t, x: fits(p, t, x, rho)) or \
            _choose_parts(order, L, w, k0, P, lambda p, t, x: fits(p, t, x, 0.0)) or \
            _choose_parts(order, L, w, k0, P, lambda p, t, x: tok[p] + t <= cap_t)  # equal work shares
        if chosen is None:
            _fill_by_headroom(d, s0, L, cap_t, tok, wrk, seg_doc, seg_start, seg_end, seg_part)
        elif len(chosen) == 1:
            p = chosen[0]
            seg_doc.append(d), seg_start.append(s0), seg_end.append(s0 + L), seg_part.append(p)
            tok[p] += L
            wrk[p] += w
        else:
            k = len(chosen)
            sizes, rot = _zigzag_chunks(np.array([L]), k, rot)
            # the pair that needs the most KV goes to the part that receives the least so far
            need = _pair_recv(sizes[0])
            chosen = [p for _, p in sorted(zip([recv[p] for p in chosen], chosen))]
            by_need = np.argsort(-need, kind="stable")
            mapped = [0] * k
            for part_pos, pair in enumerate(by_need.tolist()):
                mapped[pair] = chosen[part_pos]
            chosen = mapped
            for p, n in zip(chosen, need.tolist()):
                recv[p] += n
            dd, ss, ee, pp = _zigzag_segments(np.array([d]), np.array([s0]), sizes, np.array([chosen], dtype=np.int64))
            seg_doc += dd.tolist(); seg_start += ss.tolist(); seg_end += ee.tolist(); seg_part += pp.tolist()
            for p, t_add, w_add in zip(chosen, sizes[0, :k] + sizes[0, ::-1][:k], _pair_work(sizes[0])):
                tok[p] += float(t_add)
                wrk[p] += float(w_add)
        heap = [(score(p), p) for p in range(P)]
        heapq.heapify(heap)
    return _finish("balanced", P, seg_doc, seg_start, seg_end, seg_part)


def _pair_recv(sizes: np.ndarray) -> np.ndarray:
    """KV tokens the holder of each chunk pair needs. ``sizes [2k] -> [k]``: everything before the end of
    its second chunk except its own two chunks."""
    k = sizes.shape[0] // 2
    ends = np.cumsum(sizes)
    own = sizes[:k] + sizes[::-1][:k]
    return ends[::-1][:k] - own


def _choose_parts(order: list[int], L: int, w: float, k0: int, P: int, fits) -> list[int] | None:
    """The fewest least-loaded parts (k >= k0) that can each take a 1/k share, or None.
    A document that needs most parts anyway goes to all of them (no idle part, best balance)."""
    k_first = P if 2 * k0 > P else k0
    for k in range(k_first, min(P, L) + 1):
        chosen = [p for p in order if fits(p, L / k, w / k)][:k]
        if len(chosen) == k:
            return chosen
    return None


def _fill_by_headroom(d: int, s0: int, L: int, cap_t: float, tok: list, wrk: list,
                      seg_doc: list, seg_start: list, seg_end: list, seg_part: list) -> None:
    """Cut a document contiguously over the parts with the most free tokens (fallback; rare: only
    when the token caps leave no room for equal shares)."""
    free = sorted(range(len(tok)), key=lambda p: tok[p] - cap_t)
    pos = 0
    for p in free:
        take = min(L - pos, int(math.floor(cap_t - tok[p])))
        if take <= 0:
            continue
        a, b = pos, pos + take
        seg_doc.append(d), seg_start.append(s0 + a), seg_end.append(s0 + b), seg_part.append(p)
        tok[p] += take
        wrk[p] += (b * (b + 1) - a * (a + 1)) / 2
        pos = b
        if pos == L:
            return
    raise AssertionError("token caps leave no room; this cannot happen for token_slack >= 0")
