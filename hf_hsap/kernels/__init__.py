"""Varlen attention kernels behind one interface (see :mod:`hf_hsap.kernels.base`)."""
from .base import (AttentionKernel, InPlaceKernel, Segment, VarlenSpec, check_features, lse_dtype, merge_partial,
                   window_left)
from .cpu import TorchCPUFlashKernel
from .math import MathKernel
from .reference import reference_attention, reference_varlen_attention
from .select import select_kernel
from .sinks import apply_sinks, sinks_grad
from .tiled import TiledKernel
from .varlen import varlen_attention

__all__ = [
    "AttentionKernel",
    "InPlaceKernel",
    "MathKernel",
    "Segment",
    "TiledKernel",
    "TorchCPUFlashKernel",
    "VarlenSpec",
    "apply_sinks",
    "check_features",
    "lse_dtype",
    "merge_partial",
    "reference_attention",
    "reference_varlen_attention",
    "select_kernel",
    "sinks_grad",
    "varlen_attention",
    "window_left",
]
