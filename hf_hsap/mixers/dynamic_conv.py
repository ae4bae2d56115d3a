"""Inkling 2's dynamic short convolution (keys and values of its full-attention layers), cut at document boundaries.

The layer has no kernel hook: its taps (static weights plus weights projected from each token's ``dynamic_input``)
and the window sum run in its forward. So it is a whole-layer op (:data:`~.ops.LAYER_OPS`): each run is the layer's
own forward; a continued run is that forward seeded with the last ``kernel - 1`` inputs before it through the one
cache method the layer reads (``update_conv_state``, which prepends them: what Transformers' own cache path does).
The state and transition are those of a causal convolution (:class:`~.ops._Conv`'s shift).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..plan.chain import Chain
from .calls import bind, refuse_cache, run_call, state_dtype
from .handoff import StateExchange, Summary

__all__ = ["dynamic_conv"]


class _SeededConv:
    """The one cache method the layer calls: the previous inputs first."""

    def __init__(self, state: torch.Tensor) -> None:
        self.state = state

    def update_conv_state(self, context: torch.Tensor, layer_idx: int, **kwargs: Any) -> torch.Tensor:
        return torch.cat([self.state.to(context.dtype), context], dim=-1)


class _DynamicConv:
    """The layer on one run ``(hidden [1, n, C], dynamic_input [1, n, C_in], conv_mask [1, n] | None, *parameters)``,
    state ``[1, C, k - 1]`` (the last ``k - 1`` inputs)."""

    def __init__(self, layer: torch.nn.Module, params: list[str], channels: int, dtype: torch.dtype) -> None:
        self.layer, self.params, self.k = layer, params, int(layer.conv_kernel_size)
        self.state_dtype = state_dtype(dtype)
        self.state_shape, self.transition_shape = (1, channels, self.k - 1), (self.k - 1, self.k - 1)

    def run(self, t: list, init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        xs, dyn, mask, *ps = t
        kw = {"cache": None if init is None else _SeededConv(init), "conv_mask": mask}
        out = torch.func.functional_call(self.layer, dict(zip(self.params, ps)), (xs, dyn), kw, strict=False)
        ctx = xs.to(self.state_dtype)
        if mask is not None:
            ctx = ctx * mask[:, :, None]
        ctx = ctx.transpose(1, 2)  # [1, C, n]
        head = ctx.new_zeros(*ctx.shape[:2], self.k - 1) if init is None else init.to(ctx.dtype)
        full = torch.cat([head, ctx], dim=-1)
        return out, full[..., full.shape[-1] - (self.k - 1):]

    def summarize(self, t: list) -> Summary:
        out, final = self.run(t, None)
        n, m = t[0].shape[1], self.k - 1
        shift = torch.zeros(m, m, dtype=self.state_dtype, device=t[0].device)
        if n < m:  # S' = S @ shift moves S[..., j + n] to j
            shift[torch.arange(n, m), torch.arange(0, m - n)] = 1
        return Summary(out, final, shift, t)

    def correct(self, summary: Summary, init: torch.Tensor) -> torch.Tensor:
        xs, dyn, mask, *ps = summary.carry
        m = min(xs.shape[1], self.k - 1)  # outputs past the first k - 1 never read the initial state
        cut = None if mask is None else mask[:, :m]
        head = self.run([xs[:, :m], dyn[:, :m], cut, *ps], init)[0]
        return torch.cat([head, summary.out[:, m:]], dim=1)

    def transit(self, transition: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return state @ transition.to(state.dtype)


def dynamic_conv(layer: torch.nn.Module, orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain,
                 exchange: StateExchange | None) -> Any:
    """Inkling 2's dynamic short convolution ``(hidden [B, L, C], dynamic_input [B, L, C_in], cache, conv_mask)``:
    ``[B, L, C]`` (:class:`_DynamicConv` per run; ``seq_idx`` is not needed, the runs are the documents)."""
    a, _ = bind(("hidden_states", "dynamic_input", "cache", "conv_mask", "cache_offset"), args, kwargs)
    if a.get("cache") is not None:
        refuse_cache("a dynamic short convolution with a cache")
    x, dyn, mask = a["hidden_states"], a["dynamic_input"], a.get("conv_mask")
    if mask is not None and (not torch.is_tensor(mask) or mask.dim() != 2):
        raise ValueError(f"hf_hsap: {type(layer).__name__} got a conv_mask of shape "
                         f"{tuple(getattr(mask, 'shape', ()))}; packed rows take a [B, L] padding mask or none")
    params = dict(layer.named_parameters())
    rec = _DynamicConv(layer, list(params), x.shape[-1], x.dtype)
    tensors = [(x, 1), (dyn, 1), (mask, 1), *[(p, None) for p in params.values()]]
    return run_call(tensors, rec, out_dim=1, chain=chain, exchange=exchange, rows=x.shape[0], length=x.shape[1])
