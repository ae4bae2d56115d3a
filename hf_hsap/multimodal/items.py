"""How many placeholders each image takes, for families whose images differ in that number (asked from the model).

A packed row carries several documents' images; the SP planner must know which placeholders belong to which image
before any encoder runs, so the collator counts them per image from the image's own metadata:

- any-resolution tiles (LLaVA-NeXT, LLaVA-NeXT-Video, LLaVA-OneVision, Granite 4 Vision): the model's own ``pack_image_features`` on
  one-channel zero features of the image's tiles (``image_size_to_num_patches`` of its ``image_sizes``), which
  applies the family's unpadding, newline rows and (OneVision) downsampling exactly as the forward does, at no
  encoder cost;
- image sizes (a Pixtral tower: Mistral 3, LightOnOCR, LLaVA with a Pixtral tower): the split the model's
  ``get_image_features`` makes, ``(height // r) * (width // r)`` with ``r`` its patch size times its
  ``spatial_merge_size``; the same over LFM2-VL's ``spatial_shapes`` (in patches) with ``r`` its
  ``downsample_factor`` (:mod:`.naflex`).

Every forward checks these counts against what the encoder returned (:func:`hf_hsap.multimodal.select.select_rows`),
so a count that disagreed with the model would stop training, never train on misplaced features.
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import torch

__all__ = ["ItemCounter", "anyres_counter", "sizes_counter"]

ItemCounter = Callable[[str, Mapping[str, Any]], list[int]]


def _sizes(ex: Mapping[str, Any], key: str = "image_sizes") -> torch.Tensor:
    """``[n_images, 2]`` (height, width) of one document (``key``: ``image_sizes``, LFM2-VL's ``spatial_shapes``)."""
    return torch.as_tensor(ex[key]).reshape(-1, 2).to("cpu", torch.int64)


def anyres_counter(inner: torch.nn.Module, *, one_image_per_document: bool = False) -> ItemCounter:
    """The placeholder counter of an any-resolution family.

    Args:
        inner: the module with ``pack_image_features`` (``model.model``).
        one_image_per_document: refuse a document with several images (LLaVA-OneVision encodes those without
            tiles, after the per-sample ``batch_num_images`` that a packed row does not carry per document).

    Returns:
        ``count(modality, document) -> [placeholders of each image]`` (``KeyError`` for another modality).
    """
    config = inner.config
    to_patches = sys.modules[type(inner).__module__].image_size_to_num_patches  # the model's own tile count
    tile = int(config.vision_config.image_size)
    side = tile // int(config.vision_config.patch_size)
    rate = getattr(config, "downsample_rate", None)  # Granite 4 Vision: its Q-Formers pool each tile's side by this
    if rate is not None and getattr(inner, "layerwise_projectors", None) is not None:  # (what pack_image_features
        side = int(side * Fraction(rate))  # assumes of its features)
    params = inspect.signature(inner.pack_image_features).parameters
    extra = {"vision_feature_select_strategy": getattr(config, "vision_feature_select_strategy", None),
             "vision_aspect_ratio": getattr(config, "vision_aspect_ratio", None)}
    extra = {k: v for k, v in extra.items() if k in params and v is not None}
    newline = torch.zeros(1) if getattr(inner, "image_newline", None) is not None else None

    def count(name: str, ex: Mapping[str, Any]) -> list[int]:
        if name != "image":
            raise KeyError(name)
        sizes = _sizes(ex)
        if one_image_per_document and len(sizes) > 1:
            raise ValueError(f"{config.model_type} encodes the {len(sizes)} images of one document without tiles "
                             "(batch_num_images), which a packed row does not carry per document yet; give each "
                             "document at most one image, or train such documents with one document per row")
        out = []
        for size in sizes:
            n_tiles = int(to_patches(image_size=size, grid_pinpoints=config.image_grid_pinpoints, patch_size=tile))
            feats = [torch.zeros(n_tiles, side * side, 1)]  # one channel: only the shapes matter
            with torch.no_grad():
                packed = inner.pack_image_features(feats, size[None], image_newline=newline, **extra)
            # (features, lengths), or one [rows, D] per image (Granite 4 Vision)
            out.append(int(packed[1][0]) if isinstance(packed, tuple) else int(packed[0].shape[0]))
        return out

    return count


def sizes_counter(ratio: int, *, key: str = "image_sizes") -> ItemCounter:
    """The placeholder counter of a family that splits its features by ``sizes // ratio``.

    Args:
        ratio: pixels (or patches) per placeholder side (Pixtral: the tower's patch size times the projector's
            merge; LFM2-VL: its ``downsample_factor`` over ``spatial_shapes`` in patches).
        key: the per-image ``[n, 2]`` sizes (``image_sizes``; ``spatial_shapes``).

    Returns:
        ``count(modality, document) -> [placeholders of each image]`` (``KeyError`` for another modality).
    """
    def count(name: str, ex: Mapping[str, Any]) -> list[int]:
        if name != "image":
            raise KeyError(name)
        return (_sizes(ex, key) // ratio).prod(dim=-1).tolist()

    return count
