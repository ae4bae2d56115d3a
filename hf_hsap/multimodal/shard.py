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
from ..data.vision import LAYOUT_KEY, TOKENS_KEY, VisionLayout, check_pixel_keys, item_sizes
from ..plan.blocks import Blocks, blocks_from_mask
from .exchange import Holdings, VisionPrice, route_items

__all__ = ["ROWS_KEY", "exchange_key", "image_blocks", "items_key", "shard_vision", "vision_keys"]

ROWS_KEY = "hsap_vision_rows"  # local batch key: {modality name: [n_local_placeholders] feature rows}


def items_key(name: str) -> str:
    """The ``hsap_vision_rows`` entry with the placeholders of every item of modality ``name`` this rank encodes."""
    return f"{name}:items"


def exchange_key(name: str) -> str:
    """The ``hsap_vision_rows`` entry with this rank's :class:`~.exchange.RowExchange` of modality ``name``."""
    return f"{name}:exchange"


def vision_keys(layout: VisionLayout) -> set[str]:
    """Every batch key :func:`shard_vision` replaces (pixels and per-item keys)."""
    return {key for m in layout.modalities for key in (m.pixel_key, *m.item_keys)} | {LAYOUT_KEY, TOKENS_KEY}


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


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(start, start + size)`` of each pair."""
    if sizes.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.repeat(starts - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes) + np.arange(int(sizes.sum()))


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
        is left out) and ``{ROWS_KEY: {name: [n_local] int64, "name:items": [n_items] int64, "name:exchange"}}``:
        for each local placeholder, in local token order, the row of the encoded items' concatenated features
        (then the rows received) it takes; the placeholders of every encoded item (what the encoder's output is
        checked against); the rows sent and received, where any move.

    Raises:
        ValueError: placeholders that do not match the pixels.
    """
    check_pixel_keys(layout, [k for k, v in batch.items() if v is not None])
    size = plan.size if rank is None else max(plan.size, rank + 1)
    me = plan.rank if rank is None else rank
    ids = ids.detach().to("cpu")
    mods, sizes = [], {}
    for m in layout.modalities:
        if batch.get(m.pixel_key) is None:
            if bool((ids == m.token_id).any()):
                raise ValueError(f"the batch has {m.name} placeholder tokens (id {m.token_id}) but no {m.pixel_key}")
            continue
        where = torch.nonzero(ids == m.token_id).flatten()  # [N] global placeholder positions
        tokens, rows = item_sizes(m, layout, batch, int(where.numel()))
        feature = torch.full((ids.numel(),), -1, dtype=torch.int64)
        feature[where] = torch.arange(where.numel())
        held = []
        for r in range(size):  # every rank's global feature row of each local placeholder, in local token order
            mine = plan.shard(feature, rank=r).to("cpu")
            held.append(mine[mine >= 0].numpy())
        patches = rows if m.grid_key is not None else tokens * layout.merge  # encoder work: patches
        mods.append(Holdings(m.name, tokens, patches, tuple(held)))
        sizes[m.name] = (m, tokens, rows)
    sp = getattr(plan, "sp", None)
    # its own counters (the SP group's comm_stats count the attention's KV)
    executor = None if sp is None or size == 1 else P2PExecutor(sp.group, sp.global_ranks, timeout_s=sp.timeout_s)
    price = VisionPrice.from_cost(getattr(plan, "cost", None))
    local: dict[str, Any] = {}
    rows_of: dict[str, Any] = {}
    for name, route in route_items(mods, size, me, encoding=encoding, price=price, executor=executor).items():
        m, tokens, rows = sizes[name]
        items = route.items
        rows_of[m.name] = torch.from_numpy(route.rows)
        rows_of[items_key(m.name)] = torch.from_numpy(tokens[items])
        if route.exchange is not None:
            rows_of[exchange_key(m.name)] = route.exchange
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
