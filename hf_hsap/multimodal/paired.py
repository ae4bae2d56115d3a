"""Families whose every image comes in several pixel tensors of fixed sizes (DeepSeek-VL-Hybrid's low- and
high-resolution views: ``get_image_features(pixel_values, high_res_pixel_values)``), derived from the model.

Each view lists the images along axis 0 and every image takes the same number of placeholders (the aligner's
fixed query count), so a packed row carries the documents' images in document order in each view: the extra views
are per-item keys of the image modality (:class:`~hf_hsap.data.vision.Modality`), sharded with the pixels. Every
forward checks the encoder's rows per image against the placeholders (:mod:`.select`).
"""
from __future__ import annotations

import inspect

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec

__all__ = ["paired_spec"]


def paired_spec(model: torch.nn.Module, inner: torch.nn.Module, image_token: int) -> VisionSpec | None:
    """The spec of a family whose ``get_image_features`` requires pixel views besides ``pixel_values`` (each one
    the forward takes too), or ``None``.

    Args:
        model: the model; inner: its module with ``get_image_features``; image_token: the placeholder id.

    Returns:
        A uniform image modality (one entry per image along axis 0) whose per-item keys are the other views.
    """
    params = inspect.signature(inner.get_image_features).parameters
    forward = inspect.signature(type(model).forward).parameters
    views = tuple(n for n, p in params.items() if n != "pixel_values" and n.endswith("pixel_values")
                  and p.default is inspect.Parameter.empty and n in forward)
    if not views or "pixel_values" not in params:
        return None
    image = Modality("image", image_token, "pixel_values", item_keys=views, required=views)
    return VisionSpec(VisionLayout(str(model.config.model_type), (image,)))
