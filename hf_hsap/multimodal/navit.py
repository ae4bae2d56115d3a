"""Families whose images are NaViT-packed crops with a patch grid per crop (MiniCPM-V 4.6 / 4.7, MiniCPM-OCR),
derived from the model: ``get_image_features(pixel_values, target_sizes)``.

The processor lays every crop's ``p x p`` patches side by side in one pixel row, ``pixel_values [1, C, p,
sum(h * w) * p]``, with ``target_sizes [crops, 2]`` the ``(h, w)`` of each crop in patches. The tower attends
within each crop (``cu_seqlens`` over the crops), merges ``2 x 2`` windows (its ViT merger, unless the
``downsample_mode`` is ``"4x"``) and the projector merges ``merge_kernel_size`` blocks ``merger_times`` times, so a
crop takes ``h * w / merge`` placeholders. A packed row is one such pixel row: the documents' crops in document
order along the last axis, their ``target_sizes`` stacked (a grid of ``[h, w]`` with ``p`` pixel columns per cell,
:class:`~hf_hsap.data.vision.Modality`). A split crop is encoded whole by each holder (:mod:`.shard`); every forward
checks the encoder's rows per crop against the placeholders (:mod:`.select`).
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec

__all__ = ["navit_merge", "navit_spec"]

GRID_KEY = "target_sizes"


def _size(value: Any) -> int:
    """One side of a square kernel or patch (``int`` or ``[k, k]``)."""
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def navit_merge(inner: torch.nn.Module) -> int:
    """Patches per placeholder of a NaViT family: the ViT window merger's window (when the tower applies it) times
    the projector's ``merge_kernel_size`` block per merge round (read from the model's modules and config, as its
    ``get_image_features`` applies them).

    Args:
        inner: the module with ``get_image_features`` (``model.model``).
    """
    config = inner.config
    merge = _size(inner.merger.merge_kernel_size) ** (2 * int(inner.merger.merger_times))
    tower = inner.vision_tower
    uses_window = getattr(config, "downsample_mode", None) != "4x" and 0 <= int(tower.config.insert_layer_id)
    if uses_window:
        merge *= _size(tower.vit_merger.window_kernel_size) ** 2
    return merge


def navit_spec(model: torch.nn.Module, inner: torch.nn.Module, image_token: int) -> VisionSpec | None:
    """The spec of a NaViT family, or ``None`` when ``inner.get_image_features`` takes no ``target_sizes``.

    Args:
        model: the model; inner: its module with ``get_image_features``; image_token: the placeholder id.

    Returns:
        Images as a grid modality (``target_sizes`` ``[h, w]`` cells of ``patch_size`` pixel columns along the last
        axis of ``[1, C, p, columns]``) and, where the model has one (MiniCPM-V 4.7's canvas M-RoPE), its own rope
        index per document over ``mm_token_type_ids``.
    """
    if GRID_KEY not in inspect.signature(inner.get_image_features).parameters:
        return None
    patch = _size(inner.config.vision_config.patch_size)
    image = Modality("image", image_token, "pixel_values", GRID_KEY, (GRID_KEY,), grid_dims=2, pixel_axis=3,
                     cell_size=patch)
    layout = VisionLayout(str(model.config.model_type), (image,), merge=navit_merge(inner))
    rope = None
    if callable(getattr(inner, "get_rope_index", None)):
        def rope(**doc: Any) -> torch.Tensor:
            return inner.get_rope_index(**doc)[0]  # [3, 1, n]
    takes_types = "mm_token_type_ids" in inspect.signature(type(model).forward).parameters
    return VisionSpec(layout, rope_index=rope, token_type_key="mm_token_type_ids" if takes_types else None)
