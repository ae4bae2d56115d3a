"""Give each rank of an SP group the images whose placeholder tokens it holds.

The vision tower runs at the language model's entrance, on every rank, for only the items (images, videos) with a
placeholder on that rank. An item split across ranks is encoded whole by each of its holders, each keeping the
feature rows of its own placeholders (the SP group's gradient reduction then sums the item's pieces), or once, by
its owner, which sends the other holders their rows (:mod:`.exchange`, chosen per batch by price). This module
computes, from the global batch and the plan, the local pixels and the feature rows each rank keeps
(``hsap_vision_rows``, applied by :mod:`.select`); every holder encoding::

    global row   | t t [i0 i0 i0 i0] t t [i1 i1] t |    placeholders of items i0 (4 rows) and i1 (2 rows)
    rank 0 holds | t t  i0 i0                       |    -> encodes i0, keeps feature rows [0, 1]
    rank 1 holds |            i0 i0  t t  i1 i1  t  |    -> encodes i0 and i1, keeps rows [2, 3, 4, 5]
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..comm.p2p import P2PExecutor
from ..data.cross import IMAGES_KEY
from ..data.vision import LAYOUT_KEY, TOKENS_KEY, Modality, VisionLayout, check_pixel_keys, item_sizes
from ..plan.blocks import Blocks, blocks_from_mask
from ..plan.items import ItemWork
from .exchange import Holdings, VisionPrice, route_items

__all__ = ["ROWS_KEY", "batch_blocks", "exchange_key", "image_blocks", "item_work", "items_key", "prefix_blocks",
           "shard_vision", "vision_keys", "window_key"]

ROWS_KEY = "hsap_vision_rows"  # local batch key: {modality name: [n_local_placeholders] feature rows}


def items_key(name: str) -> str:
    """The ``hsap_vision_rows`` entry with the placeholders of every item of modality ``name`` this rank encodes."""
    return f"{name}:items"


def exchange_key(name: str) -> str:
    """The ``hsap_vision_rows`` entry with this rank's :class:`~.exchange.RowExchange` of modality ``name``."""
    return f"{name}:exchange"


def window_key(name: str) -> str:
    """The ``hsap_vision_rows`` entry with, for every item of modality ``name`` this rank encodes, its index in its
    run of placeholders (0 where the item's placeholders start a run: an audio sample cut in windows, one item each,
    has one run; MusicFlamingo time-stamps each window by it)."""
    return f"{name}:window"


def _run_windows(where: torch.Tensor, tokens: np.ndarray) -> np.ndarray:
    """Each item's index in its run of placeholders (:func:`window_key`) from the global placeholder positions
    ``where`` and the items' placeholders ``tokens`` (in order)."""
    ends = np.cumsum(tokens)
    if len(tokens) == 0 or (tokens <= 0).any():
        return np.zeros(len(tokens), dtype=np.int64)
    pos = where.numpy()
    joined = np.r_[False, pos[ends[:-1]] == pos[ends[:-1] - 1] + 1]  # first placeholder right after the last one
    window = np.zeros(len(tokens), dtype=np.int64)
    for i in range(1, len(tokens)):
        window[i] = window[i - 1] + 1 if joined[i] else 0
    return window


def vision_keys(layout: VisionLayout) -> set[str]:
    """Every batch key :func:`shard_vision` replaces (pixels and per-item keys)."""
    cross = {layout.cross_key, IMAGES_KEY} if getattr(layout, "cross_key", None) else set()
    return {key for m in layout.modalities for key in (m.pixel_key, *m.item_keys)} | {LAYOUT_KEY, TOKENS_KEY} | cross


def image_blocks(layout: VisionLayout, ids: torch.Tensor, cu_seqlens: torch.Tensor) -> Blocks:
    """The bidirectional blocks of a family whose image placeholders see each other (Gemma 3): every run of image
    placeholders inside one document.

    Args:
        layout: the batch's vision layout; ids: ``[B, L]`` token ids; cu_seqlens: ``[n + 1]`` documents.

    Returns:
        The :class:`~hf_hsap.plan.blocks.Blocks` over the flattened tokens.
    """
    image = next(m for m in layout.modalities if m.name == "image")
    return blocks_from_mask(ids.reshape(-1).to("cpu") == image.token_id, cu_seqlens)


def prefix_blocks(types: torch.Tensor, cu_seqlens: torch.Tensor) -> Blocks:
    """The bidirectional prefixes of a prefix-LM (PaliGemma): in each document, its tokens of type 0 (image and
    prompt; PaliGemma's mask puts them in one group, ``token_type_ids == 0``), which must be one run.

    Args:
        types: ``[B, L]`` token types (0: prefix, 1: causal suffix); cu_seqlens: ``[n + 1]`` documents.

    Returns:
        The :class:`~hf_hsap.plan.blocks.Blocks` over the flattened tokens.

    Raises:
        ValueError: a document whose type-0 tokens are not one run (its suffix would see a later prefix token).
    """
    flag = np.asarray(torch.as_tensor(types).detach().to("cpu").reshape(-1)) == 0
    cu = np.asarray(torch.as_tensor(cu_seqlens).detach().to("cpu"), dtype=np.int64)
    starts = flag & ~np.concatenate([[False], flag[:-1]])
    starts[cu[:-1]] = flag[cu[:-1]]  # a run at a document start starts there
    runs = np.add.reduceat(starts.astype(np.int64), cu[:-1]) if cu.size > 1 else np.zeros(0, np.int64)
    bad = np.flatnonzero(runs > 1)
    if bad.size:
        d = int(bad[0])
        raise ValueError(f"document {d} (tokens {cu[d]}..{cu[d + 1]} of the packed batch) has {int(runs[d])} separate "
                         "runs of token_type_ids == 0; a prefix-LM's prefix (image and prompt) is one run, its suffix "
                         "(type 1) after it: give the processor's token_type_ids")
    return blocks_from_mask(flag, cu)


def type_blocks(types: torch.Tensor, cu_seqlens: torch.Tensor, *, key: str) -> Blocks:
    """The bidirectional blocks of a family whose tokens of type 1 all see each other within a document (Molmo2:
    every image token of the document, ``mm_token_type_ids == 1``), which must be one run per document.

    Args:
        types: ``[B, L]`` token types; cu_seqlens: ``[n + 1]`` documents; key: the types' batch key (messages).

    Returns:
        The :class:`~hf_hsap.plan.blocks.Blocks` over the flattened tokens.

    Raises:
        ValueError: a document whose type-1 tokens are separate runs (e.g. two images with text between: the text
            would have to be outside a block that spans it, which contiguous blocks cannot say).
    """
    flag = np.asarray(torch.as_tensor(types).detach().to("cpu").reshape(-1)) == 1
    cu = np.asarray(torch.as_tensor(cu_seqlens).detach().to("cpu"), dtype=np.int64)
    starts = flag & ~np.concatenate([[False], flag[:-1]])
    starts[cu[:-1]] = flag[cu[:-1]]
    runs = np.add.reduceat(starts.astype(np.int64), cu[:-1]) if cu.size > 1 else np.zeros(0, np.int64)
    bad = np.flatnonzero(runs > 1)
    if bad.size:
        d = int(bad[0])
        raise ValueError(f"document {d} (tokens {cu[d]}..{cu[d + 1]} of the packed batch) has {int(runs[d])} separate "
                         f"runs of {key} == 1: this family's image tokens all attend to each other across the text "
                         "between them, which hf_hsap's contiguous blocks do not take yet; pack documents with one "
                         "image each (or one run of image tokens), or train such documents with one document per "
                         "row (no packing)")
    return blocks_from_mask(flag, cu)


def batch_blocks(layout: VisionLayout | None, batch: Mapping[str, Any], ids: torch.Tensor, cu_seqlens: torch.Tensor
                 ) -> Blocks | None:
    """The bidirectional blocks of a packed batch: image blocks (Gemma 3), prefixes (PaliGemma; none when the batch
    has no ``token_type_ids``: the model then runs every document causally) or ``None`` (a causal family)."""
    if layout is None:
        return None
    if layout.image_blocks:
        return image_blocks(layout, ids, cu_seqlens)
    if getattr(layout, "type_blocks", None):  # Molmo2: all of a document's image tokens (type 1), one run each
        types = batch.get(layout.type_blocks)
        return None if types is None else type_blocks(types, cu_seqlens, key=layout.type_blocks)
    if getattr(layout, "prefix_blocks", False):
        types = batch.get("token_type_ids")
        return Blocks((), ()) if types is None else prefix_blocks(types, cu_seqlens)
    return None


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(start, start + size)`` of each pair."""
    if sizes.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(starts - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes) + np.arange(int(sizes.sum()))


def _items(batch: Mapping[str, Any], layout: VisionLayout, ids: torch.Tensor
           ) -> list[tuple[Modality, torch.Tensor, np.ndarray, np.ndarray, np.ndarray]]:
    """Every modality with pixels in the batch: ``(modality, [N] global placeholder positions, [n_items]
    placeholders, pixel rows and patches of each item)``; an item's encoder work is its patches (a grid item's
    pixel rows, else its placeholders times ``layout.merge``).

    Raises:
        ValueError: placeholders of a modality without pixels, or placeholders that do not match the pixels.
    """
    out = []
    for m in layout.modalities:
        marks = m.placeholders(ids, batch)  # [B * L] placeholder flags (its id, or its per-token mask)
        if batch.get(m.pixel_key) is None:
            if bool(marks.any()):
                raise ValueError(f"the batch has {m.name} placeholder tokens ({m.marker}) but no {m.pixel_key}")
            continue
        where = torch.nonzero(marks).flatten()  # [N] global placeholder positions
        tokens, rows = item_sizes(m, layout, batch, int(where.numel()))
        out.append((m, where, tokens, rows, rows if m.grid_key is not None else tokens * layout.merge))
    return out


def item_work(batch: Mapping[str, Any], layout: VisionLayout, ids: torch.Tensor, *,
              encoding: str = "auto") -> ItemWork | None:
    """The encoder work of the batch's items, for the planner (``plan_sequence(..., items=...)``,
    :mod:`hf_hsap.plan.items`): each item's patches times its modality's ``patch_work``.

    Args:
        batch: the global batch. layout: its vision layout. ids: ``[B * L]`` global token ids.
        encoding: how a split item is encoded (``HSAPConfig.vision_encoding``).

    Returns:
        The :class:`~hf_hsap.plan.items.ItemWork`, or None where no item weighs (no pixels, or no modality's
        ``patch_work`` known).

    Raises:
        ValueError: as :func:`shard_vision`, before any plan is made.
    """
    ids = ids.detach().to("cpu").reshape(-1)
    found = [x for x in _items(batch, layout, ids) if x[0].patch_work > 0]
    if not found:
        return None
    positions, item, work, group = [], [], [], []
    for k, (m, where, tokens, _, patches) in enumerate(found):
        positions.append(where.numpy())
        item.append(np.repeat(np.arange(tokens.size), tokens) + sum(w.size for w in work))
        work.append(patches.astype(np.float64) * m.patch_work)
        group.append(np.full(tokens.size, k))
    return ItemWork.of(np.concatenate(positions), np.concatenate(item), np.concatenate(work), np.concatenate(group),
                       encoding=encoding)


def shard_vision(batch: Mapping[str, Any], layout: VisionLayout, ids: torch.Tensor, plan: Any, *,
                 rank: int | None = None, encoding: str = "auto") -> dict[str, Any]:
    """This rank's vision inputs and the feature rows it keeps.

    Args:
        batch: the global batch (pixels and per-item keys of every item, in document order).
        layout: the batch's :class:`~hf_hsap.data.vision.VisionLayout`.
        ids: ``[B * L]`` global token ids.
        plan: the batch's plan (``plan.shard(x, rank=r)``: ``[B * L, ...] -> [T_local, ...]`` of SP rank ``r``).
        rank: the plan's rank (``None``: the plan's own; an offline plan names it).
        encoding: how an item split across ranks is encoded (:data:`~hf_hsap.multimodal.exchange.ENCODINGS`,
            :func:`~hf_hsap.multimodal.exchange.route_items`).

    Returns:
        The local pixels and per-item keys of the items this rank encodes (a modality with no local placeholder
        is left out; where ``layout.empty_items``, one item whose rows it keeps none of) and
        ``{ROWS_KEY: {name: [n_local] int64, "name:items": [n_items] int64, "name:exchange"}}``: for each local
        placeholder, in local token order, the row of the encoded items' concatenated features (then the rows
        received) it takes; the placeholders of every encoded item (what the encoder's output is checked
        against); the rows sent and received, where any move.

    Raises:
        ValueError: placeholders that do not match the pixels.
    """
    check_pixel_keys(layout, [k for k, v in batch.items() if v is not None])
    size = plan.size if rank is None else max(plan.size, rank + 1)
    me = plan.rank if rank is None else rank
    ids = ids.detach().to("cpu")
    mods, sizes = [], {}
    for m, where, tokens, rows, patches in _items(batch, layout, ids):
        feature = torch.full((ids.numel(),), -1, dtype=torch.int64)
        feature[where] = torch.arange(where.numel())
        held = []
        for r in range(size):  # every rank's global feature row of each local placeholder, in local token order
            mine = plan.shard(feature, rank=r).to("cpu")
            held.append(mine[mine >= 0].numpy())
        mods.append(Holdings(m.name, tokens, patches, tuple(held)))
        sizes[m.name] = (m, tokens, rows)
    sp = getattr(plan, "sp", None)
    # its own counters (the SP group's comm_stats count the attention's KV)
    executor = None if sp is None or size == 1 else P2PExecutor(sp.group, sp.global_ranks, timeout_s=sp.timeout_s)
    price = VisionPrice.from_cost(getattr(plan, "cost", None))
    local: dict[str, Any] = {}
    rows_of: dict[str, Any] = {}
    routes = route_items(mods, size, me, encoding=encoding, price=price, executor=executor)
    for m, tokens, rows in sizes.values():
        route = routes.get(m.name)
        if route is None:
            if not layout.empty_items:
                continue
            items = np.argmin(rows)[None]  # a forward that requires the pixels: the cheapest item, none of its rows
            rows_of[m.name] = torch.zeros(0, dtype=torch.int64)
        else:
            items = route.items
            rows_of[m.name] = torch.from_numpy(route.rows)
            if route.exchange is not None:
                rows_of[exchange_key(m.name)] = route.exchange
        rows_of[items_key(m.name)] = torch.from_numpy(tokens[items])
        if m.name == "audio":
            rows_of[window_key(m.name)] = torch.from_numpy(_run_windows(where, np.asarray(tokens))[items])
        row_start = np.concatenate([[0], np.cumsum(rows)[:-1]])
        pixel_idx = torch.from_numpy(_ranges(row_start[items], rows[items]))
        pixels = batch[m.pixel_key]
        local[m.pixel_key] = pixels.index_select(m.axis(m.pixel_key), pixel_idx.to(pixels.device))
        item_idx = torch.from_numpy(items)
        token_start = np.concatenate([[0], np.cumsum(tokens)[:-1]])
        token_idx = torch.from_numpy(_ranges(token_start[items], tokens[items]))  # the items' placeholders
        for key in m.item_keys:
            if batch.get(key) is not None:
                value = torch.as_tensor(batch[key])
                index = token_idx if key in m.token_rows else item_idx  # Molmo2's pooling rows: per placeholder
                local[key] = value.index_select(0 if key in m.token_rows else m.axis(key), index.to(value.device))
    local[ROWS_KEY] = rows_of
    return local
