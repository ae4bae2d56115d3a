"""Recomputed norms: every RMSNorm runs over tiles of tokens, keeps only its input for the backward and recomputes
one tile at a time there.

Transformers' RMSNorm (Llama, Qwen, Mistral, Gemma, ...) computes in float32. Autograd keeps, per norm and token, a
float32 copy of the input, the normalised value and a ``rsqrt`` (about ``(4 + a) H`` bytes with ``a``-byte
activations), and its backward forms about six float32 ``[T, H]`` temporaries at once. Once the loss is tiled and
the layers are checkpointed and offloaded, that backward is the largest working set of a long row. With this lever a
norm is a per-token function computed tile by tile (:func:`~.tiled_mlp.tiled_apply`, as the tiled MLP): it saves
only its input (which the residual stream, or the projection before a q / k norm, holds anyway) and its backward's
float32 temporaries exist for one tile at a time. Exact: the same operations on the same tokens; the weight's
gradient is summed over tiles.

Why by hand: ``RMSNorm`` carries Transformers' ``use_kernel_forward_from_hub("RMSNorm")``, but that hook swaps in
a hub kernel's class, and none keeps only the input; so :func:`enable_norm_recompute` gives each norm instance a
forward of its own (a :class:`~.tiled_mlp.TiledForward` instance attribute, recorded in ``prepare_model``'s journal,
whose ``undo()`` removes it): the class, the module tree and the state dict are unchanged.
"""
from __future__ import annotations

from torch import nn

from ..log import get_logger
from ..model_state import ModelChanges
from .tiled_mlp import DEFAULT_TILE_TOKENS, TiledForward

__all__ = ["enable_norm_recompute"]

logger = get_logger(__name__)


def _is_rms_norm(module: nn.Module) -> bool:
    """A Transformers RMSNorm (by class name: every family defines its own) with no submodules."""
    return type(module).__name__.endswith("RMSNorm") and not any(True for _ in module.children())


def enable_norm_recompute(model: nn.Module, changes: ModelChanges, *, tile_tokens: int = DEFAULT_TILE_TOKENS) -> int:
    """Recompute every RMSNorm of ``model`` in backward, over tiles of ``tile_tokens`` tokens (module docstring).

    Args:
        model: the model, before wrapping.
        changes: ``prepare_model``'s journal (its ``undo()`` gives the norms their class's forward back).
        tile_tokens: tokens per tile.

    Returns:
        The number of norms changed.
    """
    n = 0
    for module in model.modules():
        if _is_rms_norm(module):
            changes.set(module, "forward", TiledForward(module, tile_tokens, keep_input_only=True))
            n += 1
    logger.info("hf_hsap: %d RMSNorms of %s keep only their input for the backward (recomputed)", n,
                type(model).__name__)
    return n
