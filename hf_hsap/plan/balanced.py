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
    for d in np.argsort(-lengths, kind="stable").tolist():
        L, w, s0 = int(lengths[d]), float(work[d]), int(starts[d])
        score = [max(t / cap_t, x / cap_w) for t, x in zip(tok, wrk)]
        k0 = max(1, math.ceil(L / cap_t), math.ceil(w / cap_w))
        if k0 == 1:  # fast path: the least loaded part takes the document whole
            best = min(range(P), key=score.__getitem__)
            if tok[best] + L <= cap_t and wrk[best] + w <= cap_w:
                seg_doc.append(d), seg_start.append(s0), seg_end.append(s0 + L), seg_part.append(best)
                tok[best] += L
                wrk[best] += w
                continue
        order = sorted(range(P), key=score.__getitem__)
        placed = False
        # a document that needs most parts anyway goes to all of them (no idle part, best balance)
        k_first = P if 2 * k0 > P else k0
        for k in range(k_first, min(P, L) + 1):
            chosen = [p for p in order if tok[p] + L / k <= cap_t and wrk[p] + w / k <= cap_w][:k]
            if len(chosen) < k:
                continue
            if k == 1:
                p = chosen[0]
                seg_doc.append(d), seg_start.append(s0), seg_end.append(s0 + L), seg_part.append(p)
                tok[p] += L
                wrk[p] += w
            else:
                sizes, rot = _zigzag_chunks(np.array([L]), k, rot)
                dd, ss, ee, pp = _zigzag_segments(np.array([d]), np.array([s0]), sizes,
                                                  np.array([chosen], dtype=np.int64))
                seg_doc += dd.tolist(); seg_start += ss.tolist(); seg_end += ee.tolist(); seg_part += pp.tolist()
                for p, t_add, w_add in zip(chosen, sizes[0, :k] + sizes[0, ::-1][:k], _pair_work(sizes[0])):
                    tok[p] += float(t_add)
                    wrk[p] += float(w_add)
            placed = True
            break
        if not placed:
            _fill_by_headroom(d, s0, L, cap_t, tok, wrk, seg_doc, seg_start, seg_end, seg_part)
    return _finish("balanced", P, seg_doc, seg_start, seg_end, seg_part)


def _fill_by_headroom(d: int, s0: int, L: int, cap_t: float, tok: list, wrk: list,
                      seg_doc: list, seg_start: list, seg_end: list, seg_part: list) -> None:
    """Cut a document contiguously over the parts with the most free tokens (fallback)."""
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
