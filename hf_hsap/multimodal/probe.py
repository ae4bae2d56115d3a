"""The inputs of ``check_model``'s probe forward for a multimodal model: two text tokens with one smallest item
between them, in the input kind its :func:`~.spec.vision_spec` derived (the decoder must get the forward's keyword
arguments with images too).
"""
from __future__ import annotations

import sys
from typing import Any

import torch

from .audio import audio_probe_inputs
from .cross import cross_probe_inputs
from .encoder_rows import feature_rows, taken_image
from .indicators import boundary_ids, has_indicators
from .marked import marked_probe_inputs
from .pooled import pooled_probe_inputs
from .qformer import video_qformer_probe_inputs
from .spec import vision_spec
from .structure import inner_vlm

__all__ = ["probe_inputs"]


def probe_inputs(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> dict[str, Any] | None:
    """A two-text-token forward's inputs with one smallest image between them, for ``check_model``'s probe (the
    decoder must get the keyword arguments with images too); ``None`` for a model without a vision spec.

    Args:
        model: the model; device, dtype: where and in which dtype its pixels go.

    Returns:
        ``model(**inputs)`` keyword arguments (zero pixels), or ``None``.
    """
    try:
        spec = vision_spec(model)
    except ValueError:
        return None
    if spec.layout.cross_key is not None:  # cross-attention (Mllama, Idefics)
        return cross_probe_inputs(model, spec, device, dtype)
    if spec.layout.modalities[0].mark_key is not None:  # images placed by a per-token mask (Kosmos-2)
        return marked_probe_inputs(model, spec, device, dtype)
    if spec.layout.modalities[0].name == "video":  # videos only (InstructBLIP-Video's Q-Former)
        return video_qformer_probe_inputs(model, spec, device, dtype)
    if spec.layout.modalities[0].name == "audio":  # an audio-language model: one clip
        return audio_probe_inputs(model, spec, device, dtype)
    image = spec.layout.modalities[0]
    if image.token_rows:  # Molmo2: crops whose placeholders pool chosen patches
        return pooled_probe_inputs(model, spec, device, dtype)
    vision = model.config.vision_config
    extra: dict[str, Any] = {}
    taken = taken_image(model)
    if taken is not None:  # the image the encoder took when the spec was derived
        pixels, given, n_tokens = taken
        extra = {k: v.to(device) for k, v in given.items()}
    elif image.grid_key is not None and image.pixel_axis == 3:  # NaViT: one crop of one merge block [1, C, p, cells*p]
        side = int(round(spec.layout.merge ** 0.5))
        pixels = torch.zeros(1, getattr(vision, "num_channels", 3), image.cell_size, side * side * image.cell_size)
        extra[image.grid_key] = torch.tensor([[side, side]], device=device)
        n_tokens = 1
    elif image.grid_key is not None and image.grid_dims == 2:  # (h, w) grid (.hwgrid): one merge block's patch rows
        side = int(round(spec.layout.merge ** 0.5))
        channels = getattr(vision, "num_channels", 3)
        pixels = torch.zeros(side * side, channels * vision.patch_size ** 2)
        extra[image.grid_key] = torch.tensor([[side, side]], device=device)
        n_tokens = 1
    elif image.grid_key is not None:
        side = int(round(spec.layout.merge ** 0.5))  # one placeholder: one merge window of patches
        channels = getattr(vision, "in_channels", getattr(vision, "in_chans", 3))
        dim = channels * getattr(vision, "temporal_patch_size", 1) * vision.patch_size ** 2
        pixels = torch.zeros(side * side, dim)
        extra[image.grid_key] = torch.tensor([[1, side, side]], device=device)
        n_tokens = 1
        if spec.counts("image"):  # placeholders counted per item (.grid_rows): a merge size of 1, or the model's rows
            extra.update({k: torch.ones(1, dtype=torch.int64, device=device) for k in image.item_keys
                          if k.endswith("merge_sizes")})
            n_tokens = spec.item_tokens("image", extra)[0]
    else:
        size = vision.image_size
        h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]
        channels = getattr(vision, "num_channels", 3)
        pixels = torch.zeros(1, channels, h, w)
        if spec.counts("image"):  # one image of the tower's size, with its image_sizes
            extra["image_sizes"] = torch.tensor([[h, w]], device=device)
            n_tokens = spec.item_tokens("image", {"image_sizes": extra["image_sizes"]})[0]
            inner = inner_vlm(model)
            if callable(getattr(inner, "pack_image_features", None)):  # any-resolution: its tiles (the model's count)
                tiles = sys.modules[type(inner).__module__].image_size_to_num_patches(
                    image_size=[h, w], grid_pinpoints=model.config.image_grid_pinpoints, patch_size=h)
                pixels = torch.zeros(1, int(tiles), channels, h, w)
        elif image.item_axis == 1:  # Idefics: [rows, images, C, H, W]; an all-zero image would be padding
            pixels = torch.ones(1, 1, channels, h, w)
            n_tokens = feature_rows(inner_vlm(model), pixels.to(device, dtype))[0]
        else:
            n_tokens = feature_rows(inner_vlm(model), pixels.to(device, dtype))[0]
    marks = boundary_ids(model.config) if has_indicators(inner_vlm(model)) else None  # Ovis 2.5: the image's start
    body = [image.token_id] * n_tokens if marks is None else [marks[0]] + [image.token_id] * n_tokens + [marks[1]]
    ids = torch.tensor([[1] + body + [1]], device=device)
    if spec.token_type_key == "mm_token_type_ids" and not spec.layout.image_blocks:  # blocks: shard_batch's own
        extra["mm_token_type_ids"] = (ids == image.token_id).to(torch.int64)
    return {"input_ids": ids, image.pixel_key: pixels.to(device, dtype), **extra}
