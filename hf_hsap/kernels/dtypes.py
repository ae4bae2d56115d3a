"""The dtype the attention runs in: one rule for the "hsap" attention function and ``hsap_attn_func``.

Under autocast, Transformers hands the attention q and k in float32 (RoPE is computed outside autocast's
lower-precision ops) and v in the autocast dtype. SDPA under autocast and Transformers' flash integration
(``get_target_dtype``) both compute in the autocast dtype; so does hf_hsap. Without autocast, mixed inputs are
promoted to their common dtype (exact), and equal ones are left alone.
"""
from __future__ import annotations

import torch

__all__ = ["attention_dtype", "cast_qkv"]


def attention_dtype(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.dtype:
    """The dtype q, k, v are computed in.

    Returns:
        The autocast dtype of the inputs' device when autocast is on there and the inputs promote to float32
        (autocast leaves float64 alone, as SDPA does); else the promoted dtype of q, k, v.
    """
    device_type = query.device.type
    promoted = torch.promote_types(torch.promote_types(query.dtype, key.dtype), value.dtype)
    if torch.is_autocast_enabled(device_type):
        if promoted == torch.float32:
            return torch.get_autocast_dtype(device_type)
    return promoted


def cast_qkv(query: torch.Tensor, key: torch.Tensor,
             value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v in :func:`attention_dtype` (differentiable casts; no copies when already there)."""
    dtype = attention_dtype(query, key, value)
    return query.to(dtype), key.to(dtype), value.to(dtype)
