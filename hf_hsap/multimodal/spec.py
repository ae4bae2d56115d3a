"""What hf_hsap must know of a vision-language model to train it on packed rows, derived from the model itself.

A packed row is one sample with many images: every per-item input the family's processor emits is carried in
document order, and each document keeps its own positions. :func:`vision_spec` reads, not a list of families, but
the model (:mod:`.structure`):

- its placeholders (``image_token_id`` / ``image_token_index``, ``video_token_id`` ...);
- which keys its forward and its encoders take: ``image_grid_thw`` (a grid of flattened patches per item, with the
  model's own ``get_rope_index`` per document where it has one), ``pack_image_features`` (any-resolution tiles:
  placeholders counted per image by the model, :mod:`.items`), a Pixtral tower (``image_sizes`` of padded images),
  ``pixel_attention_mask`` in ``get_image_features`` (Idefics: ``[rows, images, C, H, W]``), or one pixel row per
  image; ``token_type_ids`` (image blocks) and ``mm_token_type_ids`` filled from the placeholders; videos where
  ``get_video_features`` takes nothing but the video (and its grid);
- what its encoder returns for a minimal image (asked once per model: the rows the placeholders stand for);
- encoders that take per-item inputs besides the pixels, read from their signatures (:mod:`.derived`: MiniCPM-V's
  crop sizes, LFM2-VL's spatial shapes, DeepSeek-VL-Hybrid's second view, the Q-Former families, Fuyu's patches).

It refuses a model for a structural reason no packing fixes (:data:`.structure.REFUSAL_KINDS`: encoder-decoder,
VQ codes in the vocabulary, no placeholder, no image encoder) or for an input the family needs that packed rows do
not carry yet (named), each with a fix that works; keys the forward takes but packing does not carry are listed in
:attr:`~hf_hsap.data.vision.VisionSpec.uncarried`, and the collator refuses a document that holds one.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec
from ..log import get_logger
from ..plan.items import encoder_patch_work
from .audio import audio_spec, is_audio_lm
from .cross import cross_spec, is_cross_attention_vlm
from .derived import derived_spec
from .grid import ROPE_INPUTS, grid_spec
from .encoder_rows import check_encoder_rows
from .indicators import boundary_check, has_indicators, indicators_supported
from .items import anyres_counter, sizes_counter
from .layer_blocks import vision_blocks
from .markers import marker_keys
from .prefix import is_prefix_lm, position_start
from .structure import (CARRIED_KEYS, CONTROL_KEYS, VisionRefusal, forward_keys, inner_vlm, param_names, refusal,
                        required, structural_refusal, token)

__all__ = ["VisionRefusal", "accepted_families", "inner_vlm", "is_vlm", "vision_spec"]

logger = get_logger(__name__)
_SPECS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its spec (the encoder is asked once)


def accepted_families(models: Any) -> frozenset[str]:
    """The families among ``models`` that :func:`vision_spec` accepts (e.g. every family of the multimodal zoo).

    Args:
        models: an iterable of models.

    Returns:
        Their ``config.model_type`` where ``vision_spec`` returns a spec.
    """
    out = set()
    for model in models:
        try:
            vision_spec(model)
        except ValueError:
            continue
        out.add(str(model.config.model_type))
    return frozenset(out)


def is_vlm(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a vision(-audio)-language model with an image encoder."""
    return inner_vlm(model) is not None


def vision_spec(model: torch.nn.Module) -> VisionSpec:
    """The :class:`~hf_hsap.data.vision.VisionSpec` of a vision-language model, for
    ``PackingCollator(max_length, vision=vision_spec(model))``, derived from the model (module docstring).

    Args:
        model: a Transformers vision-language model (``AutoModelForImageTextToText``).

    Returns:
        Its modalities, placeholder tokens, merge factor, per-item keys, (grid families) its own rope index and the
        forward's keys packing does not carry.

    Raises:
        VisionRefusal: a ``ValueError`` naming its ``kind`` (:data:`.structure.REFUSAL_KINDS`), the structure read
            and a fix that works.
    """
    if model in _SPECS:
        return _SPECS[model]
    spec = _with_patch_work(_derive(model), model.config)
    _SPECS[model] = spec
    return spec


def _with_patch_work(spec: VisionSpec, config: Any) -> VisionSpec:
    """``spec`` with every modality's encoder work per patch (:attr:`~hf_hsap.data.vision.Modality.patch_work`,
    from its tower's shape: the audio tower's for audio, else the vision tower's)."""
    mods = tuple(dataclasses.replace(m, patch_work=encoder_patch_work(
        config, "audio_config" if m.name == "audio" else "vision_config")) for m in spec.layout.modalities)
    return dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, modalities=mods))


def _not_carried(model: torch.nn.Module, where: str, keys: list[str]) -> VisionRefusal:
    return refusal(model, "input not carried", f"{where} needs {', '.join(keys)}, which packed rows do not carry yet")


def _derive(model: torch.nn.Module) -> VisionSpec:
    """:func:`vision_spec` uncached."""
    config = model.config
    if is_cross_attention_vlm(model):  # Mllama, Idefics: text attends to the images by cross-attention
        return cross_spec(model)
    inner = inner_vlm(model)
    if is_audio_lm(inner):  # an audio-language model (Voxtral, AudioFlamingo 3, ...): its clips only
        refused = structural_refusal(model, None)
        if refused is not None and refused.kind == "encoder-decoder":
            raise refused
        return _with_uncarried(audio_spec(model, inner), forward_keys(model))
    refused = structural_refusal(model, inner)
    if refused is not None:
        raise refused
    keys = forward_keys(model)
    derived = derived_spec(model, inner)
    if derived is not None:  # exact in the multimodal zoo in every mode, its encoder's rows checked every forward
        return _with_uncarried(derived, keys)
    encode = getattr(type(inner), "get_image_features", None)
    if encode is None:  # a video-only encoder not derived above
        raise refusal(model, "no image encoder", "it has get_video_features but no get_image_features, and its videos "
                                                 "are not queried by a Q-Former (the video-only layout hf_hsap takes)")
    if "pixel_values" not in keys | set(param_names(encode)):
        raise refusal(model, "input not carried", "its forward takes no pixel_values")
    if "pixel_values" in required(type(model).forward):
        raise refusal(model, "image required", (
            "its forward requires pixel_values on every call, so a packed row (or an SP rank's part of one) "
            "holding no image cannot run"))
    indicators = has_indicators(inner)  # Ovis 2.5: learned rows over each item's start / end tokens (.indicators)
    if indicators and not indicators_supported(model, inner):
        raise refusal(model, "encoder layout", (
            "it writes learned embeddings at each image's start / end tokens (get_visual_indicator_features) in a "
            "merge that counts them against the images of one forward, and its config or merge is not the one "
            "hf_hsap writes those rows for (hf_hsap.multimodal.indicators)"))
    missing = [k for k in required(encode) if k not in CARRIED_KEYS]
    if missing:
        raise _not_carried(model, "get_image_features", missing)
    markers = marker_keys(config, keys)  # ERNIE-4.5-VL's MoE routing types (placeholders and their start / end)
    per_token = sorted(k for k in keys if k.endswith("token_type_ids") and k not in CARRIED_KEYS and k not in markers)
    if per_token:
        raise _not_carried(model, "its forward (per token)", per_token)
    text = config.get_text_config()
    bidirectional = getattr(text, "use_bidirectional_attention", None)
    if bidirectional in (True, "all") and not is_prefix_lm(model):  # a prefix-LM's prefixes are blocks (.prefix)
        raise refusal(model, "bidirectional text", (
            f"its text attends bidirectionally (use_bidirectional_attention={bidirectional!r}: a prefix-LM over "
            "image and prefix), which hf_hsap's causal kernels do not take yet"))
    image = token(config, "image_token_id", "image_token_index")
    video = token(config, "video_token_id", "video_token_index")
    if "image_grid_thw" in keys:
        spec = _grid_spec(model, inner, keys, image, video)
    else:
        spec = _item_spec(model, inner, keys, image, video)
    spec = check_encoder_rows(model, inner, spec)
    if indicators:  # each document's start / end tokens checked against its items, as the model does alone
        check = boundary_check(config, grid_keys={m.name: m.grid_key for m in spec.layout.modalities if m.grid_key})
        spec = dataclasses.replace(spec, document=check if spec.document is None else _chained(spec.document, check))
    return _with_uncarried(dataclasses.replace(spec, token_keys=markers), keys)


def _chained(first: Any, then: Any) -> Any:
    """``document(example, n)``: ``first``'s rewrite, then ``then``'s."""
    return lambda ex, n: then(first(ex, n), n)


def _with_uncarried(spec: VisionSpec, keys: frozenset[str]) -> VisionSpec:
    """``spec`` with the forward's keys it does not carry (:attr:`~hf_hsap.data.vision.VisionSpec.uncarried`)."""
    carried = {k for m in spec.layout.modalities for k in (m.pixel_key, *m.item_keys)} | {spec.token_type_key} | \
        set(spec.token_keys)
    return dataclasses.replace(spec, uncarried=tuple(sorted(keys - CONTROL_KEYS - carried)))


def _video_takes_only(inner: torch.nn.Module, allowed: set[str], video: int) -> bool:
    """Whether ``get_video_features`` exists, takes nothing but ``allowed`` (and encoder options), and the model
    marks a video's features by its own placeholder ``video`` (GLM-4V marks them with the image token, told apart
    by ``mm_token_type_ids`` only, which the packed-row planner does not count per modality yet)."""
    encode = getattr(type(inner), "get_video_features", None)
    if not callable(encode) or set(param_names(encode)) - CONTROL_KEYS - allowed:
        return False
    mask = getattr(inner, "get_placeholder_mask", None)
    if not callable(mask):
        return False
    embed = inner.get_input_embeddings().weight
    ids = torch.tensor([[video]], device=embed.device)
    try:
        with torch.no_grad():
            masks = mask(ids, inputs_embeds=torch.zeros(1, 1, embed.shape[-1], dtype=embed.dtype, device=embed.device))
        return isinstance(masks, tuple) and len(masks) == 2 and bool(masks[1].any()) and not bool(masks[0].any())
    except Exception:  # noqa: BLE001 - a mask the model cannot make of one video token (or on meta): not carried
        return False


def _grid_spec(model: torch.nn.Module, inner: torch.nn.Module, keys: frozenset[str], image: int,
               video: int | None) -> VisionSpec:
    """Flattened patches with a ``[t, h, w]`` grid per item (Qwen-VL-like), read from the model by
    :func:`.grid.grid_spec` (videos, GLM-4V's frames as images, the omni thinkers' audios, the rope index called
    by its signature); refused where the rope index takes inputs packed rows do not give it per document."""
    rope = getattr(inner, "get_rope_index", None)
    sections = (getattr(model.config.get_text_config(), "rope_parameters", None) or {}).get("mrope_section") or ()
    if callable(rope) and len(sections) not in (0, 3):  # e.g. a HunYuan-VL with 4 axes (its last three: w, h, image)
        raise refusal(model, "input not carried", (
            f"its rope index gives {len(sections)} rotary rows (rope_parameters['mrope_section'] = {list(sections)}), "
            "but packed rows carry 3 per token (Transformers' packed [4, B, L] with the text positions) yet"))
    if callable(rope):
        other = sorted(set(param_names(rope)) - ROPE_INPUTS - keys)
        if other:
            raise refusal(model, "input not carried", (
                f"its rope index (get_rope_index) takes {', '.join(other)}, which packed rows do not give it per "
                "document yet"))
    try:
        return grid_spec(model, inner, model.config.model_type, image, video)
    except VisionRefusal:
        raise
    except ValueError as e:  # rows per item that are no formula of the grid (.grid_rows)
        raise refusal(model, "encoder layout", str(e)) from e


def _item_spec(model: torch.nn.Module, inner: torch.nn.Module, keys: frozenset[str], image: int,
               video: int | None) -> VisionSpec:
    """Items along an axis of the pixels: any-resolution tiles (``pack_image_features``), a Pixtral tower
    (``image_sizes``), Idefics' images per row (``pixel_attention_mask``), or one pixel row per image; videos
    ``[videos, frames, C, H, W]`` where ``get_video_features`` takes nothing but them."""
    config = model.config
    family = config.model_type
    encode = param_names(type(inner).get_image_features)
    videos = ()
    if video is not None and "pixel_values_videos" in keys and \
            _video_takes_only(inner, {"pixel_values_videos"}, video):
        videos = (Modality("video", video, "pixel_values_videos", type_id=2),)
    types = "token_type_ids" if "token_type_ids" in keys else "mm_token_type_ids" if "mm_token_type_ids" in keys \
        else None
    if callable(getattr(inner, "pack_image_features", None)) and "image_sizes" in encode:
        mod = Modality("image", image, "pixel_values", item_keys=("image_sizes",), padded=("pixel_values",))
        count = anyres_counter(inner, one_image_per_document="batch_num_images" in encode)
        return VisionSpec(VisionLayout(family, (mod, *videos), counted=("image",)), item_tokens=count,
                          token_type_key=types)
    if getattr(getattr(config, "vision_config", None), "model_type", None) == "pixtral" and "image_sizes" in keys:
        mod = Modality("image", image, "pixel_values", item_keys=("image_sizes",), padded=("pixel_values",))
        ratio = int(config.vision_config.patch_size) * int(getattr(config, "spatial_merge_size", None) or 1)
        return VisionSpec(VisionLayout(family, (mod, *videos), counted=("image",)), item_tokens=sizes_counter(ratio),
                          token_type_key=types)
    if "pixel_attention_mask" in encode:
        mod = Modality("image", image, "pixel_values", item_keys=("pixel_attention_mask",), item_axis=1)
        return VisionSpec(VisionLayout(family, (mod, *videos)), token_type_key=types)
    item_keys = tuple(k for k in ("image_sizes", "pixel_mask", "image_position_ids") if k in keys)
    mod = Modality("image", image, "pixel_values", item_keys=item_keys)
    prefix = is_prefix_lm(model)  # PaliGemma: each document's image and prompt are one bidirectional block
    blocks = types == "token_type_ids" and not prefix or vision_blocks(config.get_text_config())
    layout = VisionLayout(family, (mod, *videos), image_blocks=blocks,
                          prefix_blocks=prefix, position_start=position_start(model) if prefix else 0)
    return VisionSpec(layout, token_type_key=types)
