"""The ``balanced`` placement: document-aware packing of documents onto parts, like LPT for two resources.

Short documents stay whole on one part (no transfer); a long document is cut into ``2k`` chunks over ``k`` parts
(chunks ``i`` and ``2k-1-i`` on the i-th, so each holds the same attention work), ``k`` as small as keeps every part
within its token cap ``ceil(T/P) * (1 + token_slack)`` (activation memory) and work cap ``mean * (1 + work_slack)``
(time). Documents go longest first onto the least loaded parts; one that fits nowhere is cut contiguously over the
parts with the most free tokens (only the work cap may be exceeded). :meth:`.greedy.Greedy.placement` then slides the
boundaries of split documents (:mod:`.refine`). It runs on every batch, so the loop uses plain Python scalars and
lists (numpy's per-call overhead would dominate).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from itertools import accumulate
import numpy as np

from .greedy import Greedy
from .layout import Layout
from .placement import DEFAULT_TOKEN_SLACK, DEFAULT_WORK_SLACK, Placement, rows_work, token_cap
from .segments import Segments
from .shares import choose


def _chunk_sizes(L: int, k: int, rot: int) -> tuple[list[int], int]:
    """``_zigzag_chunks(np.array([L]), k, rot)`` for one document: chunk sizes ``[2k]`` and the next rotation."""
    two_k = 2 * k
    base, rem = divmod(L, two_k)
    # slots rot, rot + 1, ... (cyclic) get the extra tokens; the chunks are the first k slots and the rest reversed
    slots = [base] * two_k
    rot %= two_k  # (the rotation a split of another k left)
    end = rot + rem
    slots[rot:min(end, two_k)] = [base + 1] * (min(end, two_k) - rot)
    if end > two_k:
        slots[:end - two_k] = [base + 1] * (end - two_k)
    return slots[:k] + slots[:k - 1:-1], end % two_k


def _pair_work(sizes: list[int]) -> list[int]:
    """Work of each chunk pair of one dual-chunk split. ``sizes [2k] -> [k]``."""
    # pairs of the rows before each chunk boundary: rows_work(a, b) = tri(b) - tri(a), exactly
    tri = [a * (a + 1) // 2 for a in accumulate(sizes, initial=0)]
    n = len(sizes)
    return [tri[i + 1] - tri[i] + tri[n - i] - tri[n - 1 - i] for i in range(n // 2)]


def _pair_recv(sizes: list[int]) -> list[int]:
    """KV tokens the holder of each chunk pair needs: everything before the end of its second chunk but its own
    chunks. ``sizes [2k] -> [k]``."""
    ends = list(accumulate(sizes))
    return [ends[-1 - i] - sizes[i] - sizes[-1 - i] for i in range(len(sizes) // 2)]


def balanced(layout: Layout, n_parts: int, token_slack: float = DEFAULT_TOKEN_SLACK,
             work_slack: float = DEFAULT_WORK_SLACK, token_cost: float | None = None) -> Placement:
    """Document-aware placement (module docstring).

    Args:
        layout: the documents. n_parts: parts P. token_slack, work_slack: the caps' slacks.
        token_cost: a token's price in pairs: the refinement evens out ``work + token_cost * tokens`` within the
            token cap; ``None``: it evens out the work at unchanged token counts.
    """
    return balanced_greedy(layout, n_parts, token_slack, work_slack).placement(token_cost)


def balanced_greedy(layout: Layout, n_parts: int, token_slack: float = DEFAULT_TOKEN_SLACK,
                    work_slack: float = DEFAULT_WORK_SLACK) -> Greedy:
    """The greedy pass of :func:`balanced` (name ``"balanced"``); ``.placement(token_cost)`` refines it."""
    fig = _Figures(layout, n_parts, work_slack)
    cap_t = token_cap(layout.total_tokens, n_parts, token_slack)
    st = _State.empty(n_parts, len(fig.docs))
    _run(st, fig, cap_t)
    return Greedy("balanced", n_parts, layout.cu_seqlens, st.segs, fig.docs, st.whole_part, st.tok, st.wrk, cap_t,
                  max_moves=4 * n_parts, whole_doc_ids=fig.order, cu_list=fig.cu)


class _Figures:
    """The per-document figures of a balanced pass (lists, longest first)."""

    def __init__(self, layout: Layout, n_parts: int, work_slack: float) -> None:
        lengths = layout.doc_lengths
        T = layout.total_tokens
        work = lengths * (lengths + 1) // 2
        order = np.argsort(-lengths, kind="stable")
        # per document, longest first: remaining tokens / work once it is placed (exact integers)
        rem_t = T - np.cumsum(lengths[order])
        rem_w = int(work.sum()) - np.cumsum(work[order])
        self.n_parts = n_parts
        self.cap_w = float(work.sum()) / n_parts * (1.0 + work_slack)
        self.mean_t = T / n_parts
        # the remaining documents' average work per token (numpy rounds 0.5 * rw / rt as Python does)
        self.rhos = np.divide(0.5 * rem_w, rem_t, out=np.zeros(len(order)), where=rem_t > 0).tolist()
        self.order = order  # int64
        self.docs, self.lens = order.tolist(), lengths[order].tolist()
        self.works = work[order].astype(np.float64).tolist()
        self.starts = layout.cu_seqlens[:-1][order].tolist()
        self.cu = layout.cu_seqlens.tolist()


@dataclass
class _State:
    """A balanced pass so far: every part's tokens, work and received KV, the whole documents' parts (placing
    order, -1: not whole), the split segments and the split rotation."""

    tok: list[float]
    wrk: list[float]
    recv: list[int]
    whole_part: list[int]
    segs: Segments
    rot: int = 0

    @staticmethod
    def empty(n_parts: int, n_docs: int) -> "_State":
        """Nothing placed yet."""
        return _State([0.0] * n_parts, [0.0] * n_parts, [0] * n_parts, [-1] * n_docs, Segments())


def _run(st: _State, fig: _Figures, cap_t: float) -> None:
    """Place every document (placing order) into ``st`` within the token cap ``cap_t``."""
    P, cap_w, mean_t = fig.n_parts, fig.cap_w, fig.mean_t
    tok, wrk, whole_part = st.tok, st.wrk, st.whole_part
    # every part's score, max(tok / cap_t, wrk / cap_w): least loaded first, ties by index (only the heap's
    # entries decide, not its layout, so it is rebuilt from the figures)
    heap = [(max(t / cap_t, w / cap_w), p) for p, (t, w) in enumerate(zip(tok, wrk))]
    heapq.heapify(heap)
    scores = [0.0] * P  # every part's score (current in the heap)
    caps = (cap_t, cap_w, mean_t)
    replace = heapq.heapreplace
    for i, L, w, rho in zip(range(len(fig.docs)), fig.lens, fig.works, fig.rhos):
        # the fast path: the least loaded part takes the document whole (.shares' test at k = 1, inlined; the
        # other tests are implied since rho * free, tok and wrk are >= 0)
        best = heap[0][1]
        t_0 = tok[best]
        t_b, w_b = t_0 + L, wrk[best] + w
        free = mean_t - t_0 - L
        if w_b + rho * (free if free > 0.0 else 0.0) <= cap_w and t_b <= cap_t:
            tok[best], wrk[best], whole_part[i] = t_b, w_b, best
            s_t, s_w = t_b / cap_t, w_b / cap_w
            replace(heap, (s_t if s_t >= s_w else s_w, best))
            continue
        for score, p in heap:  # the general path (split, or whole where the least loaded part has no room)
            scores[p] = score  # reads the scores the fast path kept in the heap alone
        k0 = max(1, math.ceil(L / cap_t), math.ceil(w / cap_w))
        by_load = sorted(range(P), key=scores.__getitem__)  # stable: ties by part index
        chosen = choose(by_load, L, w, k0, n_parts=P, tok=tok, wrk=wrk, caps=caps, rho=rho)
        if chosen is None:
            _fill_by_headroom(fig.docs[i], fig.starts[i], L, cap_t, tok=tok, wrk=wrk, segs=st.segs)
        elif len(chosen[1]) == 1:
            p = whole_part[i] = chosen[1][0]
            tok[p] += L
            wrk[p] += w
        else:
            st.rot = _split(fig.docs[i], fig.starts[i], L, chosen[1], st.rot, tok=tok, wrk=wrk, recv=st.recv,
                            segs=st.segs)
        for p in range(P) if chosen is None else chosen[1]:  # the parts this document changed
            scores[p] = max(tok[p] / cap_t, wrk[p] / cap_w)
        heap = list(zip(scores, range(P)))
        heapq.heapify(heap)


def _split(d: int, s0: int, L: int, chosen: list[int], rot: int, *, tok: list[float], wrk: list[float],
           recv: list[int], segs: Segments) -> int:
    """Cut document ``d`` (start ``s0``, length ``L``) in ``2k`` chunks over the ``k`` parts ``chosen``, the pair
    needing the most KV to the part receiving the least so far; appends the segments, updates the part figures
    (``tok``, ``wrk`` and the KV tokens ``recv`` every part receives) and returns the next rotation."""
    seg_doc, seg_start, seg_end, seg_part = segs.doc, segs.start, segs.end, segs.part
    k = len(chosen)
    sizes, rot = _chunk_sizes(L, k, rot)
    need = _pair_recv(sizes)
    chosen = [p for _, p in sorted(zip([recv[p] for p in chosen], chosen))]
    mapped = [0] * k  # pair index -> part: the pairs by need, largest first (stable, as a sort by -need)
    for p, pair in zip(chosen, sorted(range(k), key=need.__getitem__, reverse=True)):
        mapped[pair] = p
    chunk_part = mapped + mapped[::-1]  # chunk j belongs to pair min(j, 2k-1-j)
    bounds = list(accumulate(sizes, initial=s0))  # global start of every chunk, and the document's end
    if L >= 2 * k:  # no empty chunk
        seg_start.extend(bounds[:-1])
        seg_end.extend(bounds[1:])
        seg_part.extend(chunk_part)
    else:
        kept = [j for j, s in enumerate(sizes) if s]
        seg_start.extend([bounds[j] for j in kept])
        seg_end.extend([bounds[j + 1] for j in kept])
        seg_part.extend([chunk_part[j] for j in kept])
    seg_doc.extend([d] * (2 * k if L >= 2 * k else len(kept)))
    for i, (p, w_add) in enumerate(zip(mapped, _pair_work(sizes))):
        recv[p] += need[i]
        tok[p] += float(sizes[i] + sizes[-1 - i])
        wrk[p] += float(w_add)
    return rot


def _fill_by_headroom(d: int, s0: int, L: int, cap_t: float, *, tok: list, wrk: list, segs: Segments) -> None:
    """Cut document ``d`` (start ``s0``, length ``L``) contiguously over the parts with the most free tokens under
    ``cap_t`` (when the caps leave no room for equal shares); appends the segments and updates ``tok`` / ``wrk``."""
    free = sorted(range(len(tok)), key=lambda p: tok[p] - cap_t)
    pos = 0
    for p in free:
        take = min(L - pos, int(math.floor(cap_t - tok[p])))
        if take <= 0:
            continue
        a, b = pos, pos + take
        segs.append(d, s0 + a, s0 + b, p)
        tok[p] += take
        wrk[p] += float(rows_work(a, b))
        pos = b
        if pos == L:
            return
    raise AssertionError("token caps leave no room; this cannot happen for token_slack >= 0")
