"""Families without a vision tower whose images are flattened patches embedded by one linear layer (Fuyu), derived
from the model: ``get_image_features(pixel_values)`` over a ``vision_embed_tokens`` ``nn.Linear`` of
``patch_size ** 2 * num_channels`` inputs.

Each image is ``pixel_values [1, patches, p * p * C]`` and every patch becomes one placeholder (the embeddings are
the encoder's ``last_hidden_state``, cut to a rank's rows by :mod:`.select`). The processor pads every image to one
size, so each image of a batch takes the same number of placeholders: a uniform modality along axis 0, whose
placeholders per image the collator checks (a batch of images of different patch counts is refused, naming the
document).
"""
from __future__ import annotations

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec

__all__ = ["patches_spec"]


def patches_spec(model: torch.nn.Module, inner: torch.nn.Module, image_token: int) -> VisionSpec | None:
    """The spec of a linear-patch-embedding family, or ``None``.

    Args:
        model: the model; inner: its module with ``get_image_features``; image_token: the placeholder id.

    Returns:
        A uniform image modality (one image per entry of axis 0, one placeholder per patch) with 1-D positions.
    """
    embed = getattr(inner, "vision_embed_tokens", None)
    config = model.config
    patch, channels = getattr(config, "patch_size", None), getattr(config, "num_channels", None)
    if not isinstance(embed, torch.nn.Linear) or not isinstance(patch, int) or not isinstance(channels, int) \
            or embed.in_features != patch * patch * channels:
        return None
    image = Modality("image", image_token, "pixel_values")
    return VisionSpec(VisionLayout(str(config.model_type), (image,)))
