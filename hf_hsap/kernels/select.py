"""Choosing a kernel for a device and dtype."""
from __future__ import annotations

import logging

import torch

from ..log import get_logger, log_once
from .base import AttentionKernel
from .cpu import TorchCPUFlashKernel
from .math import MathKernel

_CPU_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16)
_CUDA_FLASH_DTYPES = (torch.float16, torch.bfloat16)

logger = get_logger(__name__)


def select_kernel(device: torch.device | str, dtype: torch.dtype, prefer: str | None = None) -> AttentionKernel:
    """The fastest exact kernel for ``device``/``dtype``.

    Args:
        device: where q, k, v live.
        dtype: their dtype.
        prefer: force ``"math"``, ``"torch-cpu-flash"``, ``"torch-cuda-flash"`` or ``"flash-attn"``.

    Returns:
        An :class:`~hf_hsap.kernels.base.AttentionKernel`. CPU: PyTorch's CPU flash attention
        (float32/64, bf16; windows and soft-capping too), else math. CUDA: flash-attn when installed, else
        PyTorch's varlen flash (fp16/bf16; windows, but it refuses a softcap); other dtypes raise
        ``ValueError`` (ask for ``prefer="math"`` explicitly). Every kernel takes the spec's window.
    """
    device = torch.device(device)
    if prefer is not None:
        return _by_name(prefer)
    if device.type == "cpu":
        kernel = TorchCPUFlashKernel() if dtype in _CPU_FLASH_DTYPES else MathKernel()
        _log_choice(device.type, str(dtype), type(kernel).__name__)
        return kernel
    if device.type == "cuda" and dtype in _CUDA_FLASH_DTYPES:
        from .cuda import FlashAttnKernel, TorchCUDAFlashKernel

        kernel = FlashAttnKernel() if FlashAttnKernel.available() else TorchCUDAFlashKernel()
        _log_choice(device.type, str(dtype), type(kernel).__name__)  # flash-attn missing: PyTorch's varlen flash
        return kernel
    if device.type == "cuda":
        # the math kernel materialises every document's [L, L] scores: never chosen silently on a GPU
        raise ValueError(
            f"hf_hsap has no memory-efficient CUDA kernel for {dtype} (the flash kernels take fp16 / bf16; the "
            "math kernel materialises blocks of scores: many times slower, and its work is quadratic): train under bf16 autocast "
            "(TrainingArguments(bf16=True), Accelerator(mixed_precision='bf16')) or load the model in bf16; pass "
            "kernel=MathKernel() (select_kernel(..., prefer='math')) to hsap_attn_func / varlen_attention to "
            "run the math kernel on purpose (e.g. float64 checks)")
    return MathKernel()


def _log_choice(device_type: str, dtype: str, kernel: str) -> None:
    """Say once per (device, dtype, kernel) which kernel runs (at INFO; remembered only while INFO is on, so
    turning logging on later still shows it)."""
    log_once(logger, logging.INFO, (device_type, dtype, kernel), "hf_hsap: attention on %s in %s runs %s",
             device_type, dtype, kernel)


def _by_name(name: str) -> AttentionKernel:
    if name == "math":
        return MathKernel()
    if name == "torch-cpu-flash":
        return TorchCPUFlashKernel()
    if name in ("torch-cuda-flash", "flash-attn"):
        from .cuda import FlashAttnKernel, TorchCUDAFlashKernel

        return FlashAttnKernel() if name == "flash-attn" else TorchCUDAFlashKernel()
    raise ValueError(f"unknown kernel {name!r}; use one of math, torch-cpu-flash, torch-cuda-flash, flash-attn")
