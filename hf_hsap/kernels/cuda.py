"""CUDA kernels: flash-attn's varlen functions when installed, else PyTorch's built-in varlen flash.

Both run a whole varlen call in one launch, with bottom-right causal masking and native GQA.
They need float16/bfloat16 inputs; :func:`hf_hsap.kernels.select_kernel` falls back to the math
kernel for other dtypes. Nothing here is imported or called on CPU-only code paths.
"""
from __future__ import annotations

import inspect

import torch

from .base import VarlenSpec, check_shapes


def _lse_rows(lse_hn: torch.Tensor) -> torch.Tensor:
    """``[H, N] -> [N, H]`` float32 (the package's lse layout)."""
    return lse_hn.transpose(0, 1).float()


class TorchCUDAFlashKernel:
    """``aten._flash_attention_forward`` / ``_flash_attention_backward`` with ``cum_seq_q/k``."""

    name = "torch-cuda-flash"

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: VarlenSpec, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes: q ``[Nq, Hq, D]``, k/v ``[Nk, Hkv, D]`` -> out ``[Nq, Hq, D]``, lse ``[Nq, Hq]``."""
        check_shapes(q, k, v, spec)
        cu_q, cu_k = spec.cu_tensors(q.device)
        out, lse, _, _, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, spec.max_q, spec.max_k, 0.0, spec.causal, False, scale=scale)
        return out, _lse_rows(lse)

    def backward(self, dout, q, k, v, out, lse, spec: VarlenSpec, scale: float):
        """Gradients from the final ``out``/``lse`` (see the kernel contract)."""
        cu_q, cu_k = spec.cu_tensors(q.device)
        empty = torch.empty(0, dtype=torch.uint8, device=q.device)
        rng = torch.zeros(2, dtype=torch.uint64 if hasattr(torch, "uint64") else torch.int64,
                          device=q.device)
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout.to(q.dtype).contiguous(), q, k, v, out.to(q.dtype).contiguous(),
            lse.transpose(0, 1).float().contiguous(), cu_q, cu_k, spec.max_q, spec.max_k, 0.0,
            spec.causal, rng, empty, scale=scale)
        return dq, dk, dv


class FlashAttnKernel:
    """flash-attn (>= 2.7) ``_flash_attn_varlen_forward`` / ``_flash_attn_varlen_backward``."""

    name = "flash-attn"

    def __init__(self) -> None:
        from flash_attn import flash_attn_interface as fai  # imported only when selected

        self._fwd = fai._flash_attn_varlen_forward
        self._bwd = fai._flash_attn_varlen_backward

    @staticmethod
    def available() -> bool:
        """True when flash-attn is installed with the keyword signature this class calls."""
        try:
            from flash_attn import flash_attn_interface as fai
        except Exception:  # noqa: BLE001 - any import failure means "not usable"
            return False
        params = inspect.signature(fai._flash_attn_varlen_forward).parameters
        return "window_size_left" in params and "softcap" in params

    def forward(self, q, k, v, spec: VarlenSpec, scale: float):
        """Shapes as :class:`TorchCUDAFlashKernel.forward`."""
        check_shapes(q, k, v, spec)
        cu_q, cu_k = spec.cu_tensors(q.device)
        res = self._fwd(q, k, v, cu_q, cu_k, spec.max_q, spec.max_k, dropout_p=0.0,
                        softmax_scale=scale, causal=spec.causal, window_size_left=-1,
                        window_size_right=-1, softcap=0.0, alibi_slopes=None, return_softmax=False)
        return res[0], _lse_rows(res[1])

    def backward(self, dout, q, k, v, out, lse, spec: VarlenSpec, scale: float):
        """Gradients from the final ``out``/``lse`` (see the kernel contract)."""
        cu_q, cu_k = spec.cu_tensors(q.device)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._bwd(dout.to(q.dtype).contiguous(), q, k, v, out.to(q.dtype).contiguous(),
                  lse.transpose(0, 1).float().contiguous(), dq, dk, dv, cu_q, cu_k, spec.max_q,
                  spec.max_k, dropout_p=0.0, softmax_scale=scale, causal=spec.causal,
                  window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None,
                  deterministic=torch.are_deterministic_algorithms_enabled(), rng_state=None)
        return dq, dk, dv
