"""The ``density`` placement: every document split over as many parts as its load needs.

Where a few documents hold most of the attention pairs, :mod:`.balanced`'s fewest-parts splits leave the parts of a
work-dense document above the mean. Here one number decides: a document's load ``L (L + 1) / 2 + token_cost * L``.
A *heavy* document (more pairs than ``work_share`` of a part's mean, longer than the token cap, or with
``spread="fit"`` a load above ``split_above`` mean part loads) is cut in ``2k`` chunks over the ``k`` least loaded
parts with room (as in :mod:`.balanced`); ``spread="all"`` puts the heaviest over all parts. The rest stay whole,
heaviest first onto the least loaded part with room (LPT). The token cap is never exceeded; the refinement then
evens out ``work + token_cost * tokens``. ``auto`` prices several ``work_share`` / ``spread`` variants.
"""
from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Sequence

import numpy as np

from .balanced import _fill_by_headroom, _split
from .greedy import Greedy
from .layout import Layout
from .placement import DEFAULT_TOKEN_SLACK, Placement, token_cap
from .shares import share_room

__all__ = ["DensityFigures", "density", "density_figures", "density_greedies", "density_greedy"]

SPREAD_ALL_DOCS = 8  # spread="all" puts at most this many (the heaviest) documents over every part


def density(layout: Layout, n_parts: int, token_cost: float, token_slack: float = DEFAULT_TOKEN_SLACK,
            split_above: float = 1.0, spread: str = "fit", work_share: float = 1.0) -> Placement:
    """Load-proportional placement (module docstring): :func:`density_greedy`, refined."""
    return density_greedy(layout, n_parts, token_cost, token_slack, split_above, spread, work_share).placement(
        token_cost)


def density_greedy(layout: Layout, n_parts: int, token_cost: float, token_slack: float = DEFAULT_TOKEN_SLACK,
                   split_above: float = 1.0, spread: str = "fit", work_share: float = 1.0) -> Greedy:
    """The greedy pass of :func:`density` (name ``"density"``); ``.placement(token_cost)`` refines it.

    Args:
        layout: the documents. n_parts: parts P. token_cost: a token's price in pairs. token_slack: the cap's slack.
        split_above: with ``spread="fit"``, a document heavier than this many mean part loads is heavy.
        spread: ``"fit"`` (a heavy document over ``max(2, ceil(L / cap_t), ceil(pairs / (mean pairs of a part *
            work_share)))`` parts) or ``"all"`` (the :data:`SPREAD_ALL_DOCS` heaviest over all parts, the rest as fit).
        work_share: a document with more pairs than this share of a part's mean pairs is heavy.
    """
    return _density_pass(density_figures(layout, token_cost), n_parts, token_slack, split_above, spread, work_share)[0]


class DensityFigures:
    """The per-document figures every density pass of one layout and token cost reads (built once for ``auto``'s
    variants)."""

    def __init__(self, layout: Layout, token_cost: float) -> None:
        self.layout, self.token_cost = layout, token_cost
        lengths = layout.doc_lengths
        self.cu = layout.cu_seqlens.tolist()
        # per document, as floats: its pairs and its load (numpy rounds L (L + 1) / 2 + token_cost * L as Python does)
        self.pairs_a = lengths * (lengths + 1) / 2
        loads_a = self.pairs_a + token_cost * lengths
        self.order_a = np.argsort(-loads_a, kind="stable")  # heaviest first, ties by index
        self.order = self.order_a.tolist()
        self.lens, self.pairs, self.loads = lengths.tolist(), self.pairs_a.tolist(), loads_a.tolist()
        self.lens_by_order = lengths[self.order_a].tolist()  # in `order`
        self.pairs_by_order = self.pairs_a[self.order_a].tolist()
        # the builtin sum: left to right, as the figures were first written
        self.sum_loads, self.sum_pairs = sum(self.loads), sum(self.pairs)


def density_figures(layout: Layout, token_cost: float) -> DensityFigures:
    """The :class:`DensityFigures` of one layout and token cost, to share between :func:`density_greedies` calls."""
    return DensityFigures(layout, token_cost)


def density_greedies(layout: Layout, n_parts: int, token_cost: float, token_slacks: Sequence[float],
                     spread: str = "fit", work_share: float = 1.0,
                     figures: DensityFigures | None = None) -> list[Greedy]:
    """:func:`density_greedy` at each of ``token_slacks`` (ascending): a pass in which no cap decided anything is
    the same pass at any larger cap, only its refinement's cap differs. ``figures``: :func:`density_figures`, if
    built already."""
    if figures is None or figures.layout is not layout or figures.token_cost != token_cost:
        figures = density_figures(layout, token_cost)
    out: list[Greedy] = []
    capped = True
    for eps in token_slacks:
        if capped:
            g, capped = _density_pass(figures, n_parts, eps, 1.0, spread, work_share)
        else:
            g = dataclasses.replace(g, cap_t=token_cap(layout.total_tokens, n_parts, eps), same_as=g)
        out.append(g)
    return out


def _density_pass(fig: DensityFigures, n_parts: int, token_slack: float, split_above: float,
                  spread: str, work_share: float) -> tuple[Greedy, bool]:
    """:func:`density_greedy` of ``fig``, and whether its token cap decided anything (a part skipped for want of
    room, a document longer than the cap)."""
    if spread not in ("fit", "all"):
        raise ValueError(f"spread must be 'fit' or 'all', got {spread!r}")
    P = n_parts
    layout, token_cost, cu = fig.layout, fig.token_cost, fig.cu
    T = cu[-1]
    cap_t = token_cap(T, P, token_slack)
    order, lens, loads = fig.order, fig.lens, fig.loads
    mean = fig.sum_loads / P
    limit = mean * split_above
    mean_w = fig.sum_pairs / P
    tok = [0.0] * P
    wrk = [0.0] * P
    recv = [0] * P
    seg_doc: list[int] = []
    seg_start: list[int] = []
    seg_end: list[int] = []
    seg_part: list[int] = []
    rot = 0
    def dense(L: int, load: float) -> bool:  # "all" spreads only the work-dense (or too long) documents
        return L * (L + 1) / 2 > mean_w * work_share or (spread == "fit" and load > limit)

    heavy_end = 0  # documents order[:heavy_end] are split (loads decrease along order, and so do lengths)
    while heavy_end < len(order) and (lens[order[heavy_end]] > cap_t or dense(lens[order[heavy_end]],
                                                                               loads[order[heavy_end]])):
        heavy_end += 1
    capped = False  # whether the cap decided anything (a document heavy or cut in more parts for its length alone)
    part_load = [0.0] * P  # wrk + token_cost * tok of every part, kept for the parts a split changes
    for rank, d in enumerate(order[:heavy_end]):
        L = lens[d]
        by_tokens, by_pairs = math.ceil(L / cap_t), math.ceil(L * (L + 1) / 2 / (mean_w * work_share))
        fit = max(2, by_tokens, by_pairs)
        capped = capped or by_tokens > max(2, by_pairs) or not dense(L, loads[d])
        k = P if spread == "all" and rank < SPREAD_ALL_DOCS else fit
        k = min(P, L, k)  # >= 2: heavier than a part's limit, or longer than its token cap (T >= P)
        by_load = sorted(range(P), key=part_load.__getitem__)
        room = share_room(cap_t, L, k)  # a part of the split holds at most split_share_max tokens
        chosen = []
        for p in by_load:
            if tok[p] <= room:
                chosen.append(p)
                if len(chosen) == k:
                    break
        capped = capped or chosen != by_load[:k]
        if len(chosen) < k:
            _fill_by_headroom(d, cu[d], L, cap_t, tok, wrk, seg_doc, seg_start, seg_end, seg_part)
            chosen = range(P)
        else:
            rot = _split(d, cu[d], L, chosen, rot, tok, wrk, recv, seg_doc, seg_start, seg_end, seg_part)
        for p in chosen:
            part_load[p] = wrk[p] + token_cost * tok[p]
    light = order[heavy_end:]
    segs = (seg_doc, seg_start, seg_end, seg_part)
    whole_part, no_room = _least_loaded(light, fig.lens_by_order[heavy_end:], fig.pairs_by_order[heavy_end:], cu,
                                        P, token_cost, cap_t, tok, wrk, *segs)
    # "all" splits evenly already (and has many boundaries, each move costs more): fewer refining moves
    g = Greedy("density", P, layout.cu_seqlens, seg_doc, seg_start, seg_end, seg_part, light, whole_part, tok, wrk,
               cap_t, max_moves=(4 if spread == "fit" else 1) * P, whole_doc_ids=fig.order_a[heavy_end:], cu_list=cu)
    return g, capped or no_room


def _least_loaded(docs: list[int], lens: list[int], pairs: list[float], cu: list[int], P: int, token_cost: float,
                  cap_t: float, tok: list[float], wrk: list[float], seg_doc: list[int], seg_start: list[int],
                  seg_end: list[int], seg_part: list[int]) -> tuple[list[int], bool]:
    """Place ``docs`` (heaviest first) whole, each on the least loaded part (``work + token_cost * tokens``, ties by
    index) with room under ``cap_t``; one that fits no part is cut over the parts with the most free tokens.
    Updates the figures and segments; returns every document's part (-1: cut) and whether a part lacked room."""
    heap = [(wrk[p] + token_cost * tok[p], p) for p in range(P)]
    heapq.heapify(heap)
    out = [-1] * len(docs)
    no_room = False
    replace = heapq.heapreplace
    for i, (L, pair) in enumerate(zip(lens, pairs)):
        p = heap[0][1]
        t = tok[p] + L
        if t > cap_t:  # the least-loaded part has no room (rare): look further, or cut the document
            no_room = True
            out[i] = _no_room(docs[i], L, pair, cu[docs[i]], token_cost, cap_t, heap, tok, wrk, seg_doc, seg_start,
                              seg_end, seg_part)
            continue
        w = wrk[p] + pair
        tok[p], wrk[p], out[i] = t, w, p
        replace(heap, (w + token_cost * t, p))
    return out, no_room


def _no_room(d: int, L: int, pair: float, s0: int, token_cost: float, cap_t: float, heap: list, tok: list[float],
             wrk: list[float], seg_doc: list[int], seg_start: list[int], seg_end: list[int],
             seg_part: list[int]) -> int:
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
        _fill_by_headroom(d, s0, L, cap_t, tok, wrk, seg_doc, seg_start, seg_end, seg_part)
        full = [(wrk[q] + token_cost * tok[q], q) for _, q in full]
    for item in full:
        heapq.heappush(heap, item)
    return p

