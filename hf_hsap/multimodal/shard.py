"""Give each rank of an SP group the images whose placeholder tokens it holds.

The vision tower runs at the language model's entrance, on every rank, for only the items (images, videos) with a
placeholder on that rank. An item split across ranks is encoded whole by each of its holders, and each keeps the
feature rows of its own placeholders; the SP group's gradient reduction then sums the item's pieces. This module
computes, from the global batch and the plan, the local pixels and the feature rows each rank keeps
(``hsap_vision_rows``, applied by :mod:`.select`)::

    global row   | t t [i0 i0 i0 i0] t t [i1 i1] t |    placeholders of items i0 (4 rows) and i1 (2 rows)
    rank 0 holds | t t  i0 i0                       |    -> encodes i0, keeps feature rows [0, 1]
    rank 1 holds |            i0 i0  t t  i1 i1  t  |    -> encodes i0 and i1, keeps rows [2, 3, 4, 5]
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..data.cross import IMAGES_KEY
from ..data.vision import LAYOUT_KEY, TOKENS_KEY, VisionLayout, check_pixel_keys, item_sizes
from ..plan.blocks import Blocks, blocks_from_mask

__all__ = ["ROWS_KEY", "batch_blocks", "image_blocks", "items_key", "prefix_blocks", "shard_vision", "vision_keys"]

ROWS_KEY = "hsap_vision_rows"  # local batch key: {modality name: [n_local_placeholders] feature rows}


def items_key(name: str) -> str:
    """The ``hsap_vision_rows`` entry with the placeholders of every local item of modality ``name``."""
    return f"{name}:items"


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


def batch_blocks(layout: VisionLayout | None, batch: Mapping[str, Any], ids: torch.Tensor, cu_seqlens: torch.Tensor
                 ) -> Blocks | None:
    """The bidirectional blocks of a packed batch: image blocks (Gemma 3), prefixes (PaliGemma; none when the batch
    has no ``token_type_ids``: the model then runs every document causally) or ``None`` (a causal family)."""
    if layout is None:
        return None
    if layout.image_blocks:
        return image_blocks(layout, ids, cu_seqlens)
    if getattr(layout, "prefix_blocks", False):
        types = batch.get("token_type_ids")
        return Blocks((), ()) if types is None else prefix_blocks(types, cu_seqlens)
    return None


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(start, start + size)`` of each pair."""
    if sizes.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(starts - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes) + np.arange(int(sizes.sum()))


def shard_vision(batch: Mapping[str, Any], layout: VisionLayout, ids: torch.Tensor, shard: Any) -> dict[str, Any]:
    """This rank's vision inputs and the feature rows it keeps.

    Args:
        batch: the global batch (pixels and per-item keys of every item, in document order).
        layout: the batch's :class:`~hf_hsap.data.vision.VisionLayout`.
        ids: ``[B * L]`` global token ids.
        shard: ``plan.shard`` for this rank (``[B * L, ...] -> [T_local, ...]`` in plan order).

    Returns:
        The local pixels and per-item keys of the items with a local placeholder (a modality with none is left
        out) and ``{ROWS_KEY: {name: [n_local] int64, "name:items": [n_items] int64}}``: for each local
        placeholder, in local token order, the row of the local items' concatenated features it takes; and the
        placeholders of every local item (what the encoder's output is checked against).

    Raises:
        ValueError: placeholders that do not match the pixels.
    """
    check_pixel_keys(layout, [k for k, v in batch.items() if v is not None])
    local: dict[str, Any] = {}
    rows_of: dict[str, torch.Tensor] = {}
    ids = ids.detach().to("cpu")
    for m in layout.modalities:
        if batch.get(m.pixel_key) is None:
            if bool((ids == m.token_id).any()):
                raise ValueError(f"the batch has {m.name} placeholder tokens (id {m.token_id}) but no {m.pixel_key}")
            continue
        where = torch.nonzero(ids == m.token_id).flatten()  # [N] global placeholder positions
        tokens, rows = item_sizes(m, layout, batch, int(where.numel()))
        feature = torch.full((ids.numel(),), -1, dtype=torch.int64)
        feature[where] = torch.arange(where.numel())
        mine = shard(feature).to("cpu")  # [T_local] in local token order
        mine = mine[mine >= 0].numpy()  # global feature row of every local placeholder
        token_start = np.concatenate([[0], np.cumsum(tokens)[:-1]])
        item = np.searchsorted(token_start, mine, side="right") - 1  # the item of each local placeholder
        items = np.unique(item)  # local items, in document order
        if items.size == 0:
            continue
        new_start = np.zeros(tokens.size, dtype=np.int64)
        new_start[items] = np.concatenate([[0], np.cumsum(tokens[items])[:-1]])
        rows_of[m.name] = torch.from_numpy(mine - token_start[item] + new_start[item])
        rows_of[items_key(m.name)] = torch.from_numpy(tokens[items])
        row_start = np.concatenate([[0], np.cumsum(rows)[:-1]])
        pixel_idx = torch.from_numpy(_ranges(row_start[items], rows[items]))
        axis = m.item_axis if m.grid_key is None else 0  # a grid's pixel rows and per-item keys: axis 0
        pixels = batch[m.pixel_key]
        local[m.pixel_key] = pixels.index_select(axis, pixel_idx.to(pixels.device))
        item_idx = torch.from_numpy(items)
        for key in m.item_keys:
            if batch.get(key) is not None:
                value = torch.as_tensor(batch[key])
                local[key] = value.index_select(axis, item_idx.to(value.device))
    local[ROWS_KEY] = rows_of
    return local
