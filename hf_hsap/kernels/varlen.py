"""Single-process varlen attention with autograd (the ``sp_size == 1`` path and generation)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .base import AttentionKernel, VarlenSpec, check_features, lse_dtype, window_left
from .select import select_kernel
from .sinks import apply_sinks, sinks_grad
from .tiled import TiledKernel


def _as_tuple(cu: torch.Tensor | Sequence[int]) -> tuple[int, ...]:
    return tuple(int(x) for x in (cu.tolist() if torch.is_tensor(cu) else cu))


def _cap_kw(softcap: float | None) -> dict:
    """``softcap=`` for a kernel call when there is one (kernels of the older contract take none)."""
    return {} if softcap is None else {"softcap": softcap}


@dataclass(frozen=True)
class _VarlenCall:
    """The kernel call of one :class:`_VarlenAttention` besides its tensors (one object: autograd takes no
    keywords)."""

    spec: VarlenSpec
    scale: float
    kernel: AttentionKernel
    softcap: float | None


class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, call: _VarlenCall):
        spec, scale, kernel, softcap = call.spec, call.scale, call.kernel, call.softcap
        out, lse = kernel.forward(q, k, v, spec, scale, **_cap_kw(softcap))
        if sinks is not None:  # the sink joins each row's denominator once, after the whole attention
            out_f, lse = apply_sinks(out.to(lse_dtype(q.dtype)), lse, sinks)
            out = out_f.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.call = call
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        # the backward of the final (sunk) out / lse is exactly the gradient with sinks (see .sinks)
        call = ctx.call
        dq, dk, dv = call.kernel.backward(dout, q, k, v, out, lse, spec=call.spec, scale=call.scale,
                                          **_cap_kw(call.softcap))
        d_sinks = sinks_grad(dout, out, lse, sinks) if sinks is not None and ctx.needs_input_grad[3] else None
        return dq, dk, dv, d_sinks, None


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | Sequence[int],
    cu_seqlens_k: torch.Tensor | Sequence[int] | None = None,
    causal: bool = True,
    *,
    softmax_scale: float | None = None,
    kernel: AttentionKernel | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    tile_tokens: int | None = None,
) -> torch.Tensor:
    """Exact varlen attention on one device, differentiable in q, k, v (and ``sinks``).

    Args:
        q: ``[Nq, Hq, D]`` packed queries.
        k: ``[Nk, Hkv, D]`` packed keys (``Hq % Hkv == 0``).
        v: ``[Nk, Hkv, D]`` packed values.
        cu_seqlens_q: ``[n + 1]`` segment boundaries of q (tensor or ints; read on the host).
        cu_seqlens_k: same for k; defaults to ``cu_seqlens_q``.
        causal: bottom-right aligned causal mask inside each segment.
        softmax_scale: defaults to ``D ** -0.5``.
        kernel: defaults to :func:`select_kernel` for q's device and dtype.
        window: Transformers' ``sliding_window`` (a query sees the ``window`` keys ending at its aligned
            position, bottom-right aligned like ``causal``); ``None``: no window.
        softcap: Gemma 2's logit soft-capping, ``softcap * tanh(score / softcap)``; ``None``: none.
        sinks: ``[Hq]`` attention-sink logits (GPT-OSS's ``s_aux``), one extra softmax column per head.
        tile_tokens: run the kernel over query tiles of this many rows (:class:`~.tiled.TiledKernel`: the backward's
            buffers exist for one tile at a time; the ``tiled_attention`` memory lever); ``None``: one call.

    Returns:
        ``[Nq, Hq, D]`` attention output.
    """
    cu_q = _as_tuple(cu_seqlens_q)
    cu_k = cu_q if cu_seqlens_k is None else _as_tuple(cu_seqlens_k)
    spec = VarlenSpec(cu_q, cu_k, causal, window_left(window))
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    kernel = kernel or select_kernel(q.device, q.dtype)
    check_features(kernel, spec.window_left, softcap)
    if tile_tokens is not None:
        kernel = TiledKernel(kernel, tile_tokens)
    if sinks is not None and tuple(sinks.shape) != (q.shape[1],):
        raise ValueError(f"sinks must hold one logit per query head, shape ({q.shape[1]},), got "
                         f"{tuple(sinks.shape)}")
    return _VarlenAttention.apply(q, k, v, sinks, _VarlenCall(spec, scale, kernel, softcap))
