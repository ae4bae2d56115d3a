"""What a packed image / video + text batch carries (:mod:`.vision_pack` packs the documents' processor outputs).

A vision-language model's processor turns one document into ``input_ids`` with placeholder tokens (one per
feature row the vision tower will produce) and the pixels those placeholders stand for. Packing several such
documents into a row keeps the pixels in document order, so that the k-th placeholder of the row is still the
k-th feature row of the vision tower. This module is model-free: the model's knowledge (token ids, merge factor,
its own rope index) arrives as a :class:`VisionSpec`, built by :func:`hf_hsap.multimodal.vision_spec`.

Two items of a modality differ only in size: a *grid* family (Qwen-VL) gives each item a ``[t, h, w]`` grid of
``t*h*w`` pixel rows and ``t*h*w / merge`` placeholders; other families give each item one entry along the
modality's item axis (``[n, C, H, W]`` for LLaVA and Gemma 3, ``[n, tiles, C, H, W]`` for LLaVA-NeXT,
``[1, n, C, H, W]`` for Idefics) with every per-item key (``image_sizes``, ``pixel_attention_mask``) beside it.
Their placeholders per item are either the same for every item (LLaVA) or counted per item by the model's
:attr:`VisionSpec.item_tokens` (LLaVA-NeXT's any-resolution tiles, Pixtral's image sizes); the batch then carries
the counts (``hsap_vision_tokens``). Keys whose non-item dimensions differ between documents (LLaVA-NeXT's tile
count, Pixtral's height and width) are zero-padded to the batch's largest, as the family's processor pads a batch.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["LAYOUT_KEY", "PIXEL_KEYS", "TOKENS_KEY", "Modality", "VisionLayout", "VisionSpec", "check_pixel_keys",
           "item_sizes"]

LAYOUT_KEY = "hsap_vision"  # the batch key of the VisionLayout (consumed by shard_batch)
TOKENS_KEY = "hsap_vision_tokens"  # batch key: {modality name: [n_items] placeholders of each item} (counted items)


@dataclass(frozen=True)
class Modality:
    """One kind of vision input of a model.

    Attributes:
        name: ``"image"`` or ``"video"`` (what the model's ``get_{name}_features`` encodes).
        token_id: the placeholder token.
        pixel_key: the batch key of the pixels (``pixel_values``, ``pixel_values_videos``).
        grid_key: the per-item ``[n, 3]`` grid (``image_grid_thw``), or ``None`` (one pixel row per item).
        item_keys: every batch key with one entry per item (the grid first, e.g. ``second_per_grid_ts``).
        type_id: the value of this modality in ``mm_token_type_ids``.
        item_axis: the axis of the pixels and of every per-item key that lists the items (0; Idefics' ``[rows,
            images, C, H, W]``: 1), for a modality without a grid.
        padded: the keys (pixels or per-item) whose other dimensions may differ between documents, zero-padded to
            the batch's largest (the model reads each item's true extent from another key, e.g. ``image_sizes``).
        grid_dims: the columns of a grid (Qwen-VL's ``[t, h, w]``: 3; MiniCPM-V's ``target_sizes`` ``[h, w]``: 2);
            an item has the product of its grid's cells.
        pixel_axis: the axis of the pixels along which a grid item's cells lie (0; MiniCPM-V's NaViT row
            ``[1, C, p, cells * p]``: 3).
        cell_size: pixel entries per grid cell along ``pixel_axis`` (1; MiniCPM-V: its patch size ``p``).
        required: per-item keys the encoder cannot run without (DeepSeek-VL-Hybrid's ``high_res_pixel_values``): a
            document holding items without one is refused.
        keep_key: the per-item ``[n_items, rows]`` mask of the encoder's rows the model keeps (VideoLLaMA3's
            ``video_compression_mask``, carried per item by :mod:`hf_hsap.multimodal.grid_rows`), applied to each
            item's rows before the placeholders take them, or ``None``.
        mark_key: the per-token key whose entries equal to 1 mark this modality's placeholders, for a model that
            places its features by a mask instead of a token id (Kosmos-2's ``image_embeds_position_mask``;
            ``token_id`` is then -1), or ``None``.
        time_merge: a grid item's temporal patches merged into one placeholder row after the layout's spatial merge
            (ERNIE-4.5-VL's videos: its resampler's ``temporal_merge_size``), 1 without: an item has
            ``cells / (merge * time_merge)`` placeholders.
        rows_key: a per-item key giving each item's entries along the item axis of the pixels (Molmo2's
            ``image_num_crops``: an image is that many crops), or ``None`` (one entry per item).
        token_rows: per-item keys with one entry per placeholder of the item along axis 0 (Molmo2's
            ``image_token_pooling``: the patches each placeholder pools, indices into the item's own patches).
        patch_work: one patch (pixel row of a grid item; a placeholder's ``merge`` patches otherwise) through the
            modality's tower, forward + backward, in decoder tokens (:func:`hf_hsap.plan.items.encoder_patch_work`,
            set by ``vision_spec``); the SP planner balances it with the decoder's work. 0: not weighed.
    """

    name: str
    token_id: int
    pixel_key: str
    grid_key: str | None = None
    item_keys: tuple[str, ...] = ()
    type_id: int = 1
    item_axis: int = 0
    padded: tuple[str, ...] = ()
    grid_dims: int = 3
    pixel_axis: int = 0
    cell_size: int = 1
    required: tuple[str, ...] = ()
    keep_key: str | None = None
    mark_key: str | None = None

    @property
    def marker(self) -> str:
        """What marks this modality's placeholders, for messages: ``id 5`` or ``image_embeds_position_mask == 1``."""
        return f"id {self.token_id}" if self.mark_key is None else f"{self.mark_key} == 1"

    def placeholders(self, ids: Any, source: Mapping[str, Any]) -> Any:
        """Which of ``ids`` are this modality's placeholders.

        Args:
            ids: token ids (a tensor or a numpy array, any shape); source: the example or batch holding
                :attr:`mark_key` for ``ids`` (same number of entries), read only for a marked modality.

        Returns:
            A bool tensor / array shaped as ``ids`` (a marked modality without its mask in ``source``: none).
        """
        if self.mark_key is None:
            return ids == self.token_id
        mark = source.get(self.mark_key)
        if isinstance(ids, np.ndarray):
            if mark is None:
                return np.zeros(ids.shape, dtype=bool)
            return np.asarray(torch.as_tensor(mark).detach().to("cpu")).reshape(ids.shape) == 1
        if mark is None:
            return torch.zeros_like(ids, dtype=torch.bool)
        return torch.as_tensor(mark).to(ids.device).reshape(ids.shape) == 1
    time_merge: int = 1
    rows_key: str | None = None
    token_rows: tuple[str, ...] = ()
    patch_work: float = 0.0

    def axis(self, key: str) -> int:
        """The axis along which batch key ``key`` (the pixels or a per-item key) lists this modality's items (a
        grid's pixel cells: ``pixel_axis``; its per-item keys: 0)."""
        if self.grid_key is None:
            return self.item_axis
        return self.pixel_axis if key == self.pixel_key else 0

    def grid_cells(self, grid: Any) -> torch.Tensor:
        """``[n_items]`` int64 cells of each item of a grid (the product of its ``grid_dims`` columns)."""
        return torch.as_tensor(grid).reshape(-1, self.grid_dims).to("cpu", torch.int64).prod(dim=1)


@dataclass(frozen=True)
class VisionLayout:
    """The picklable part of a :class:`VisionSpec` that a packed batch carries (key ``hsap_vision``), all
    that :func:`hf_hsap.shard_batch` needs to give each rank its images.

    Attributes:
        family: ``config.model_type``.
        modalities: the model's vision inputs.
        merge: pixel rows per placeholder token of a grid family (``spatial_merge_size ** 2``), else 1.
        image_blocks: image placeholders attend to each other bidirectionally (Gemma 3's ``token_type_ids``).
        prefix_blocks: a prefix-LM: each document's tokens of type 0 (PaliGemma's ``token_type_ids``: image and
            prompt) attend to each other bidirectionally, the rest (type 1, the suffix) causally.
        counted: the modalities whose placeholders per item :attr:`VisionSpec.item_tokens` counts.
        cross_key: the per-token, per-image mask of a family whose text attends to its images through
            cross-attention (Mllama's ``cross_attention_mask``, Idefics' ``image_attention_mask``: :mod:`.cross`; its
            placeholder ``token_id`` may be -1, none), or ``None``.
        position_start: the first position the model gives a document called alone (PaliGemma's are 1-indexed):
            ``shard_batch`` adds it to the collator's 0-based positions.
        empty_items: the model's forward requires the pixels (BLIP-2, InstructBLIP): a rank holding no item of a
            modality gets the batch's cheapest item and keeps none of its feature rows (its towers take no empty
            batch), rather than no pixels.
        rope_rows_only: the text model takes its multimodal rotary rows alone, not Transformers' packed
            ``[1 + rows, B, L]`` (HunYuan-VL): ``shard_batch`` gives the model the local positions without row 0 (the
            text positions it read the documents from).
        type_blocks: the per-token type key whose tokens of type 1 attend to each other bidirectionally within a
            document (Molmo2's ``mm_token_type_ids``: all of a document's image tokens, one run per document), or
            ``None``.
    """

    family: str
    modalities: tuple[Modality, ...]
    merge: int = 1
    image_blocks: bool = False
    prefix_blocks: bool = False
    counted: tuple[str, ...] = ()
    cross_key: str | None = None
    position_start: int = 0
    empty_items: bool = False
    rope_rows_only: bool = False
    type_blocks: str | None = None


@dataclass(frozen=True)
class VisionSpec:
    """What the packing collator needs to know of a vision-language model.

    Attributes:
        layout: the :class:`VisionLayout` the batch carries.
        rope_index: ``(input_ids [1, n], **doc) -> [3, 1, n]`` multimodal rotary positions of ONE document (the
            model's own ``get_rope_index``), or ``None`` for 1-D positions.
        token_type_key: the per-token type key the model reads (``mm_token_type_ids``, ``token_type_ids``) or
            ``None``; the collator fills it from the placeholders when a document lacks it.
        item_tokens: ``(modality name, {key: one document's value}) -> [placeholders of each item]`` for a
            family whose items of one modality take different numbers of placeholders (derived from the model,
            :mod:`hf_hsap.multimodal.items`), or ``None`` (grids, or the same number for every item). A
            modality it does not count raises ``KeyError``.
        document: ``(example, n) -> example``: how the collator first rewrites each processor output into the
            layout's modalities (GLM-4V's video frames as images: :func:`hf_hsap.multimodal.grid.frames_as_images`),
            or ``None``.
        uncarried: keys the model's forward takes that packed rows do not carry (yet): a document holding one is
            refused by the collator, never packed without it.
        token_keys: further per-token keys the model reads, ``{key: {token id: type}}`` (ERNIE-4.5-VL's
            ``moe_mm_token_type_ids``, :mod:`hf_hsap.multimodal.markers`): the collator carries each document's own
            and fills a missing one from these token ids (0 elsewhere, and on padding).
    """

    layout: VisionLayout
    rope_index: Callable[..., torch.Tensor] | None = field(default=None, compare=False)
    token_type_key: str | None = None
    item_tokens: Callable[[str, Mapping[str, Any]], list[int]] | None = field(default=None, compare=False)
    document: Callable[[Mapping[str, Any], int], dict[str, Any]] | None = field(default=None, compare=False)
    uncarried: tuple[str, ...] = ()
    token_keys: Mapping[str, Mapping[int, int]] = field(default_factory=dict, compare=False)

    def counts(self, name: str) -> bool:
        """Whether the items of modality ``name`` are counted by :attr:`item_tokens`."""
        return self.item_tokens is not None and name in self.layout.counted


PIXEL_KEYS = ("pixel_values", "pixel_values_videos")  # the batch keys of pixels any modality can carry


def check_pixel_keys(layout: VisionLayout, keys: Any) -> None:
    """Refuse pixels of a modality the layout does not carry (a family's videos that are not made exact yet).

    Args:
        layout: the model's layout; keys: the keys present in the examples or batch.

    Raises:
        ValueError: with the fix.
    """
    known = {m.pixel_key for m in layout.modalities}
    other = sorted({k for k in keys if k in PIXEL_KEYS and k not in known})
    if other:
        raise ValueError(f"{layout.family}: {other} on packed rows are not made exact yet (only "
                         f"{sorted(known)}); train these documents with one document per row (no packing)")


def item_sizes(modality: Modality, layout: VisionLayout, batch: Mapping[str, Any], n_tokens: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Placeholder tokens and pixel rows of every item of one modality in a batch.

    Args:
        modality: the modality; layout: its layout; batch: with ``modality.pixel_key`` (and the grid, or the
            counted items' ``hsap_vision_tokens``); n_tokens: the placeholders of this modality in the batch (what
            uniform items split evenly).

    Returns:
        ``(tokens [n_items], rows [n_items])`` int64 (rows: a grid item's pixel entries along its pixel axis, else 1
        entry along the item axis).

    Raises:
        ValueError: the placeholders do not match the items.
    """
    pixels = batch[modality.pixel_key]
    counted = (batch.get(TOKENS_KEY) or {}).get(modality.name)
    if modality.grid_key is not None:
        cells = modality.grid_cells(batch[modality.grid_key]).numpy()
        rows = cells * modality.cell_size
        tokens = cells // (layout.merge * modality.time_merge)
        if counted is not None:  # a grid whose placeholders the model counts per item (:mod:`..multimodal.grid_rows`)
            tokens = torch.as_tensor(counted).reshape(-1).to("cpu", torch.int64).numpy()
            if tokens.size != cells.size:
                raise ValueError(f"the batch counts the placeholders of {tokens.size} {modality.name}s but its "
                                 f"{modality.grid_key} holds {cells.size}; pack the documents with "
                                 "PackingCollator(max_length, vision=hf_hsap.vision_spec(model))")
    elif counted is not None:
        tokens = torch.as_tensor(counted).reshape(-1).to("cpu", torch.int64).numpy()
        rows = np.ones(tokens.size, dtype=np.int64) if modality.rows_key is None else \
            torch.as_tensor(batch[modality.rows_key]).reshape(-1).to("cpu", torch.int64).numpy()
        if rows.size != tokens.size or int(rows.sum()) != int(pixels.shape[modality.item_axis]):
            raise ValueError(f"the batch counts the placeholders of {tokens.size} {modality.name}s but its "
                             f"{modality.pixel_key} holds {int(pixels.shape[modality.item_axis])} entries for "
                             f"{int(rows.sum())}; pack the documents with PackingCollator(max_length, "
                             "vision=hf_hsap.vision_spec(model))")
    else:
        n_items = int(pixels.shape[modality.item_axis])
        if n_items == 0 or n_tokens % n_items:
            raise ValueError(f"{n_tokens} {modality.name} placeholder tokens do not split evenly over {n_items} "
                             f"{modality.pixel_key} items; give each {modality.name} its processor's placeholders")
        tokens = np.full(n_items, n_tokens // n_items, dtype=np.int64)
        rows = np.ones(n_items, dtype=np.int64)
    if int(tokens.sum()) != n_tokens:
        raise ValueError(f"the batch has {n_tokens} {modality.name} placeholder tokens ({modality.marker}) but "
                         f"its {modality.pixel_key} stand for {int(tokens.sum())}; tokenize each document with the "
                         "model's processor and keep its pixels with it")
    return tokens, rows
