"""``"hsap"`` on a vision or audio encoder: each image's bidirectional attention, computed exactly.

A user writes ``attn_implementation="hsap"`` once and Transformers gives it to every sub-model, the vision tower
included. An encoder attends bidirectionally within one image (or frame group, or audio clip): one batch row per
image (CLIP, SigLIP), or one call per image (Qwen-VL's vision tower without flash-attention). Nothing of the
decoder's packing or SP applies: the vision tower runs at the language model's entrance on whole images. So a
non-causal call from a module whose config is a vision / audio config is served by PyTorch's SDPA through
Transformers' own ``sdpa_attention_forward`` (the mask as the model built it), or by the varlen kernel over the
call's ``cu_seq_lens_q`` when the model packs images itself. A non-causal call from any other module (a
bidirectional text model on packed rows) stays refused by :mod:`.attention_checks`.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from ..kernels import varlen_attention
from ..log import get_logger, log_once
from ..model_state import ENCODER_PART, state_of

__all__ = ["encoder_forward", "is_encoder_call", "is_encoder_config", "is_encoder_module"]

logger = get_logger(__name__)
_ENCODER_CONFIG_WORDS = ("Vision", "Audio", "Visual", "Perceiver", "QFormer", "Adapter", "Radio", "Encoder", "Adaptor")
# Perceiver: a per-image resampler (Idefics 2); QFormer: BLIP-2 / InstructBLIP's querying transformer over one image's
# features and its prompt; Adapter: Molmo2's pooling of each placeholder's patches (Molmo2AdapterConfig); Radio:
# NVIDIA's RADIO vision tower (Nemotron-H Omni), whose config class does not say Vision; Encoder, Adaptor: the
# audio-language models' towers (VoxtralEncoderConfig, FunAsrNanoAdaptorConfig)


def is_encoder_config(config: Any) -> bool:
    """Whether ``config`` is a vision / audio encoder's (its class name says so; a name ending in ``TextConfig`` is a
    decoder's even where the family's name has an encoder word: Granite 4 Vision's ``Granite4VisionTextConfig``)."""
    if config is None:
        return False
    name = type(config).__name__
    return not name.endswith("TextConfig") and any(w in name for w in _ENCODER_CONFIG_WORDS)


def is_encoder_module(module: torch.nn.Module) -> bool:
    """Whether the attention layer belongs to a vision / audio encoder (its config class says so, or ``prepare_model``
    flagged it: :func:`hf_hsap.multimodal.marked.mark_image_path_layers`)."""
    return is_encoder_config(getattr(module, "config", None)) or state_of(module, ENCODER_PART) is not None


def is_encoder_call(module: torch.nn.Module, is_causal: bool | None) -> bool:
    """A non-causal call from a vision / audio encoder (what :func:`encoder_forward` serves)."""
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    return causal is False and is_encoder_module(module)


def encoder_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None, *, dropout: float,
                    cu_seq_lens_q: torch.Tensor | None = None, cu_seq_lens_k: torch.Tensor | None = None,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Bidirectional attention of one encoder call, exactly as SDPA computes it.

    Args:
        module: the encoder's attention layer; query ``[B, H, L, D]``; key, value ``[B, Hkv, L, D]``;
        attention_mask: the encoder's own mask (``None``, or what the model built for SDPA);
        scaling: softmax scale; dropout: the layer's attention dropout (applied by SDPA);
        cu_seq_lens_q, cu_seq_lens_k: ``[n + 1]`` item boundaries over the ``B * L`` tokens, or ``None``;
        kwargs: the rest of the call (unused).

    Returns:
        ``(out [B, L, H, D], None)``.
    """
    if logger.isEnabledFor(logging.DEBUG):
        log_once(logger, logging.DEBUG, ("encoder", type(module).__name__),
                 "hsap attention: %s is a vision / audio encoder layer: bidirectional attention per item (%s)",
                 type(module).__name__, "varlen kernel" if cu_seq_lens_q is not None else "SDPA")
    if cu_seq_lens_q is not None:
        if dropout and dropout > 0:
            raise ValueError(f"{type(module).__name__}: attention dropout on packed encoder calls is not implemented; "
                             "pass disable_attention_dropout=True to hf_hsap.prepare_model")
        b, h, n, d = query.shape
        q = query.transpose(1, 2).reshape(b * n, h, d)  # [B, H, L, D] -> [B*L, H, D]
        k = key.transpose(1, 2).reshape(b * n, key.shape[1], d)
        v = value.transpose(1, 2).reshape(b * n, value.shape[1], value.shape[-1])
        cu_k = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
        out = varlen_attention(q, k, v, cu_seq_lens_q.to(torch.int64), cu_k.to(torch.int64), causal=False,
                               softmax_scale=scaling)
        out = out[0] if isinstance(out, tuple) else out
        return out.reshape(b, n, h, -1), None  # [B*L, H, Dv] -> [B, L, H, Dv]
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=False)
