"""What the ``"hsap"`` attention function refuses, in one place (each message names the fix).

The attention function (:mod:`.transformers`) calls these before it computes anything: attention dropout,
non-causal layers, attention sinks / soft-capping / position biases, masks other than 2D, value heads wider
than query heads, a plan combined with a padding mask, sliding windows shorter than a document, and chunked
layers under SP with a document longer than a chunk. Model-family checks are in :mod:`.model_check`.
"""
from __future__ import annotations

from typing import Any

import torch

from ..plan.plan import Plan
from .model_check import UnsupportedModelError, chunked_attention_size, layer_type

__all__ = ["check_chunked_sp", "check_mask_rank", "check_plan_mask", "check_supported", "check_value_head_dim",
           "check_window"]


def check_supported(module: torch.nn.Module, dropout: float, *, is_causal: bool | None = None,
                    s_aux: Any = None, softcap: Any = None, position_bias: Any = None,
                    sliding_window: int | None = None) -> int | None:
    """Refuse attention variants the kernel does not compute; return the sliding window (or ``None``).

    Args:
        module: the calling attention layer (read: ``is_causal``, ``sliding_window`` when not passed).
        dropout: the attention dropout probability the layer asked for (must be 0).
        is_causal: the call's ``is_causal`` (overrides ``module.is_causal``, as SDPA / flash do).
        s_aux, softcap, position_bias: attention sinks, logit soft-capping, additive position biases (each
            must be ``None``).
        sliding_window: the call's window (default ``module.sliding_window``).

    Returns:
        The layer's sliding window in tokens, or ``None`` (no window).

    Raises:
        ValueError: dropout > 0, a non-causal layer, or sinks / soft-capping / position biases.
    """
    name = type(module).__name__
    if dropout and dropout > 0:
        raise ValueError(
            f"attn_implementation='hsap' has no attention dropout ({name} asked for p={dropout}); call "
            "hf_hsap.disable_attention_dropout(model) or load the model with attention_dropout=0.0 (setting "
            "model.config.attention_dropout afterwards does not reach the layers; other dropout is unaffected)"
        )
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if is_causal is False:
        raise ValueError(
            f"attn_implementation='hsap' computes causal attention only, but {name} is not causal "
            "(an encoder or bidirectional layer); use attn_implementation='sdpa' for this model"
        )
    for key, value, what in (("s_aux", s_aux, "attention sinks"), ("softcap", softcap, "logit soft-capping"),
                             ("position_bias", position_bias, "additive position biases")):
        if value is not None:
            raise ValueError(
                f"attn_implementation='hsap' does not implement {what} ({name} passes `{key}`); "
                "use attn_implementation='eager' or 'flex_attention' for this model"
            )
    return sliding_window if sliding_window is not None else getattr(module, "sliding_window", None)


def check_mask_rank(module: torch.nn.Module, attention_mask: torch.Tensor | None) -> None:
    """Refuse an ``attention_mask`` that is not 2D (a dense mask the model built itself or one given by hand).

    Args:
        module: the calling attention layer (named in the message).
        attention_mask: ``None``, ``[B, <= Lk]`` bool padding or ``[B, L]`` int32 document ids.
    """
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"attn_implementation='hsap' reads only 2D padding masks, but {type(module).__name__} got a "
            f"{attention_mask.dim()}D attention_mask, a dense mask the model builds itself (or one passed in by "
            "hand); use attn_implementation='sdpa' for this model, or pass position_ids / cu_seq_lens_q (not a 4D "
            "mask) for packed documents"
        )


def check_value_head_dim(head_dim: int, v_head_dim: int) -> None:
    """Refuse value heads wider than the query / key heads (narrower ones are padded, as flash-attention does).

    Args:
        head_dim: ``D`` of query and key.
        v_head_dim: ``Dv`` of value.
    """
    if v_head_dim > head_dim:
        raise ValueError(f"attn_implementation='hsap' needs value head_dim <= query head_dim, got {v_head_dim} > "
                         f"{head_dim}; use attn_implementation='sdpa' for this model")


def check_plan_mask(plan: Plan, attention_mask: torch.Tensor | None, ids_mask: bool) -> None:
    """Refuse an ``hsap_plan`` together with a padding mask (the mask function's document ids are fine).

    Args:
        plan: the call's ``hsap_plan`` or ``None``.
        attention_mask: the call's mask.
        ids_mask: whether ``attention_mask`` holds the mask function's integer document ids.
    """
    if plan is not None and attention_mask is not None and not ids_mask:
        raise ValueError("hsap_plan does not combine with a padding attention_mask; make padding its own document")


def check_chunked_sp(module: torch.nn.Module, longest_doc: int) -> None:
    """Refuse a chunked layer under SP when a document is longer than its chunk (the plan has no chunks).

    Args:
        module: the calling attention layer (read: ``config``, ``layer_idx``).
        longest_doc: the plan's longest document in tokens.

    Raises:
        UnsupportedModelError: a chunked-attention layer and a document longer than its chunk.
    """
    config = getattr(module, "config", None)
    if config is None or layer_type(config, getattr(module, "layer_idx", None)) != "chunked_attention":
        return
    chunk = chunked_attention_size(config)
    if chunk is not None and longest_doc > chunk:
        raise UnsupportedModelError(
            f"{type(module).__name__} (layer {module.layer_idx}) is a chunked-attention layer of {chunk} tokens and a "
            f"document has {longest_doc}; hf_hsap has no chunked attention under sequence parallelism. Use "
            "sp_size=1 (chunks are exact there), or keep documents at most attention_chunk_size tokens long"
        )


def check_window(module: torch.nn.Module, window: int | None, longest_keys: int) -> None:
    """Refuse a sliding window shorter than some document's keys (then it would change the result).

    Args:
        module: the calling attention layer (named in the message).
        window: its sliding window in tokens, or ``None``.
        longest_keys: the most keys one document's queries attend to.
    """
    if window is not None and longest_keys > window:
        raise ValueError(
            f"attn_implementation='hsap' has no sliding-window attention, and {type(module).__name__} has a "
            f"window of {window} tokens while a document spans {longest_keys} keys; keep documents at most "
            f"{window} tokens long, or disable the window (config.use_sliding_window=False / sliding_window=None)"
        )
