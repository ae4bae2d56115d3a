"""The ``density`` placement: every document split over as many parts as its load needs.

Where a few documents hold most of the attention pairs, :mod:`.balanced`'s fewest-parts splits leave the parts of a
work-dense document above the mean. Here one number decides: a document's load ``L (L + 1) / 2 + token_cost * L``.
A *heavy* document (more pairs than a part's mean, a load above a part's mean load, or longer than the token cap)
is cut in ``2k`` chunks over the ``k`` least loaded parts with room (as in :mod:`.balanced`), ``k`` as many as its
tokens and pairs need. The rest stay whole, heaviest first onto the least loaded part with room (LPT). The token cap
is never exceeded; the refinement then evens out ``work + token_cost * tokens``.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from .balanced import _fill_by_headroom, _split
from .greedy import Greedy
from .layout import Layout
from .placement import DEFAULT_TOKEN_SLACK, Placement, token_cap
from .segments import Segments
from .shares import share_room

__all__ = ["density", "density_greedy"]


def density(layout: Layout, n_parts: int, token_cost: float, token_slack: float = DEFAULT_TOKEN_SLACK) -> Placement:
    """Load-proportional placement (module docstring): :func:`density_greedy`, refined."""
    return density_greedy(layout, n_parts, token_cost, token_slack).placement(token_cost)


def density_greedy(layout: Layout, n_parts: int, token_cost: float,
                   token_slack: float = DEFAULT_TOKEN_SLACK) -> Greedy:
    """The greedy pass of :func:`density` (name ``"density"``); ``.placement(token_cost)`` refines it.

    Args:
        layout: the documents. n_parts: parts P. token_cost: a token's price in pairs. token_slack: the cap's slack.
    """
    P = n_parts
    lengths = layout.doc_lengths
    cu = layout.cu_seqlens.tolist()
    cap_t = token_cap(cu[-1], P, token_slack)
    # per document, as floats: its pairs and its load (numpy rounds L (L + 1) / 2 + token_cost * L as Python does)
    pairs_a = lengths * (lengths + 1) / 2
    loads_a = pairs_a + token_cost * lengths
    order_a = np.argsort(-loads_a, kind="stable")  # heaviest first, ties by index
    order, lens, loads = order_a.tolist(), lengths.tolist(), loads_a.tolist()
    limit = sum(loads) / P  # the builtin sum: left to right
    mean_w = sum(pairs_a.tolist()) / P
    tok = [0.0] * P
    wrk = [0.0] * P
    recv = [0] * P
    segs = Segments()
    rot = 0

    def dense(L: int, load: float) -> bool:
        return L * (L + 1) / 2 > mean_w or load > limit

    heavy_end = 0  # documents order[:heavy_end] are split (loads decrease along order, and so do lengths)
    while heavy_end < len(order) and (lens[order[heavy_end]] > cap_t or dense(lens[order[heavy_end]],
                                                                               loads[order[heavy_end]])):
        heavy_end += 1
    part_load = [0.0] * P  # wrk + token_cost * tok of every part, kept for the parts a split changes
    for d in order[:heavy_end]:
        L = lens[d]
        by_tokens, by_pairs = math.ceil(L / cap_t), math.ceil(L * (L + 1) / 2 / mean_w)
        k = min(P, L, max(2, by_tokens, by_pairs))  # >= 2: heavier than a part's limit, or longer than its token cap (T >= P)
        by_load = sorted(range(P), key=part_load.__getitem__)
        room = share_room(cap_t, L, k)  # a part of the split holds at most split_share_max tokens
        chosen = []
        for p in by_load:
            if tok[p] <= room:
                chosen.append(p)
                if len(chosen) == k:
                    break
        if len(chosen) < k:
            _fill_by_headroom(d, cu[d], L, cap_t, tok=tok, wrk=wrk, segs=segs)
            chosen = range(P)
        else:
            rot = _split(d, cu[d], L, chosen, rot, tok=tok, wrk=wrk, recv=recv, segs=segs)
        for p in chosen:
            part_load[p] = wrk[p] + token_cost * tok[p]
    light = order[heavy_end:]
    whole_part = _least_loaded(light, lengths[order_a[heavy_end:]].tolist(), pairs_a[order_a[heavy_end:]].tolist(), cu,
                               token_cost=token_cost, cap_t=cap_t, tok=tok, wrk=wrk, segs=segs)
    return Greedy("density", P, layout.cu_seqlens, segs, light, whole_part, tok, wrk, cap_t, max_moves=4 * P,
                  whole_doc_ids=order_a[heavy_end:], cu_list=cu)


def _least_loaded(docs: list[int], lens: list[int], pairs: list[float], cu: list[int], *, token_cost: float,
                  cap_t: float, tok: list[float], wrk: list[float], segs: Segments) -> list[int]:
    """Place ``docs`` (heaviest first; ``lens``, ``pairs``: theirs) whole, each on the least loaded part
    (``work + token_cost * tokens``, ties by index) with room under ``cap_t``; one that fits no part is cut over the
    parts with the most free tokens. Updates the figures (``tok``, ``wrk``: every part's) and ``segs``; returns every
    document's part (-1: cut)."""
    heap = [(wrk[p] + token_cost * tok[p], p) for p in range(len(tok))]
    heapq.heapify(heap)
    out = [-1] * len(docs)
    replace = heapq.heapreplace
    for i, (L, pair) in enumerate(zip(lens, pairs)):
        p = heap[0][1]
        t = tok[p] + L
        if t > cap_t:  # the least-loaded part has no room (rare): look further, or cut the document
            out[i] = _no_room(docs[i], L, pair, cu[docs[i]], heap, token_cost=token_cost, cap_t=cap_t, tok=tok,
                              wrk=wrk, segs=segs)
            continue
        w = wrk[p] + pair
        tok[p], wrk[p], out[i] = t, w, p
        replace(heap, (w + token_cost * t, p))
    return out


def _no_room(d: int, L: int, pair: float, s0: int, heap: list, *, token_cost: float, cap_t: float, tok: list[float],
             wrk: list[float], segs: Segments) -> int:
    """:func:`_least_loaded` for a document the least loaded part has no room for: the least loaded part with room
    (returned), else cut over the parts with the most free tokens (-1). Keeps ``heap`` whole."""
    full = []
    while heap and tok[heap[0][1]] + L > cap_t:  # parts without room for the whole document
        full.append(heapq.heappop(heap))
    p = -1
    if heap:
        p = heap[0][1]
        tok[p] += L
        wrk[p] += pair
        heapq.heapreplace(heap, (wrk[p] + token_cost * tok[p], p))
    else:
        _fill_by_headroom(d, s0, L, cap_t, tok=tok, wrk=wrk, segs=segs)
        full = [(wrk[q] + token_cost * tok[q], q) for _, q in full]
    for item in full:
        heapq.heappush(heap, item)
    return p

