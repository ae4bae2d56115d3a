"""Families whose images are NaFlex patch rows with a patch grid per image (LFM2-VL's SigLIP 2 tower), derived from
the model: ``get_image_features(pixel_values, spatial_shapes, pixel_attention_mask)``.

The processor gives each image ``pixel_values [images, max_patches, C * p * p]`` (its patches, zero-padded to the
processor's most), ``pixel_attention_mask [images, max_patches]`` (its real patches) and ``spatial_shapes [images,
2]`` (its ``(h, w)`` in patches). The tower attends within each image (the mask) and the projector unshuffles
``factor x factor`` blocks, so an image takes ``(h // factor) * (w // factor)`` placeholders (the split the model's
``get_image_features`` makes, ``factor`` its ``downsample_factor``). A packed row carries the documents' images in
document order along axis 0, every key padded to the batch's most patches (the mask marks the padding), and counts
each image's placeholders from its ``spatial_shapes`` (:func:`~hf_hsap.multimodal.items.sizes_counter`); every
forward checks the encoder's rows per image against them (:mod:`.select`).
"""
from __future__ import annotations

import inspect

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec
from .items import sizes_counter

__all__ = ["naflex_spec"]

SHAPES_KEY = "spatial_shapes"
MASK_KEY = "pixel_attention_mask"


def naflex_spec(model: torch.nn.Module, inner: torch.nn.Module, image_token: int) -> VisionSpec | None:
    """The spec of a NaFlex family, or ``None`` when ``inner.get_image_features`` takes no ``spatial_shapes``.

    Args:
        model: the model; inner: its module with ``get_image_features``; image_token: the placeholder id.

    Returns:
        Images as a counted modality (one image per entry of axis 0, ``spatial_shapes`` and ``pixel_attention_mask``
        beside, pixels and mask padded to the batch's most patches) with 1-D positions.
    """
    params = inspect.signature(inner.get_image_features).parameters
    if SHAPES_KEY not in params:
        return None
    keys = (SHAPES_KEY, MASK_KEY) if MASK_KEY in params else (SHAPES_KEY,)
    image = Modality("image", image_token, "pixel_values", item_keys=keys, padded=("pixel_values", MASK_KEY))
    layout = VisionLayout(str(model.config.model_type), (image,), counted=("image",))
    factor = int(getattr(inner.config, "downsample_factor", None) or 1)
    return VisionSpec(layout, item_tokens=sizes_counter(factor, key=SHAPES_KEY))
