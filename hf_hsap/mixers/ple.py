"""Qwen4-Exp's per-layer embeddings (PLE), cut at document boundaries.

A PLE layer (``Qwen4ExpTextPLELayer``) adds to the residual stream a gated value of each token's hashed n-gram
embedding and a dilated causal convolution of it. Two of its parts read other tokens, and only those two are
replaced, per instance (as ``kernelize`` replaces a decorated layer's forward; no class is patched), by
:data:`METHOD_OPS`; everything token-wise stays the layer's own code:

* the n-gram embedding (``Qwen4ExpTextNGramEmbedding.forward``) hashes each token with the ``ngram_size - 1`` ids
  before it, the end-of-sequence id standing for what precedes the sequence (and what precedes an end-of-sequence
  token). :func:`ngram_forward` finds each token's previous ids *in its document* with the document-cut causal
  convolution of :mod:`.ops` (a one-hot kernel over the ids, shifted by one so that 0 marks "before the document";
  float64 holds every id exactly; under SP the earlier ids of a split document come in its summaries), then runs the
  module's own forward on every token alone with that history as the cache's context (the path it takes when
  generating), so each token is hashed as in its document alone;
* the layer's ``_short_conv`` (a depthwise convolution of kernel ``k`` and dilation ``d``, then SiLU) is a causal
  convolution of kernel ``(k - 1) * d + 1`` whose taps between the dilated ones are zero: :func:`short_conv` runs that
  through the same document-cut convolution (its weight's gradient flows through the widened kernel).

Exact: float64 logits and every parameter gradient against each document alone (``python scripts/model_zoo.py
--families qwen4_exp_text``, ``tests/model/test_ple.py``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..plan.chain import Chain
from .calls import bind, refuse_cache
from .handoff import StateExchange
from .ops import OPS

__all__ = ["METHOD_OPS", "causal_conv"]


def causal_conv(hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                activation: str | None = None, **_: Any) -> torch.Tensor:
    """A depthwise causal convolution, then ``activation`` (``None`` or ``"silu"``).

    Shapes:
        hidden_states ``[B, C, L]``, weight ``[C, k]``, bias ``[C]`` -> ``[B, C, L]``.
    """
    k, n = weight.shape[-1], hidden_states.shape[-1]
    out = F.conv1d(hidden_states.to(weight.dtype), weight.unsqueeze(1), bias, padding=k - 1,
                   groups=hidden_states.shape[1])[..., :n]
    return F.silu(out) if activation == "silu" else out


def _previous_ids(ids: torch.Tensor, span: int, chain: Chain, exchange: StateExchange | None) -> torch.Tensor:
    """The ``span`` ids before each token in its document, oldest first, ``-1`` before the document's start.

    Shapes:
        ids ``[B, L]`` -> ``[B, L, span]`` int64.
    """
    rows, length = ids.shape
    x = (ids.to(torch.float64) + 1)[:, None, :].expand(rows, span, length).contiguous()  # [B, span, L]; 0: none
    pick = torch.zeros(span, span + 1, dtype=torch.float64, device=ids.device)  # channel s - 1 reads token t - s
    pick[torch.arange(span), span - 1 - torch.arange(span)] = 1.0
    prev = OPS["causal_conv1d_fn"](causal_conv, (x, pick, None), {}, chain, exchange)  # [B, span, L]
    return (prev.round().long() - 1).flip(1).transpose(1, 2)  # [B, L, span], oldest first


class _History:
    """The cache the n-gram embedding reads its context ids from, one token per row (its ``get_conv_state``)."""

    def __init__(self, context: torch.Tensor) -> None:
        self.context = context  # [T, span]

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor:
        return self.context

    def update_conv_state(self, states: torch.Tensor, layer_idx: int, state_idx: int = 0, **_: Any) -> torch.Tensor:
        return states


def ngram_forward(module: torch.nn.Module, orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain,
                  exchange: StateExchange | None) -> torch.Tensor:
    """``Qwen4ExpTextNGramEmbedding.forward(input_ids [B, L], cache)``: ``[B, L, D]``, each token hashed with its
    document's previous ids (module docstring)."""
    a, rest = bind(("input_ids", "cache"), args, kwargs)
    if a.get("cache") is not None:
        refuse_cache(type(module).__name__)
    ids = a["input_ids"].long()  # [B, L]
    rows, length = ids.shape
    span = int(module.context_len)
    prev = _previous_ids(ids, span, chain, exchange)  # [B, L, span]
    prev = torch.where(prev < 0, torch.full_like(prev, int(module.eos_token_id)), prev)
    out = orig(ids.reshape(-1, 1), _History(prev.reshape(-1, span)), **rest)  # [B * L, 1, D]
    return out.reshape(rows, length, -1)


def short_conv(layer: torch.nn.Module, orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain,
               exchange: StateExchange | None) -> torch.Tensor:
    """``Qwen4ExpTextPLELayer._short_conv(hidden_states [B, L, C], cache)``: ``silu(dilated causal conv)``
    ``[B, L, C]`` per document (module docstring)."""
    a, _ = bind(("hidden_states", "cache"), args, kwargs)
    if a.get("cache") is not None:
        refuse_cache(type(layer).__name__)
    conv = layer.conv1d
    k, d = int(conv.kernel_size[0]), int(conv.dilation[0])
    weight = conv.weight[:, 0, :]  # [C, k]
    taps = torch.arange(k, device=weight.device) * d
    wide = weight.new_zeros(weight.shape[0], (k - 1) * d + 1).index_copy(1, taps, weight)  # [C, (k - 1) d + 1]
    x = a["hidden_states"].transpose(1, 2)  # [B, C, L]
    out = OPS["causal_conv1d_fn"](causal_conv, (x, wide, conv.bias), {"activation": "silu"}, chain, exchange)
    return out.transpose(1, 2)


# class name -> {method name: op(module, original bound method, args, kwargs, chain, exchange)}: the methods of
# layers with no kernel hook that mix tokens, replaced per instance by `prepare_mixers`.
METHOD_OPS: dict[str, dict[str, Callable[..., Any]]] = {
    "Qwen4ExpTextNGramEmbedding": {"forward": ngram_forward},
    "Qwen4ExpTextPLELayer": {"_short_conv": short_conv},
}
