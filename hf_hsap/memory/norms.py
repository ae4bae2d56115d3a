"""Norms recomputed in backward: every RMSNorm keeps only its input for the backward.

Transformers' RMSNorm (Llama, Qwen, Mistral, Gemma, ...) computes in float32 and autograd keeps, per norm and token,
a float32 copy of the input, the normalised value, the scaled output's operands and a ``rsqrt``: about ``(4 + 2a) H``
bytes with ``a``-byte activations, two or more norms a layer. Once the loss is tiled and the layers are checkpointed,
these are the largest tensors a recomputed layer holds. With this lever each norm runs under
``torch.utils.checkpoint`` (non-reentrant, nested inside the layer's own checkpoint): it saves only its input, which
the residual stream (or the projection before a q / k norm) holds anyway, and recomputes the elementwise
normalisation in backward. Exact: the recomputation runs the same operations on the same input.

Why by hand: ``RMSNorm`` carries Transformers' ``use_kernel_forward_from_hub("RMSNorm")``, but that hook swaps in
a hub kernel's class, and none keeps only the input; so :func:`enable_norm_recompute` gives each norm instance a
forward of its own (an instance attribute; :func:`disable_norm_recompute` removes it): the class, the module tree
and the state dict are unchanged.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..log import get_logger
from .forwards import has_forward, remove_forwards

__all__ = ["RecomputedNorm", "disable_norm_recompute", "enable_norm_recompute"]

logger = get_logger(__name__)


class RecomputedNorm:
    """The forward :func:`enable_norm_recompute` gives one norm instance: the class's forward, checkpointed while
    training with gradients."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        forward = type(self.module).forward.__get__(self.module)
        if not (self.module.training and torch.is_grad_enabled()):
            return forward(hidden, *args, **kwargs)
        return checkpoint(forward, hidden, *args, use_reentrant=False, **kwargs)


def _is_rms_norm(module: nn.Module) -> bool:
    """A Transformers RMSNorm (by class name: every family defines its own) with no submodules."""
    return type(module).__name__.endswith("RMSNorm") and not any(True for _ in module.children())


def enable_norm_recompute(model: nn.Module) -> int:
    """Recompute every RMSNorm of ``model`` in backward (module docstring); idempotent.

    Args:
        model: the model, before wrapping.

    Returns:
        The number of norms changed.
    """
    n = 0
    for module in model.modules():
        if _is_rms_norm(module) and not has_forward(module, RecomputedNorm):
            module.forward = RecomputedNorm(module)
            n += 1
    logger.info("hf_hsap: %d RMSNorms of %s keep only their input for the backward (recomputed)", n,
                type(model).__name__)
    return n


def disable_norm_recompute(model: nn.Module) -> int:
    """Undo :func:`enable_norm_recompute`; returns the number of norms restored."""
    return remove_forwards(model, RecomputedNorm)
