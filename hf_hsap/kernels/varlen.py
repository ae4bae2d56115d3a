"""Single-process varlen attention with autograd (the ``sp_size == 1`` path and generation)."""
from __future__ import annotations

from typing import Sequence

import torch

from .base import AttentionKernel, VarlenSpec
from .select import select_kernel


def _as_tuple(cu: torch.Tensor | Sequence[int]) -> tuple[int, ...]:
    return tuple(int(x) for x in (cu.tolist() if torch.is_tensor(cu) else cu))


class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, spec: VarlenSpec, scale: float, kernel: AttentionKernel):
        out, lse = kernel.forward(q, k, v, spec, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.spec, ctx.scale, ctx.kernel = spec, scale, kernel
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.kernel.backward(dout, q, k, v, out, lse, ctx.spec, ctx.scale)
        return dq, dk, dv, None, None, None


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | Sequence[int],
    cu_seqlens_k: torch.Tensor | Sequence[int] | None = None,
    causal: bool = True,
    softmax_scale: float | None = None,
    kernel: AttentionKernel | None = None,
) -> torch.Tensor:
    """Exact varlen attention on one device, differentiable in q, k, v.

    Args:
        q: ``[Nq, Hq, D]`` packed queries.
        k: ``[Nk, Hkv, D]`` packed keys (``Hq % Hkv == 0``).
        v: ``[Nk, Hkv, D]`` packed values.
        cu_seqlens_q: ``[n + 1]`` segment boundaries of q (tensor or ints; read on the host).
        cu_seqlens_k: same for k; defaults to ``cu_seqlens_q``.
        causal: bottom-right aligned causal mask inside each segment.
        softmax_scale: defaults to ``D ** -0.5``.
        kernel: defaults to :func:`select_kernel` for q's device and dtype.

    Returns:
        ``[Nq, Hq, D]`` attention output.
    """
    cu_q = _as_tuple(cu_seqlens_q)
    cu_k = cu_q if cu_seqlens_k is None else _as_tuple(cu_seqlens_k)
    spec = VarlenSpec(cu_q, cu_k, causal)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    kernel = kernel or select_kernel(q.device, q.dtype)
    return _VarlenAttention.apply(q, k, v, spec, scale, kernel)
