"""Varlen attention kernels behind one interface (see :mod:`hf_hsap.kernels.base`)."""
from .base import AttentionKernel, InPlaceKernel, Segment, VarlenSpec, lse_dtype, merge_partial
from .cpu import TorchCPUFlashKernel
from .math import MathKernel
from .reference import reference_attention, reference_varlen_attention
from .select import select_kernel
from .varlen import varlen_attention

__all__ = [
    "AttentionKernel",
    "InPlaceKernel",
    "MathKernel",
    "Segment",
    "TorchCPUFlashKernel",
    "VarlenSpec",
    "lse_dtype",
    "merge_partial",
    "reference_attention",
    "reference_varlen_attention",
    "select_kernel",
    "varlen_attention",
]
