"""Tiled attention: the single-device attention (``sp_size == 1``, and generation) runs its forward and backward in
query tiles (:class:`hf_hsap.kernels.TiledKernel`), so the kernel's backward buffers exist for one tile at a time.

Without it the backward of one varlen call over a packed row holds, per token, flash-attn's float32 ``dQ``
accumulator, ``dQ|dK|dV`` and under GQA ``dK|dV`` over the query heads (about 44 KB a token for Llama-3-8B: the
largest working set of a long row at SP 1 once the other levers are on). With it: ``dQ``, float32 ``dK|dV``
accumulators over the row and one tile's buffers. Exact (the same scores in disjoint blocks). Under SP the SAP
attention runs instead; this lever does not change it.

:func:`enable_tiled_attention` stores the tile on every decoder attention layer (:data:`~hf_hsap.model_state.
ATTENTION_TILES`, recorded in ``prepare_model``'s journal, whose ``undo()`` removes it); the single-device attention
(:func:`hf_hsap.integrations.local_attention.local_forward`) reads it.
"""
from __future__ import annotations

from typing import Sequence

from torch import nn

from ..log import get_logger
from ..model_state import ATTENTION_TILES, ModelChanges

__all__ = ["DEFAULT_ATTENTION_TILE_TOKENS", "enable_tiled_attention"]

logger = get_logger(__name__)

# Query rows per tile (and keys per chunk of the backward). Large enough that each kernel call fills a GPU (8K queries
# x 32 heads are 2,048 flash blocks of 128 rows) and that the Python loop's calls, about (T / 8K)^2 / 2 per layer for
# one document of T tokens, stay few beside the kernels' work; small enough that one tile's buffers (float32 dQ
# twice, dQ, GQA-expanded dK|dV) stay a small part of a GPU. A multiple of flash's 128-row blocks.
DEFAULT_ATTENTION_TILE_TOKENS = 8192


def enable_tiled_attention(model: nn.Module, changes: ModelChanges, *, attention_layers: Sequence[nn.Module],
                           tile_tokens: int = DEFAULT_ATTENTION_TILE_TOKENS) -> int:
    """Run every decoder attention layer's single-device attention in query tiles of ``tile_tokens`` (module
    docstring).

    Args:
        model: the model, before wrapping (its decoder's attention is ``"hsap"``: ``prepare_model`` set it).
        changes: ``prepare_model``'s journal (its ``undo()`` removes the tiles).
        attention_layers: the decoder's attention layers (``prepare_model`` finds them:
            :func:`hf_hsap.integrations.model_check.attention_modules`).
        tile_tokens: query rows per tile.

    Returns:
        The number of attention layers changed.

    Raises:
        ValueError: the model has no attention layer the ``"hsap"`` attention reaches.
    """
    layers = list(attention_layers)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no decoder attention layer calling the attention interface: "
                         "train without tiled_attention")
    for module in layers:
        changes.put(module, ATTENTION_TILES, int(tile_tokens))
    logger.info("hf_hsap: %d attention layers of %s run their single-device attention in query tiles of %d tokens",
                len(layers), type(model).__name__, tile_tokens)
    return len(layers)
