"""What a vision-language model's own structure says about packing it: the inputs its forward and encoders take, its
placeholder tokens, and the structural reasons no packing can fix.

:func:`hf_hsap.multimodal.vision_spec` reads the model through these helpers instead of a list of families. A
refusal is a :class:`VisionRefusal` naming its ``kind`` (one of :data:`REFUSAL_KINDS`), the structure it read and
a fix that works (one document per row, or no vision spec for a text model).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from .audio_inline import has_inline_audio

__all__ = ["ATTENTION_KINDS", "CARRIED_KEYS", "CONTROL_KEYS", "MARK_KEYS", "REFUSAL_KINDS", "VisionRefusal", "fix", "forward_keys",
           "inner_vlm", "param_names", "refusal", "required", "structural_refusal", "token"]

# Forward keywords that are not a document's vision inputs: text, caches, outputs, options of the encoders.
CONTROL_KEYS = frozenset({
    "self", "args", "kwargs", "input_ids", "attention_mask", "position_ids", "past_key_values", "cache",
    "inputs_embeds", "labels", "use_cache", "output_attentions", "output_hidden_states", "return_dict",
    "cache_position", "logits_to_keep", "mm_encoder_outputs", "output_router_logits", "router_labels",
    "vision_feature_layer", "vision_feature_layers", "vision_feature_select_strategy", "vision_aspect_ratio",
    "interpolate_pos_encoding", "per_layer_inputs", "downsample_mode"})
# Per-item and per-token keys a packed row can carry in document order (which ones a family uses: its spec).
CARRIED_KEYS = frozenset({
    "pixel_values", "pixel_values_videos", "image_grid_thw", "video_grid_thw", "second_per_grid_ts", "image_sizes",
    "pixel_attention_mask", "pixel_mask", "image_position_ids", "mm_token_type_ids", "token_type_ids",
    "image_merge_sizes", "video_merge_sizes"})
# Per-token masks a forward takes to mark where each image's feature rows go, for a model without a placeholder id
# (Kosmos-2, Kosmos-2.5: 1 on an image's positions): placeholders all the same, carried per token (.marked).
MARK_KEYS = ("image_embeds_position_mask",)
# The text config's layer kinds that are softmax attention (the rest mix tokens recurrently: linear attention,
# short convolutions, Mamba, hybrids).
ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "indexed_attention",
                             "attention"})
# Why vision_spec refuses (VisionRefusal.kind): structural reasons no packing fixes first, then the structures
# packed rows do not take yet (each named from the model in the message).
REFUSAL_KINDS = ("text model", "encoder-decoder", "VQ codes in the vocabulary", "no image encoder",
                 "cross-attention", "no placeholder", "image required", "input not carried", "bidirectional text",
                 "encoder layout")


class VisionRefusal(ValueError):
    """``vision_spec`` refuses a model: ``kind`` (one of :data:`REFUSAL_KINDS`) and the message (the structure read
    and a fix that works)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def param_names(fn: Callable[..., Any] | None) -> dict[str, inspect.Parameter]:
    """The named parameters of ``fn`` (none for ``None``)."""
    if fn is None:
        return {}
    return {n: p for n, p in inspect.signature(fn).parameters.items()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and n != "self"}


def required(fn: Callable[..., Any] | None) -> tuple[str, ...]:
    """The parameters of ``fn`` without a default."""
    return tuple(n for n, p in param_names(fn).items() if p.default is inspect.Parameter.empty)


def forward_keys(model: torch.nn.Module) -> frozenset[str]:
    """The keywords of ``type(model).forward``."""
    return frozenset(param_names(type(model).forward))


def token(config: Any, *names: str) -> int | None:
    """The first of ``names`` that is an int on ``config``."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def inner_vlm(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module whose forward encodes the images (or, for a video-only model such as InstructBLIP-Video, the
    videos; for an audio-language model, the audio clips) and merges them (has ``get_image_features`` /
    ``get_video_features`` / ``get_audio_features``, or an inline audio encoder: :mod:`.audio_inline`, and a
    language model), or ``None``."""
    for names in (("get_image_features", "get_video_features"), ("get_audio_features",)):
        for m in (getattr(model, "model", None), model):
            encodes = any(callable(getattr(type(m), n, None)) for n in names) or \
                ("get_audio_features" in names and has_inline_audio(m))  # Qwen2-Audio encodes inline
            if m is not None and encodes and \
                    (hasattr(m, "language_model") or hasattr(m, "text_model")):  # Idefics names it text_model
                return m
    return None


def fix(model: torch.nn.Module) -> str:
    """The fix every refusal names: one document per row, with the attention every sub-model takes."""
    sub_models = [m for m in model.modules() if hasattr(m, "_supports_sdpa")]
    attn = "sdpa" if all(m._supports_sdpa for m in sub_models) else "eager"
    return (f"train {model.config.model_type} with one document per row (no packing: TRL's SFTTrainer with "
            f"packing=False, attn_implementation='{attn}')")


def refusal(model: torch.nn.Module, kind: str, what: str) -> VisionRefusal:
    """A refusal of ``kind`` (:data:`REFUSAL_KINDS`) naming the family, what was read (``what``) and :func:`fix`."""
    return VisionRefusal(kind, f"{model.config.model_type}: {what}; {fix(model)}")


def structural_refusal(model: torch.nn.Module, inner: torch.nn.Module | None) -> VisionRefusal | None:
    """The structural reason no packing can fix, read from the model, or ``None``.

    Args:
        model: the model; inner: its :func:`inner_vlm`.

    Returns:
        A :class:`VisionRefusal` of kind ``"text model"`` (no vision tower: ``PackingCollator(max_length)``
        alone), ``"encoder-decoder"``, ``"VQ codes in the vocabulary"``, ``"cross-attention"``, ``"no image
        encoder"`` or ``"no placeholder"``; ``None`` when none applies.
    """
    config = model.config
    family = str(getattr(config, "model_type", type(config).__name__))
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    keys = forward_keys(model)
    if getattr(config, "is_encoder_decoder", False) or getattr(text, "is_encoder_decoder", False) \
            or "decoder_input_ids" in keys and not getattr(config, "use_decoder_only_language_model", False):
        return VisionRefusal("encoder-decoder", (
            f"{family} is an encoder-decoder: its text is generated by a decoder attending to a whole encoded "
            f"input, which no packing of decoder rows reproduces; {fix(model)}"))
    # VQ codes with no placeholder to fill: a tokenizer's vocabulary_map (Chameleon, Emu3), or image tokens without a
    # placeholder mask. Apertus 1.5 embeds its codes and scatters them into its placeholders: packed like any other.
    vq = any(callable(getattr(m, "get_image_tokens", None)) and not callable(getattr(m, "get_placeholder_mask", None))
             for m in (model, getattr(model, "model", None)) if m is not None)
    if getattr(config, "vocabulary_map", None) is not None or vq:
        return VisionRefusal("VQ codes in the vocabulary", (
            f"{family} writes its images into the text as VQ codes of its vocabulary (early fusion), with no "
            f"placeholder for an encoder's features to fill; {fix(model)}"))
    has_vision = any(getattr(config, n, None) is not None for n in ("vision_config", "visual_config"))
    cross = "cross_attention_mask" in keys or getattr(text, "cross_attention_layers", None)
    if cross:
        return VisionRefusal("cross-attention", (
            f"{family} attends to its images through cross-attention layers (cross_attention_mask: each text token to "
            f"its own images) without the inputs hf_hsap carries per document for such models (Mllama's "
            f"cross_attention_mask with aspect_ratio_ids / aspect_ratio_mask, Idefics' image_attention_mask); "
            f"{fix(model)}"))
    if inner is None:
        if not has_vision:
            return VisionRefusal("text model", (
                f"{family} has no image encoder (no get_image_features, no vision_config); text models need no "
                "vision spec: use PackingCollator(max_length) alone"))
        return VisionRefusal("no image encoder", (
            f"{family} has a vision tower but no get_image_features (no encoder whose rows fill placeholders), so "
            f"hf_hsap cannot place its images on packed rows; {fix(model)}"))
    marked = any(k in keys for k in MARK_KEYS)  # Kosmos-2: a per-token mask places the images
    video_only = not callable(getattr(type(inner), "get_image_features", None))  # InstructBLIP-Video
    if video_only and token(config, "video_token_id", "video_token_index") is None:
        return VisionRefusal("no placeholder", (
            f"{family}'s config has no video_token_id / video_token_index: no placeholder tokens mark where a "
            f"video's features go, so a packed row cannot keep each video with its document; {fix(model)}"))
    if not video_only and not marked and token(config, "image_token_id", "image_token_index") is None:
        return VisionRefusal("no placeholder", (
            f"{family}'s config has no image_token_id / image_token_index and its forward takes no per-token image "
            f"mask ({', '.join(MARK_KEYS)}): no placeholder tokens mark where an "
            f"image's features go, so a packed row cannot keep each image with its document; {fix(model)}"))
    return None
