"""Mask kinds: full causal attention and sliding windows, as geometry on global token positions.

Convention (Transformers' ``sliding_window``, ``masking_utils.sliding_window_overlay``): with a window ``W``
a query at position ``i`` of a document sees the keys ``j`` of that document with ``i - W < j <= i`` (the
``W`` keys ending at itself); ``None`` is full causal attention (``j <= i``). A window at least as long as
the longest document of a layout hides nothing there: it is the full kind (:func:`mask_kinds`).

Everything the planner counts or moves for a windowed kind is here, in closed forms over ranges:

* :func:`pairs`: (query, key) pairs a window keeps between a query range and a key range;
* :func:`window_transfers`: the minimal KV of a placement with a window (part ``r`` receives key ``j`` of
  document ``d`` exactly when it does not hold ``j`` and holds a query of ``d`` that sees ``j``);
* :func:`work_per_part`, :func:`local_work_per_part`, :func:`piece_work`: the pairs the runtime computes;
* :func:`band_blocks`: the cut of the pairs between a key run and a later query range into kernel blocks
  of one mask each (``full`` rectangles and ``anti``-causal squares, see :data:`BLOCK_MASKS`).
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
    """``window`` as an int >= 1 or ``None``; raise ``ValueError`` otherwise (the rule of
    :func:`hf_hsap.kernels.base.window_left`, the one conversion to the kernels' convention).

    Args:
        window: a sliding window in tokens (Transformers' ``sliding_window``) or ``None``.

    Returns:
        The window.
    """
    left = window_left(window)
    return None if left is None else left + 1


def kind_of(window: Window, layout: Layout) -> Window:
    """The mask kind of ``window`` on ``layout``: ``None`` when the window hides nothing there.

    Args:
        window: the layer's window or ``None``. layout: the documents.

    Returns:
        ``window``, or ``None`` when it is at least the longest document.
    """
    window = check_window(window)
    return None if window is None or window >= layout.longest_doc else window


def layer_windows(windows: Sequence[Window] | Mapping[Window, int]) -> dict[Window, int]:
    """A model's layer masks, validated, as a mapping window -> layers (what :func:`mask_kinds` also accepts).

    Args:
        windows: every layer's window (``None``: full attention), or a mapping window -> layer count.

    Returns:
        Layers per window (windows checked by :func:`check_window`, counts ints >= 0).

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
        windows: every layer's window (``None``: full attention), or a mapping window -> layer count;
            ``None``: full attention only.
        layout: the documents (windows at least their longest document are full attention).

    Returns:
        ``(kinds, layers)``: kinds sorted with ``None`` first, then ascending; layers per kind (>= 1 each).

    Raises:
        ValueError: a bad window, a negative count, or no layer at all.
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
    """(query, key) pairs of queries ``[qa, qb)`` and keys ``[ka, kb)`` (global positions, one document)
    with ``j <= i`` and, for a window, ``i - j < window``. Ints or int64 arrays, elementwise.

    Returns:
        int64 array of pair counts.
    """
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
    """Every (later segment s, earlier-or-same segment g) of one document whose keys a window lets s see.

    Args:
        same_part: keep only pairs on the same part (True), on different parts (False), or all (None).

    Returns:
        ``(s, g)`` segment indices into the placement's arrays, ``[n]`` each (``g == s`` included when
        ``same_part`` is not False).
    """
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
    """The minimal forward KV transfers of a placement for one mask kind (module docstring).

    A key run of a foreign segment ``g`` is needed by part ``r`` from the earliest window start of ``r``'s
    later segments of the document to ``g``'s end; the run of every (``r``, ``g``) is one transfer row.

    Args:
        pl: the placement. layout: its documents. window: the kind (``None``: :func:`compute_transfers`).

    Returns:
        The :class:`~hf_hsap.plan.transfers.Transfers`, sorted by (dst, src, start).
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
    return Transfers(src=src, dst=dst, seg=g, start=lo, end=pl.end[g],
                     src_local=pl.local_start[g] + (lo - pl.start[g]))


def work_per_part(layout: Layout, pl: Placement, window: Window) -> np.ndarray:
    """``[n_parts]`` (query, key) pairs of each part's queries under one mask kind."""
    if window is None:
        return pl.work_per_part(layout).astype(np.float64)
    doc_start = layout.cu_seqlens[pl.doc]
    w = pairs(pl.start, pl.end, doc_start, pl.end, window)
    return np.bincount(pl.part, weights=w, minlength=pl.n_parts)


def local_work_per_part(layout: Layout, pl: Placement, window: Window = None) -> np.ndarray:
    """``[n_parts]`` pairs of each part's queries against its own keys under one mask kind: the work that
    overlaps the KV transfers. Full kind: per (part, document), causal over the part's ``n`` tokens of it,
    ``n (n + 1) / 2``."""
    if window is None:
        first, own = pl.runs  # one per (part, document), in (part, document) order
        n = own.astype(np.float64)
        return np.bincount(pl.part[first], weights=n * (n + 1) / 2, minlength=pl.n_parts)
    s, g = _window_pairs_of_segments(pl, layout, int(window), same_part=True)
    w = pairs(pl.start[s], pl.end[s], pl.start[g], pl.end[g], window)
    return np.bincount(pl.part[s], weights=w, minlength=pl.n_parts)


def piece_work(layout: Layout, pl: Placement, dst: np.ndarray, start: np.ndarray, end: np.ndarray,
               window: int) -> np.ndarray:
    """``[n]`` pairs the receiving part ``dst`` computes against the key run ``[start, end)`` (a window).

    Args:
        layout, pl: the plan's documents and placement. dst, start, end: ``[n]`` receiving part and run.
        window: the window (the full kind is :func:`hf_hsap.plan.rounds.piece_remote_work`).
    """
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
    """The pairs between queries ``[qa, qb)`` and an earlier key run ``[ka, kb)`` (``kb <= qa``, one
    document) that a window keeps, as kernel blocks of one mask each.

    Query ``i`` sees the keys ``[max(ka, i - window + 1), kb)``: the first queries see the whole run (a
    ``full`` rectangle), later ones a shrinking suffix (an ``anti`` square, where the block's query ``t`` sees
    its keys ``t'`` with ``t' >= t``, plus a ``full`` rectangle of the keys every one of them sees), the
    last ones nothing.

    Returns:
        ``(mask, q_lo, q_hi, k_lo, k_hi)`` in global positions, ``mask`` a key of :data:`BLOCK_MASKS`;
        blocks sharing a query have disjoint keys.
    """
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


def attention_windows(config) -> list[Window]:
    """The sliding window of every attention layer of a Transformers model config (``None``: full attention),
    what ``plan_sequence(..., windows=...)`` plans for.

    Read as the layers read it: ``config.layer_types`` (``"sliding_attention"`` layers have
    ``config.sliding_window``, every other attention layer none), else ``config.sliding_window`` on every
    layer unless ``use_sliding_window`` is False (Mistral-style). Composite configs use their text config.
    Pure attribute reads: no model is built. A layer whose window differs from this at run time is still
    exact (its mask kind is planned on demand), only not weighed by ``placement="auto"``.

    Args:
        config: a Transformers ``PretrainedConfig`` (or any object with those attributes).

    Returns:
        One window per layer, ``[num_hidden_layers]`` (one entry when the config has no layer count).
    """
    get = getattr(config, "get_text_config", None)
    if callable(get):
        try:
            config = get(decoder=True)
        except (TypeError, ValueError):  # older signature, or several text configs
            pass
    window = getattr(config, "sliding_window", None)
    window = window if isinstance(window, (int, np.integer)) and not isinstance(window, bool) and window >= 1 else None
    n_layers = getattr(config, "num_hidden_layers", None)
    types = getattr(config, "layer_types", None)
    if types:
        types = list(types)[:n_layers] if isinstance(n_layers, int) else list(types)
        return [window if str(t) == "sliding_attention" else None for t in types]
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    return [window] * (n_layers if isinstance(n_layers, int) and n_layers > 0 else 1)


def weighted_contiguous(layout: Layout, n_parts: int, layers: Mapping[Window, int], token_cost: float,
                        token_cap: int, min_tokens: int = 1) -> Placement:
    """Contiguous ranges cut at equal estimated cost of a model's layers: a token at offset ``x`` of its
    document costs ``sum over kinds of layers * (token_cost + keys it sees)`` (``min(x + 1, W)`` with a
    window), so parts of short documents (fewer keys per token under a window) get more tokens, within
    ``[min_tokens, token_cap]`` tokens each. A candidate of ``placement="auto"`` for windowed models (it
    moves at most ``W - 1`` keys per cut and window).

    Args:
        layout: the documents. n_parts: R. layers: layers per mask kind. token_cost: the cost model's price
            of a token in attention pairs. token_cap: the most tokens a part may hold. min_tokens: the least.

    Returns:
        The placement, named ``"contiguous-cost"`` (contiguous ranges, cuts moved off equal token counts).
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
    """``[T]`` estimated cost of every token over a model's layers: ``sum over kinds of layers * (token_cost +
    keys it sees)``, ``min(x + 1, W)`` keys at offset ``x`` of its document under a window, ``x + 1`` without."""
    T = layout.total_tokens
    offset = np.arange(T, dtype=np.int64) - np.repeat(layout.cu_seqlens[:-1], layout.doc_lengths)  # [T]
    weight = np.zeros(T, dtype=np.float64)
    for w, n in layers.items():
        weight += n * (token_cost + (offset + 1 if w is None else np.minimum(offset + 1, w)))
    return weight
