"""Which attention layers see a batch's bidirectional image blocks.

Gemma 3 applies its image blocks on every layer. Gemma 4's text config says ``use_bidirectional_attention='vision'``:
its sliding-window layers see ``window AND (causal OR same image)``, its full-attention layers stay causal
(Transformers' ``create_masks_for_vision_model``). The blocks a batch carries (``hsap_blocks`` from
``shard_batch``) are therefore dropped on a full-attention layer of such a model; on a sliding layer an image's later
keys lie ahead of its queries, so the window (which bounds only earlier keys) leaves the block whole.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["SLIDING_ONLY", "layer_blocks", "sliding_only_blocks"]

SLIDING_ONLY = "vision"  # the text config's use_bidirectional_attention value: image blocks on sliding layers only


def sliding_only_blocks(config: Any) -> bool:
    """Whether a (text) config's image blocks apply on its sliding-window layers only (Gemma 4's ``'vision'``)."""
    return getattr(config, "use_bidirectional_attention", None) == SLIDING_ONLY


def layer_blocks(module: torch.nn.Module, blocks: Any, window: int | None) -> Any:
    """The blocks one attention layer applies.

    Args:
        module: the attention layer (its ``config`` is the text config); blocks: the batch's ``hsap_blocks`` or
            ``None``; window: the layer's sliding window in tokens, ``None`` for full attention.

    Returns:
        ``blocks``, or ``None`` on a full-attention layer of a model whose blocks are on sliding layers only.
    """
    if blocks is not None and window is None and sliding_only_blocks(getattr(module, "config", None)):
        return None
    return blocks
