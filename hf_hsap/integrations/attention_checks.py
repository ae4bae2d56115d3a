"""What the ``"hsap"`` attention function refuses, and the attention variant it computes, in one place.

The attention function (:mod:`.transformers`) calls these before it computes anything. Refused (each message
names the fix): attention dropout, non-causal layers, additive position biases, masks other than 2D, value heads
wider than query heads, a plan combined with a padding mask, and malformed windows / soft-caps / sinks.
Computed exactly (:func:`attention_variant`): sliding windows (Transformers' ``sliding_window``: a query sees the
``window`` keys ending at itself, ``masking_utils``' ``kv_idx > q_idx - sliding_window``), logit soft-capping
(Gemma 2's ``softcap``: ``cap * tanh(s / cap)`` of the scaled scores) and attention sinks (GPT-OSS's ``s_aux``:
one logit per query head in the softmax's denominator). Chunked layers run their chunks as documents
(:mod:`.chunked_attention`). Model-family checks are in :mod:`.model_check`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from ..log import get_logger, log_once
from ..plan.plan import Plan
from .model_check import REFERENCE_SLIDING, layer_type, sliding_window_size

__all__ = ["NOT_PASSED", "AttentionVariant", "attention_variant", "check_mask_rank",
           "check_plan_mask", "check_supported", "check_value_head_dim", "mask_window"]

logger = get_logger(__name__)


class _Marker:
    """A named sentinel (compared by identity)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NOT_PASSED: Any = _Marker("NOT_PASSED")  # a keyword the model did not pass (as opposed to one passed as None)
_UNKNOWN: Any = _Marker("UNKNOWN")  # mask_window: the config does not say which mask the layer gets


@dataclass(frozen=True)
class AttentionVariant:
    """What one attention call computes besides causal, document-masked softmax attention.

    Attributes:
        window: the sliding window in tokens (a query sees the ``window`` keys ending at itself), or ``None``.
        softcap: logit soft-cap ``c`` (scores become ``c * tanh(s / c)`` after scaling), or ``None``.
        sinks: ``[Hq]`` sink logits (one extra softmax term per query head, no value), or ``None``.
    """

    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None


def check_supported(module: torch.nn.Module, dropout: float, *, is_causal: bool | None = None,
                    position_bias: Any = None) -> None:
    """Refuse attention variants the kernel does not compute.

    Args:
        module: the calling attention layer (read: ``is_causal``).
        dropout: the attention dropout probability the layer asked for (must be 0).
        is_causal: the call's ``is_causal`` (overrides ``module.is_causal``, as SDPA / flash do).
        position_bias: additive position biases (must be ``None``).

    Raises:
        ValueError: dropout > 0, a non-causal layer, or position biases.
    """
    name = type(module).__name__
    if dropout and dropout > 0:
        raise ValueError(
            f"attn_implementation='hsap' has no attention dropout ({name} asked for p={dropout}); pass "
            "disable_attention_dropout=True to hf_hsap.prepare_model or load the model with attention_dropout=0.0 (setting "
            "model.config.attention_dropout afterwards does not reach the layers; other dropout is unaffected)"
        )
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if is_causal is False:
        raise ValueError(
            f"attn_implementation='hsap' computes causal attention only, but {name} is not causal "
            "(an encoder or bidirectional layer); use attn_implementation='sdpa' for this model"
        )
    if position_bias is not None:
        raise ValueError(
            f"attn_implementation='hsap' does not implement additive position biases ({name} passes "
            "`position_bias`); use attn_implementation='eager' or 'sdpa' for this model"
        )


def mask_window(module: torch.nn.Module) -> Any:
    """The window of the mask ``masking_utils`` builds for this layer, as far as the config says.

    A layer of type ``"sliding_attention"`` gets ``create_sliding_window_causal_mask``'s mask (window
    ``config.sliding_window``); ``"full_attention"`` and ``"chunked_attention"`` layers get no window (chunks come
    as document ids). Families without ``layer_types`` (Mistral, Starcoder2, Qwen3-MoE: one mask for all
    layers) are unknown here; their layers pass the mask's window themselves.

    Args:
        module: the calling attention layer (read: ``config``, ``layer_idx``).

    Returns:
        The window, ``None`` (no window) or the private unknown marker.
    """
    config = getattr(module, "config", None)
    kind = layer_type(config, getattr(module, "layer_idx", None)) if config is not None else None
    if kind == "sliding_attention":
        return sliding_window_size(config)
    if kind in ("full_attention", "chunked_attention", REFERENCE_SLIDING):  # reference sliding: causal in a forward
        return None
    return _UNKNOWN


def _window(module: torch.nn.Module, sliding_window: Any) -> int | None:
    """The layer's window: the call's ``sliding_window`` (``module.sliding_window`` when the call passes
    none), reconciled with the mask ``masking_utils`` builds for the layer (see :func:`attention_variant`)."""
    name = type(module).__name__
    window = getattr(module, "sliding_window", None) if sliding_window is NOT_PASSED else sliding_window
    expected = mask_window(module)
    if expected is not _UNKNOWN and expected != window:
        # eager / SDPA attend with the mask, so the mask's window is Transformers' result for this layer
        log_once(logger, logging.INFO, ("window follows the mask", name, window, expected),
                 "hsap attention: %s (layer %s, %s) passes sliding_window=%s but masking_utils builds its mask with "
                 "window %s; using the mask's window (what eager / SDPA compute)", name,
                 getattr(module, "layer_idx", None), layer_type(module.config, module.layer_idx), window, expected)
        window = expected
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(
            f"attn_implementation='hsap' needs a sliding window of at least 1 token (Transformers' "
            f"`sliding_window`: a query sees that many keys ending at itself), but {name} passes {window!r}; set "
            "config.sliding_window to a positive int, or None for full attention"
        )
    return window


def attention_variant(module: torch.nn.Module, num_heads: int, *, sliding_window: Any = NOT_PASSED,
                      softcap: Any = None, s_aux: Any = None) -> AttentionVariant:
    """The window, soft-cap and sinks one attention call computes, checked.

    The window is the call's ``sliding_window`` (``module.sliding_window`` when the call does not pass the
    keyword at all; a ``None`` passed explicitly means no window: Exaone 4's full layers keep a
    ``sliding_window`` attribute). Where the config's ``layer_types`` say which mask the layer gets and its
    window differs from the passed one, the mask's window wins (eager and SDPA attend with the mask; logged once
    at INFO). No 5.24 family differs (see NOTES.md).

    Args:
        module: the calling attention layer (read: ``sliding_window``, ``config``, ``layer_idx``).
        num_heads: ``Hq``, the query heads (the sinks need one logit each).
        sliding_window: the call's window, or :data:`NOT_PASSED`.
        softcap: the call's logit soft-cap (a positive number) or ``None``.
        s_aux: the call's sink logits (``[Hq]``) or ``None``.

    Returns:
        The :class:`AttentionVariant`.

    Raises:
        ValueError: a window below 1, a soft-cap that is not a positive number, sinks of another shape.
    """
    name = type(module).__name__
    window = _window(module, sliding_window)
    if softcap is not None:
        if torch.is_tensor(softcap) and softcap.numel() == 1:
            softcap = float(softcap)
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not softcap > 0:
            raise ValueError(f"attn_implementation='hsap' needs a positive logit soft-cap, but {name} passes "
                             f"softcap={softcap!r}; set config.attn_logit_softcapping to a positive number or None")
        softcap = float(softcap)
    if s_aux is not None:
        if not torch.is_tensor(s_aux) or s_aux.dim() != 1 or s_aux.numel() != num_heads:
            shape = tuple(s_aux.shape) if torch.is_tensor(s_aux) else type(s_aux).__name__
            raise ValueError(
                f"attn_implementation='hsap' takes attention sinks as one logit per query head ([{num_heads}]), but "
                f"{name} passes s_aux of shape {shape}; use attn_implementation='eager' for this model"
            )
    return AttentionVariant(window, softcap, s_aux)


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
