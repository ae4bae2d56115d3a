"""CUDA kernels: flash-attn's varlen functions when installed, else PyTorch's built-in varlen flash.

Both run a whole varlen call in one launch, with bottom-right causal masking, flash-attn's sliding
windows (``window_size=(window_left, 0 if causal else -1)``, bottom-right aligned: the package's
``VarlenSpec.window_left``) and native GQA. flash-attn (>= 2.7) also soft-caps the scores; PyTorch's op
cannot, and refuses a softcap. They need float16/bfloat16 inputs; :func:`hf_hsap.kernels.select_kernel`
refuses other dtypes on CUDA. Nothing here is imported or called on CPU-only code paths.
"""
from __future__ import annotations

import inspect

import torch

from .base import VarlenSpec, check_shapes

_NO_SOFTCAP = ("PyTorch's CUDA flash attention (torch-cuda-flash) has no logit soft-capping: install flash-attn "
               ">= 2.7 (pip install flash-attn), which hf_hsap then picks by itself, or run the math kernel on "
               "purpose with kernel=select_kernel(device, dtype, prefer='math') (blocks of dense scores: far "
               "slower)")


def _lse_rows(lse_hn: torch.Tensor) -> torch.Tensor:
    """``[H, N] -> [N, H]`` float32 (the package's lse layout). The flash kernels give ``+inf`` to a row that sees
    no key; the package's contract is ``-inf`` (what the merge and the sinks expect)."""
    lse = lse_hn.transpose(0, 1).float()
    return lse.masked_fill(lse == float("inf"), float("-inf"))


def _lse_op(lse: torch.Tensor) -> torch.Tensor:
    """``[N, H] -> [H, N]`` float32 contiguous, rows that see no key back at the kernels' ``+inf``."""
    lse = lse.transpose(0, 1).float()
    return lse.masked_fill(lse == float("-inf"), float("inf")).contiguous()


def _windows(spec: VarlenSpec) -> tuple[int, int]:
    """flash-attn's ``(window_size_left, window_size_right)`` of a spec (``-1``: unbounded)."""
    if spec.window_left is None:
        return -1, -1
    return spec.window_left, 0 if spec.causal else -1


def _has_window_args(op) -> bool:
    """Whether an aten op's schema takes ``window_size_left`` / ``window_size_right``."""
    names = {a.name for a in op.default._schema.arguments}
    return {"window_size_left", "window_size_right"} <= names


class TorchCUDAFlashKernel:
    """``aten._flash_attention_forward`` / ``_flash_attention_backward`` with ``cum_seq_q/k``."""

    name = "torch-cuda-flash"
    supports_window = True
    supports_softcap = False  # the op has none: forward refuses it, naming flash-attn

    def _window_kw(self, spec: VarlenSpec) -> dict:
        """The ops' window keywords for ``spec`` (none without a window: the call of the older contract)."""
        if spec.window_left is None:
            return {}
        for op in (torch.ops.aten._flash_attention_forward, torch.ops.aten._flash_attention_backward):
            if not _has_window_args(op):
                raise ValueError(
                    f"this PyTorch ({torch.__version__}) has no sliding windows in its CUDA flash attention: "
                    "install flash-attn >= 2.7 (which hf_hsap then picks by itself), upgrade PyTorch, or run "
                    "the math kernel on purpose with kernel=select_kernel(device, dtype, prefer='math')")
        left, right = _windows(spec)
        return {"window_size_left": left, "window_size_right": right}

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: VarlenSpec, scale: float, *,
        softcap: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes: q ``[Nq, Hq, D]``, k/v ``[Nk, Hkv, D]`` -> out ``[Nq, Hq, D]``, lse ``[Nq, Hq]``.

        Raises:
            ValueError: a ``softcap`` (this op has none), or a window this PyTorch's op cannot take.
        """
        if softcap is not None:
            raise ValueError(_NO_SOFTCAP)
        check_shapes(q, k, v, spec)
        cu_q, cu_k = spec.cu_tensors(q.device)
        out, lse, _, _, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, spec.max_q, spec.max_k, 0.0, spec.causal, False, scale=scale,
            **self._window_kw(spec))
        return out, _lse_rows(lse)

    def backward(self, dout, q, k, v, out, lse, *, spec: VarlenSpec, scale: float, softcap: float | None = None):
        """Gradients from the final ``out``/``lse`` (see the kernel contract). Shapes as :meth:`forward`."""
        if softcap is not None:
            raise ValueError(_NO_SOFTCAP)
        cu_q, cu_k = spec.cu_tensors(q.device)
        empty = torch.empty(0, dtype=torch.uint8, device=q.device)
        rng = torch.zeros(2, dtype=torch.uint64 if hasattr(torch, "uint64") else torch.int64,
                          device=q.device)
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout.to(q.dtype).contiguous(), q, k, v, out.to(q.dtype).contiguous(),
            _lse_op(lse), cu_q, cu_k, spec.max_q, spec.max_k, 0.0,
            spec.causal, rng, empty, scale=scale, **self._window_kw(spec))
        return dq, dk, dv


class FlashAttnKernel:
    """flash-attn (>= 2.7) ``_flash_attn_varlen_forward`` / ``_flash_attn_varlen_backward``."""

    name = "flash-attn"
    supports_window = True
    supports_softcap = True

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

    def forward(self, q, k, v, spec: VarlenSpec, scale: float, *, softcap: float | None = None):
        """Shapes as :class:`TorchCUDAFlashKernel.forward`; ``softcap``: ``None`` or the cap."""
        check_shapes(q, k, v, spec)
        cu_q, cu_k = spec.cu_tensors(q.device)
        left, right = _windows(spec)
        res = self._fwd(q, k, v, cu_q, cu_k, spec.max_q, spec.max_k, dropout_p=0.0,
                        softmax_scale=scale, causal=spec.causal, window_size_left=left,
                        window_size_right=right, softcap=float(softcap or 0.0), alibi_slopes=None,
                        return_softmax=False)
        return res[0], _lse_rows(res[1])

    def backward(self, dout, q, k, v, out, lse, *, spec: VarlenSpec, scale: float, softcap: float | None = None):
        """Gradients from the final ``out``/``lse`` (see the kernel contract)."""
        cu_q, cu_k = spec.cu_tensors(q.device)
        left, right = _windows(spec)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._bwd(dout.to(q.dtype).contiguous(), q, k, v, out.to(q.dtype).contiguous(),
                  _lse_op(lse), dq, dk, dv, cu_q, cu_k, spec.max_q,
                  spec.max_k, dropout_p=0.0, softmax_scale=scale, causal=spec.causal,
                  window_size_left=left, window_size_right=right, softcap=float(softcap or 0.0),
                  alibi_slopes=None, deterministic=torch.are_deterministic_algorithms_enabled(),
                  rng_state=None)
        return dq, dk, dv
