"""Families that query each image with a Q-Former (BLIP-2, InstructBLIP), derived from the model: a ``qformer``
sub-model and ``config.num_query_tokens``.

Every image becomes ``num_query_tokens`` placeholders (the Q-Former's query outputs), so a packed row carries the
documents' images in document order along axis 0, each counted at ``num_query_tokens``. InstructBLIP also feeds
each image's instruction to the Q-Former (``qformer_input_ids [images, length]`` with its
``qformer_attention_mask``, required with it here): per-item keys, zero-padded to the batch's longest instruction,
the mask hiding the padding as the processor's batch does. Their forwards require the pixels, so a rank holding no
image encodes one and keeps none of its rows (:attr:`~hf_hsap.data.vision.VisionLayout.empty_items`).
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec
from .structure import token

__all__ = ["qformer_spec", "video_qformer_probe_inputs", "video_qformer_spec"]

IDS_KEY, MASK_KEY = "qformer_input_ids", "qformer_attention_mask"


def qformer_spec(model: torch.nn.Module, inner: torch.nn.Module, image_token: int) -> VisionSpec | None:
    """The spec of a Q-Former family, or ``None`` (no ``qformer`` sub-model with ``num_query_tokens`` queries).

    Args:
        model: the model; inner: its module with ``get_image_features``; image_token: the placeholder id.

    Returns:
        Images as a counted modality (``num_query_tokens`` each) with the Q-Former's prompt as per-item keys where
        ``get_image_features`` takes one; 1-D positions.
    """
    queries = getattr(model.config, "num_query_tokens", None)
    if getattr(inner, "qformer", None) is None or not isinstance(queries, int):
        return None
    keys = (IDS_KEY, MASK_KEY) if IDS_KEY in inspect.signature(inner.get_image_features).parameters else ()
    image = Modality("image", image_token, "pixel_values", item_keys=keys, padded=keys)
    pixels = inspect.signature(type(model).forward).parameters.get("pixel_values")
    required = pixels is not None and pixels.default is inspect.Parameter.empty
    layout = VisionLayout(str(model.config.model_type), (image,), counted=("image",), empty_items=required)

    def count(name: str, ex: Mapping[str, Any]) -> list[int]:
        if name != "image":
            raise KeyError(name)
        return [queries] * int(torch.as_tensor(ex["pixel_values"]).shape[0])

    return VisionSpec(layout, item_tokens=count)


def video_qformer_spec(model: torch.nn.Module, inner: torch.nn.Module) -> VisionSpec | None:
    """The spec of a Q-Former family that encodes videos only (InstructBLIP-Video), or ``None`` (an image encoder,
    no ``qformer`` with ``num_query_tokens``, or no video placeholder).

    Args:
        model: the model; inner: its module with ``get_video_features``.

    Returns:
        Videos as a counted modality (``num_query_tokens`` rows per frame) under the forward's pixel key, with the
        Q-Former's prompt as per-item keys; 1-D positions.
    """
    queries = getattr(model.config, "num_query_tokens", None)
    encode = getattr(type(inner), "get_video_features", None)
    video = token(model.config, "video_token_id", "video_token_index")
    if callable(getattr(type(inner), "get_image_features", None)) or not callable(encode) or video is None or \
            getattr(inner, "qformer", None) is None or not isinstance(queries, int):
        return None
    params = inspect.signature(encode).parameters
    pixel_key = next(iter(n for n in params if n != "self"))  # the videos: get_video_features' first input
    keys = (IDS_KEY, MASK_KEY) if IDS_KEY in params else ()
    mod = Modality("video", video, pixel_key, item_keys=keys, padded=keys, type_id=2)
    pixels = inspect.signature(type(model).forward).parameters.get(pixel_key)
    required = pixels is not None and pixels.default is inspect.Parameter.empty
    layout = VisionLayout(str(model.config.model_type), (mod,), counted=("video",), empty_items=required)

    def count(name: str, ex: Mapping[str, Any]) -> list[int]:
        if name != "video":
            raise KeyError(name)
        shape = torch.as_tensor(ex[pixel_key]).shape  # [videos, frames, C, H, W]
        return [queries * int(shape[1])] * int(shape[0])

    return VisionSpec(layout, item_tokens=count)


def video_qformer_probe_inputs(model: torch.nn.Module, spec: VisionSpec, device: torch.device, dtype: torch.dtype
                               ) -> dict[str, Any] | None:
    """``check_model``'s probe inputs for a video Q-Former family: one one-frame video of the tower's size with a
    one-token instruction, its placeholders between two text tokens; ``None`` without a vision image size."""
    video = spec.layout.modalities[0]
    vision = getattr(model.config, "vision_config", None)
    size = getattr(vision, "image_size", None)
    if not isinstance(size, int):
        return None
    pixels = torch.zeros(1, 1, int(getattr(vision, "num_channels", 3)), size, size, device=device, dtype=dtype)
    n = spec.item_tokens("video", {video.pixel_key: pixels})[0]
    out = {"input_ids": torch.tensor([[1] + [video.token_id] * n + [1]], device=device), video.pixel_key: pixels}
    if IDS_KEY in video.item_keys:
        out[IDS_KEY] = torch.ones(1, 1, dtype=torch.long, device=device)
        out[MASK_KEY] = torch.ones(1, 1, dtype=torch.long, device=device)
    return out
