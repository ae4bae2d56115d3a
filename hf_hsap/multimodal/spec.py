"""Which vision-language families hf_hsap trains on packed rows, and what it must know of each.

A family is listed only where the tests show it exact (logits and every gradient against each document run
alone): its placeholders are the feature rows in document order, and its positions are either 1-D (restarting
per document) or its own multimodal rope index of each document alone. Images carry their per-item keys
(``image_sizes``, ``pixel_attention_mask``) in document order; where an image's placeholders depend on its size
(LLaVA-NeXT's any-resolution tiles, Pixtral's image sizes) the model counts them per image (:mod:`.items`). Families
that attend to images through cross-attention (Mllama) or whose inputs are not carried yet are refused with a fix.
"""
from __future__ import annotations

import inspect
import sys
from typing import Any

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec
from ..log import get_logger
from .grid import grid_spec
from .items import anyres_counter, sizes_counter

__all__ = ["ANYRES_FAMILIES", "GRID_FAMILIES", "GRID_IMAGE_FAMILIES", "PER_ROW_FAMILIES", "SIZED_FAMILIES",
           "UNIFORM_FAMILIES", "accepted_families", "inner_vlm", "is_vlm", "probe_inputs", "vision_spec"]

logger = get_logger(__name__)

# Qwen-VL: flattened patches with a [t, h, w] grid per item, multimodal rope index per document.
# Videos too (GLM-4V's frames as images: .grid); Qwen3.5's decoder is a gated-delta-rule hybrid.
GRID_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "glm4v",
                           "glm4v_moe", "qwen2_5_omni_thinker", "qwen3_omni_moe_thinker"})
# The same layout, exact in the multimodal zoo on images; their videos are not made exact yet (refused).
GRID_IMAGE_FAMILIES = frozenset({"glm46v", "glmga", "glm_ocr", "exaone4_5", "hyperclovax_vision_v2",
                                 "cohere_compass", "cosmos3_edge", "cosmos3_omni", "llava_onevision1_5",
                                 "minimax_m3_vl", "muse_glimmer"})
# One pixel row per image (or per fixed-size tile), the same number of placeholders per row, 1-D positions; each
# exact in the multimodal zoo (scripts/vlm_zoo.py). The encoder's per-row feature count is checked every forward.
UNIFORM_FAMILIES = frozenset({"llava", "gemma3", "shieldgemma2", "vipllava", "internvl", "qianfan_ocr", "deepseek_vl",
                              "got_ocr2", "pp_chart2table", "cohere2_vision", "aya_vision", "ovis2", "step3p7"})
# Any-resolution tiles: pixel_values [images, tiles, C, H, W] (tiles zero-padded to the batch's most) with
# image_sizes [images, 2]; each image's placeholders counted by the model's pack_image_features (.items). Videos:
# pixel_values_videos [videos, frames, C, H, W], the same frames (and placeholders) for every video of a batch.
ANYRES_FAMILIES = frozenset({"llava_next", "llava_next_video", "llava_onevision"})
# A Pixtral tower: pixel_values [images, C, H, W] zero-padded to the batch's largest, image_sizes [images, 2] the true
# sizes, (H // r) * (W // r) placeholders per image (LLaVA with a Pixtral tower too: see _is_pixtral_llava).
SIZED_FAMILIES = frozenset({"mistral3", "lighton_ocr"})
# Idefics: pixel_values [rows, images, C, H, W] and pixel_attention_mask [rows, images, H, W]; a packed row is one
# sample whose images are every document's tiles (item axis 1), the same number of placeholders per tile.
PER_ROW_FAMILIES = frozenset({"idefics2", "idefics3", "smolvlm", "granite_docling"})
# Image blocks attend bidirectionally (token_type_ids == 1): the mask rule "same document AND (causal OR same
# image)" that the "hsap" kernels do not take yet.
_BLOCK_FAMILIES = frozenset({"gemma3", "shieldgemma2", "gemma3n", "gemma4", "paligemma"})


def accepted_families() -> frozenset[str]:
    """Every family :func:`vision_spec` accepts."""
    return GRID_FAMILIES | GRID_IMAGE_FAMILIES | UNIFORM_FAMILIES | ANYRES_FAMILIES | SIZED_FAMILIES | \
        PER_ROW_FAMILIES


def inner_vlm(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module whose forward encodes the images and merges them (has ``get_image_features``), or ``None``."""
    for m in (getattr(model, "model", None), model):
        if m is not None and callable(getattr(type(m), "get_image_features", None)) and \
                (hasattr(m, "language_model") or hasattr(m, "text_model")):  # Idefics names it text_model
            return m
    return None


def is_vlm(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a vision(-audio)-language model with an image encoder."""
    return inner_vlm(model) is not None


def _token(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def vision_spec(model: torch.nn.Module) -> VisionSpec:
    """The :class:`~hf_hsap.data.vision.VisionSpec` of a vision-language model, for
    ``PackingCollator(max_length, vision=vision_spec(model))``.

    Args:
        model: a Transformers vision-language model (``AutoModelForImageTextToText``).

    Returns:
        Its modalities, placeholder tokens, merge factor and (Qwen-VL) its own rope index.

    Raises:
        ValueError: not a vision-language model, or a family hf_hsap does not make exact on packed rows (the
            message names what works instead).
    """
    config = model.config
    family = str(getattr(config, "model_type", type(config).__name__))
    inner = inner_vlm(model)
    if inner is None:
        raise ValueError(f"{family} has no image encoder (no get_image_features); text models need no vision spec: "
                         "use PackingCollator(max_length) alone")
    if family not in accepted_families():
        sub_models = [m for m in model.modules() if hasattr(m, "_supports_sdpa")]  # every tower must take it
        attn = "sdpa" if all(m._supports_sdpa for m in sub_models) else "eager"
        raise ValueError(
            f"{family}: packed image+text rows are exact in hf_hsap for {sorted(accepted_families())} "
            f"only (each is tested against every document run alone); train {family} with one document per row "
            f"(no packing: TRL's SFTTrainer with packing=False, attn_implementation='{attn}') or use a listed family"
        )
    image = _token(config, "image_token_id", "image_token_index")
    video = _token(config, "video_token_id", "video_token_index")
    if family in GRID_FAMILIES | GRID_IMAGE_FAMILIES:
        return grid_spec(model, inner, family, image, video)
    if family in ANYRES_FAMILIES:
        mods = [Modality("image", image, "pixel_values", item_keys=("image_sizes",), padded=("pixel_values",))]
        if video is not None and callable(getattr(inner, "get_video_features", None)):  # [videos, frames, C, H, W]
            mods.append(Modality("video", video, "pixel_values_videos", type_id=2))
        count = anyres_counter(inner, one_image_per_document=family == "llava_onevision")
        return VisionSpec(VisionLayout(family, tuple(mods), counted=("image",)), item_tokens=count)
    if family in SIZED_FAMILIES or _is_pixtral_llava(config):
        mod = Modality("image", image, "pixel_values", item_keys=("image_sizes",), padded=("pixel_values",))
        ratio = int(config.vision_config.patch_size) * int(getattr(config, "spatial_merge_size", None) or 1)
        return VisionSpec(VisionLayout(family, (mod,), counted=("image",)), item_tokens=sizes_counter(ratio))
    if family in PER_ROW_FAMILIES:
        mod = Modality("image", image, "pixel_values", item_keys=("pixel_attention_mask",), item_axis=1)
        return VisionSpec(VisionLayout(family, (mod,)))
    layout = VisionLayout(family, (Modality("image", image, "pixel_values"),), image_blocks=family in _BLOCK_FAMILIES)
    return VisionSpec(layout, token_type_key="token_type_ids" if family in _BLOCK_FAMILIES else None)


def _is_pixtral_llava(config: Any) -> bool:
    """A LLaVA whose vision tower is Pixtral's (it splits its features by ``image_sizes``)."""
    vision = getattr(config, "vision_config", None)
    return config.model_type == "llava" and getattr(vision, "model_type", None) == "pixtral"


def _feature_rows(inner: torch.nn.Module, pixels: torch.Tensor) -> int:
    """How many placeholder rows the model's encoder makes of ``pixels`` (asked, not derived from the config)."""
    with torch.no_grad():
        out = inner.get_image_features(pixel_values=pixels, return_dict=True).pooler_output
    if torch.is_tensor(out):
        return int(out.numel() // out.shape[-1])
    return int(sum(v.numel() // v.shape[-1] for v in out))


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
    image = spec.layout.modalities[0]
    vision = model.config.vision_config
    extra: dict[str, Any] = {}
    if image.grid_key is not None:
        side = int(round(spec.layout.merge ** 0.5))  # one placeholder: one merge window of patches
        channels = getattr(vision, "in_channels", getattr(vision, "in_chans", 3))
        dim = channels * getattr(vision, "temporal_patch_size", 1) * vision.patch_size ** 2
        pixels = torch.zeros(side * side, dim)
        extra[image.grid_key] = torch.tensor([[1, side, side]], device=device)
        n_tokens = 1
    else:
        size = vision.image_size
        h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]
        channels = getattr(vision, "num_channels", 3)
        pixels = torch.zeros(1, channels, h, w)
        if spec.counts("image"):  # one image of the tower's size, with its image_sizes
            extra["image_sizes"] = torch.tensor([[h, w]], device=device)
            n_tokens = spec.item_tokens("image", {"image_sizes": extra["image_sizes"]})[0]
            if spec.layout.family in ANYRES_FAMILIES:  # its tiles (the model's own count)
                inner = inner_vlm(model)
                tiles = sys.modules[type(inner).__module__].image_size_to_num_patches(
                    image_size=[h, w], grid_pinpoints=model.config.image_grid_pinpoints, patch_size=h)
                pixels = torch.zeros(1, int(tiles), channels, h, w)
        elif image.item_axis == 1:  # Idefics: [rows, images, C, H, W]; an all-zero image would be padding
            pixels = torch.ones(1, 1, channels, h, w)
            n_tokens = _feature_rows(inner_vlm(model), pixels.to(device, dtype))
        else:
            n_tokens = _feature_rows(inner_vlm(model), pixels.to(device, dtype))
    ids = torch.tensor([[1] + [image.token_id] * n_tokens + [1]], device=device)
    if spec.token_type_key == "mm_token_type_ids":
        extra["mm_token_type_ids"] = (ids == image.token_id).to(torch.int64)
    return {"input_ids": ids, image.pixel_key: pixels.to(device, dtype), **extra}
