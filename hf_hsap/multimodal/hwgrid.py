"""Families whose images are flattened patches with an ``(h, w)`` patch grid per image (Nemotron-H Omni's RADIO
tower), derived from the model: ``get_image_features(pixel_values, image_grid_hw)``.

Each image is ``h * w`` rows of ``pixel_values [patches, C * p * p]`` with ``image_grid_hw [images, 2]``; the
tower attends within each image, and the pixel shuffle of ``downsample_ratio`` merges ``(1 / ratio) ** 2`` patches
into one placeholder, so an image takes ``h * w / merge`` placeholders. A packed row carries the documents' patch
rows in document order with their grids stacked (a grid modality of 2 columns); positions restart per document
(the model has no rope index). Every forward checks the encoder's rows per image against the placeholders
(:mod:`.select`).
"""
from __future__ import annotations

import inspect

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec

__all__ = ["GRID_KEY", "hw_grid_spec"]

GRID_KEY = "image_grid_hw"


def hw_grid_spec(model: torch.nn.Module, inner: torch.nn.Module, image_token: int) -> VisionSpec | None:
    """The spec of an ``(h, w)`` patch-grid family, or ``None`` when ``inner.get_image_features`` takes no
    ``image_grid_hw`` or the config names no ``downsample_ratio``.

    Args:
        model: the model; inner: its module with ``get_image_features``; image_token: the placeholder id.

    Returns:
        Images as a grid modality of ``[h, w]`` cells, one pixel row per cell, ``merge`` cells per placeholder.
    """
    ratio = getattr(model.config, "downsample_ratio", None)
    if GRID_KEY not in inspect.signature(inner.get_image_features).parameters or not ratio:
        return None
    side = round(1 / float(ratio))
    image = Modality("image", image_token, "pixel_values", GRID_KEY, (GRID_KEY,), grid_dims=2)
    return VisionSpec(VisionLayout(str(model.config.model_type), (image,), merge=side * side))
