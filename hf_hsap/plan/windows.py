"""Mask kinds (full causal attention and sliding windows) as geometry on global token positions.

With a window ``W`` a query at position ``i`` of a document sees the keys ``j`` of that document with ``i - W < j <=
i`` (Transformers' ``sliding_window``); ``None`` is full causal attention. A window at least as long as a layout's
longest document is the full kind there. Everything the planner counts or moves for a windowed kind is here, in
closed forms over ranges: pairs kept (:func:`pairs`), minimal KV transfers (:func:`window_transfers`), work per part
and per received run, and the cut of a band into kernel blocks of one mask each (:func:`band_blocks`).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..kernels.base import window_left
from .layout import Layout
from .placement import Placement, _cut
from .transfers import Transfers, compute_transfers

Window = int | None  # None: full causal attention

# the kernel mask of each block kind: (causal, window_left) in the kernels' (flash-attn's) convention
BLOCK_MASKS = {"full": (False, None), "anti": (False, 0)}


def check_window(window: Window) -> Window:
    """``window`` (tokens, or ``None``) checked by :func:`hf_hsap.kernels.base.window_left`; ``ValueError`` if bad."""
    left = window_left(window)
    return None if left is None else left + 1


def kind_of(window: Window, layout: Layout) -> Window:
    """The mask kind of ``window`` on ``layout``: ``None`` when it is at least the longest document."""
    window = check_window(window)
    return None if window is None or window >= layout.longest_doc else window


def layer_windows(windows: Sequence[Window] | Mapping[Window, int]) -> dict[Window, int]:
    """A model's layer masks, validated, as a mapping window -> layers.

    Args:
        windows: every layer's window (``None``: full attention), or a mapping window -> layer count.

    Raises:
        ValueError: a bad window or count. TypeError: neither a sequence nor a mapping.
    """
    if isinstance(windows, Mapping):
        items = list(windows.items())
    elif isinstance(windows, (str, bytes)) or not isinstance(windows, Sequence):
        raise TypeError(f"windows must be a per-layer sequence or a mapping, got {type(windows).__name__}")
    else:
        items = [(w, 1) for w in windows]
    out: dict[Window, int] = {}
    for w, n in items:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"a layer count must be an int >= 0, got {n!r} for window {w!r}")
        w = check_window(w)
        out[w] = out.get(w, 0) + int(n)
    return out


def mask_kinds(windows: Sequence[Window] | Mapping[Window, int] | None,
               layout: Layout) -> tuple[tuple[Window, ...], dict[Window, int]]:
    """The distinct mask kinds of a model's layers on a layout, and how many layers each has.

    Args:
        windows: as :func:`layer_windows`; ``None``: full attention only. layout: the documents.

    Returns:
        ``(kinds, layers)``: kinds with ``None`` first, then ascending; layers per kind (>= 1 each).

    Raises:
        ValueError: a bad window or count, or no layer at all.
    """
    if windows is None:
        return (None,), {None: 1}
    layers: dict[Window, int] = {}
    for w, n in layer_windows(windows).items():
        if n:
            kind = kind_of(w, layout)
            layers[kind] = layers.get(kind, 0) + n
    if not layers:
        raise ValueError("windows lists no layer: pass every attention layer's sliding window (None for full "
                         "attention), e.g. hf_hsap.attention_windows(model.config)")
    kinds = tuple(sorted(layers, key=lambda w: -1 if w is None else w))
    return kinds, layers


def _clipped_sum(x0: np.ndarray, x1: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``sum_{t = x0}^{x1} clip(t, 0, n)`` elementwise (0 where ``x1 < x0``)."""

    def upto(x: np.ndarray) -> np.ndarray:  # sum_{t <= x} clip(t, 0, n)
        x = np.maximum(x, 0)
        inside = np.minimum(x, n)
        return inside * (inside + 1) // 2 + np.maximum(x - n, 0) * n

    return np.where(x1 >= x0, upto(x1) - upto(x0 - 1), 0)


def _pairs_at_distance(qa: np.ndarray, qb: np.ndarray, ka: np.ndarray, kb: np.ndarray, c: int) -> np.ndarray:
    """Pairs ``(i, j)``, ``i in [qa, qb)``, ``j in [ka, kb)``, with ``i - j >= c`` (elementwise)."""
    n = np.maximum(kb - ka, 0)
    # query i counts clip(i - c + 1 - ka, 0, n) keys
    return _clipped_sum(qa - c + 1 - ka, qb - 1 - c + 1 - ka, n)


def pairs(qa: np.ndarray | int, qb: np.ndarray | int, ka: np.ndarray | int, kb: np.ndarray | int,
          window: Window) -> np.ndarray:
    """int64 count of (query, key) pairs of queries ``[qa, qb)`` and keys ``[ka, kb)`` (global positions, one
    document) with ``j <= i`` and, for a window, ``i - j < window``; elementwise over ints or int64 arrays."""
    qa, qb, ka, kb = (np.asarray(x, dtype=np.int64) for x in (qa, qb, ka, kb))
    causal = _pairs_at_distance(qa, qb, ka, kb, 0)
    if window is None:
        return causal
    return causal - _pairs_at_distance(qa, qb, ka, kb, int(window))


def _doc_order(pl: Placement) -> np.ndarray:
    """Segment indices in global order (segments partition ``[0, T)``, so by start)."""
    return np.argsort(pl.start, kind="stable")


def _window_pairs_of_segments(pl: Placement, layout: Layout, window: int,
                              same_part: bool | None) -> tuple[np.ndarray, np.ndarray]:
    """``(s, g)``, ``[n]`` segment indices each: every segment ``s`` and earlier-or-same segment ``g`` of its
    document whose keys the window lets ``s`` see; ``same_part``: only pairs on the same part (True), on different
    parts (False), or all (None)."""
    o = _doc_order(pl)
    start, end, doc = pl.start[o], pl.end[o], pl.doc[o]
    n = o.shape[0]
    doc_first = np.searchsorted(start, layout.cu_seqlens[doc], side="left")  # [n] first segment of its doc
    # earliest segment whose keys reach the window of s's first query: end > start_s - window + 1
    lo = np.maximum(doc_first, np.searchsorted(end, start - window + 1, side="right"))
    cnt = np.arange(n) + 1 - lo  # candidates lo..s (inclusive)
    rows = np.repeat(np.arange(n), cnt)
    g = lo[rows] + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    s_idx, g_idx = o[rows], o[g]
    if same_part is not None:
        keep = (pl.part[s_idx] == pl.part[g_idx]) == same_part
        s_idx, g_idx = s_idx[keep], g_idx[keep]
    return s_idx, g_idx


def window_transfers(pl: Placement, layout: Layout, window: Window) -> Transfers:
    """The minimal forward KV transfers of a placement for one mask kind, sorted by (dst, src, start).

    Part ``r`` receives key ``j`` exactly when it does not hold it and holds a query that sees it: one row per
    (``r``, foreign segment ``g``), from the earliest window start of ``r``'s later segments to ``g``'s end.
    ``window=None``: :func:`compute_transfers`.
    """
    if window is None:
        return compute_transfers(pl)
    s, g = _window_pairs_of_segments(pl, layout, int(window), same_part=False)
    dst = pl.part[s]
    lo = np.maximum(pl.start[g], pl.start[s] - window + 1)  # [n] first key of g that s's queries see
    if s.shape[0]:
        key = dst * (pl.doc.shape[0] + 1) + g  # one row per (receiving part, segment)
        uniq, inv = np.unique(key, return_inverse=True)
        first = np.full(uniq.shape[0], np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, inv.reshape(-1), lo)
        dst, g, lo = uniq // (pl.doc.shape[0] + 1), uniq % (pl.doc.shape[0] + 1), first
    src = pl.part[g]
    o = np.lexsort((lo, src, dst))
    dst, src, g, lo = dst[o], src[o], g[o], lo[o]
    return Transfers(src=src, dst=dst, seg=g, start=lo, end=pl.end[g], src_local=pl.local_start[g] + (lo - pl.start[g]))


def work_per_part(layout: Layout, pl: Placement, window: Window) -> np.ndarray:
    """``[n_parts]`` (query, key) pairs of each part's queries under one mask kind."""
    if window is None:
        return pl.work_per_part(layout).astype(np.float64)
    doc_start = layout.cu_seqlens[pl.doc]
    w = pairs(pl.start, pl.end, doc_start, pl.end, window)
    return np.bincount(pl.part, weights=w, minlength=pl.n_parts)


def local_work_per_part(layout: Layout, pl: Placement, window: Window = None) -> np.ndarray:
    """``[n_parts]`` pairs of each part's queries against its own keys under one mask kind (the work that overlaps
    the KV transfers)."""
    if window is None:
        first, own = pl.runs  # one per (part, document), in (part, document) order
        n = own.astype(np.float64)
        return np.bincount(pl.part[first], weights=n * (n + 1) / 2, minlength=pl.n_parts)
    s, g = _window_pairs_of_segments(pl, layout, int(window), same_part=True)
    w = pairs(pl.start[s], pl.end[s], pl.start[g], pl.end[g], window)
    return np.bincount(pl.part[s], weights=w, minlength=pl.n_parts)


def piece_work(layout: Layout, pl: Placement, dst: np.ndarray, start: np.ndarray, end: np.ndarray,
               window: int) -> np.ndarray:
    """``[n]`` pairs the receiving part ``dst`` computes against the key run ``[start, end)`` under a window (the
    full kind is :func:`.rounds.piece_remote_work`)."""
    if dst.shape[0] == 0:
        return np.zeros(0, dtype=np.float64)
    span = layout.total_tokens + 1
    comp = (pl.part * (layout.n_docs + 1) + pl.doc) * span + pl.start  # [n_seg] (part, doc, start)
    o = np.argsort(comp, kind="stable")
    comp = comp[o]
    group = dst * (layout.n_docs + 1) + layout.doc_of(start)
    lo = np.searchsorted(comp, group * span + end, side="left")  # receiver's segments after the run
    hi = np.searchsorted(comp, group * span + np.minimum(end + window - 1, span - 1), side="left")
    hi = np.maximum(hi, lo)  # only segments starting before end + window - 1 see the run
    cnt = hi - lo
    rows = np.repeat(np.arange(dst.shape[0]), cnt)
    seg = o[lo[rows] + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))]
    w = pairs(pl.start[seg], pl.end[seg], start[rows], end[rows], window).astype(np.float64)
    return np.bincount(rows, weights=w, minlength=dst.shape[0])


def band_blocks(qa: int, qb: int, ka: int, kb: int, window: int) -> list[tuple[str, int, int, int, int]]:
    """The pairs a window keeps between queries ``[qa, qb)`` and an earlier key run ``[ka, kb)`` of one document,
    as kernel blocks ``(mask, q_lo, q_hi, k_lo, k_hi)`` (``mask`` a key of :data:`BLOCK_MASKS`, disjoint keys per
    query): the first queries see the whole run (``full``), later ones a shrinking suffix (an ``anti`` square, its
    query ``t`` seeing keys ``t' >= t``, beside a ``full`` rectangle), the last ones nothing."""
    out: list[tuple[str, int, int, int, int]] = []
    full_end = min(qb, ka + window)  # queries i < ka + window see every key of the run
    if full_end > qa:
        out.append(("full", qa, full_end, ka, kb))
    q1, q2 = max(qa, ka + window), min(qb, kb + window - 1)  # queries that see a proper suffix
    if q2 > q1:
        k1, m = q1 - window + 1, q2 - q1
        out.append(("anti", q1, q2, k1, k1 + m))
        if k1 + m < kb:
            out.append(("full", q1, q2, k1 + m, kb))
    return out


def weighted_contiguous(layout: Layout, n_parts: int, layers: Mapping[Window, int], token_cost: float,
                        token_cap: int, min_tokens: int = 1) -> Placement:
    """Contiguous ranges cut at equal estimated cost (:func:`_token_costs`), within ``[min_tokens, token_cap]``
    tokens each: under a window, parts of short documents get more tokens. ``auto``'s candidate for windowed models
    (it moves at most ``W - 1`` keys per cut and window); named ``"contiguous-cost"``.

    Args:
        layout: the documents. n_parts: parts P. layers: layers per mask kind. token_cost: a token's price in pairs.
    """
    T = layout.total_tokens
    cum = np.cumsum(_token_costs(layout, layers, token_cost))  # [T]
    targets = cum[-1] * np.arange(1, n_parts, dtype=np.float64) / n_parts
    bounds = [0]
    for p, cut in enumerate(np.searchsorted(cum, targets, side="left").tolist(), start=1):
        lo = max(bounds[-1] + min_tokens, T - (n_parts - p) * token_cap)  # the rest must still fit
        hi = min(bounds[-1] + token_cap, T - (n_parts - p) * min_tokens)
        bounds.append(int(min(max(cut + 1, lo), hi)))
    bounds.append(T)
    owners = np.arange(n_parts, dtype=np.int64)
    return _cut(layout, np.asarray(bounds, dtype=np.int64), owners, "contiguous-cost", n_parts)


def _token_costs(layout: Layout, layers: Mapping[Window, int], token_cost: float) -> np.ndarray:
    """``[T]`` cost of every token over a model's layers: ``sum over kinds of layers * (token_cost + keys it
    sees)``, ``min(x + 1, W)`` keys at offset ``x`` of its document under a window, ``x + 1`` without."""
    T = layout.total_tokens
    offset = np.arange(T, dtype=np.int64) - np.repeat(layout.cu_seqlens[:-1], layout.doc_lengths)  # [T]
    weight = np.zeros(T, dtype=np.float64)
    for w, n in layers.items():
        weight += n * (token_cost + (offset + 1 if w is None else np.minimum(offset + 1, w)))
    return weight
