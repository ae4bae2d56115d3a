"""Which attention layers see a batch's bidirectional image blocks (``hsap_blocks`` from ``shard_batch``).

Gemma 3 and Gemma 4 unified apply their image blocks on every layer (their forward composes the blocks into every
layer kind's mask). Gemma 4's text config says ``use_bidirectional_attention='vision'`` and its forward builds its
masks with Transformers' ``create_masks_for_vision_model``: its sliding-window layers see ``window AND (causal OR
same image)``, its full-attention layers stay causal. :func:`mark_causal_layers` (``prepare_model``) marks those
full-attention layers, and :func:`layer_blocks` (the ``"hsap"`` attention) drops the blocks there. On a sliding
layer an image's later keys lie ahead of its queries, which the window (it bounds earlier keys only) keeps whole.
"""
from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch

from ..model_state import CAUSAL_LAYER, ModelChanges, state_of

__all__ = ["SLIDING_ONLY_MASKS", "layer_blocks", "mark_causal_layers", "vision_blocks"]

# The Transformers mask builder that gives image blocks to sliding-window layers only (Gemma 4).
SLIDING_ONLY_MASKS = "create_masks_for_vision_model"


def vision_blocks(config: Any) -> bool:
    """Whether a (text) config makes image placeholders attend to each other (``use_bidirectional_attention`` is
    ``'vision'``, Gemma 4's)."""
    return getattr(config, "use_bidirectional_attention", None) == "vision"


def _sliding_only(model: torch.nn.Module) -> bool:
    """Whether the model's forward builds its masks with :data:`SLIDING_ONLY_MASKS` (read off its own code: the
    mask each layer kind gets is decided inside the forward, with no config field saying which)."""
    if not vision_blocks(model.config.get_text_config()):
        return False
    for m in (getattr(model, "model", None), model):
        try:
            if m is not None and SLIDING_ONLY_MASKS in inspect.getsource(type(m).forward):
                return True
        except (OSError, TypeError):
            continue
    return False


def mark_causal_layers(model: torch.nn.Module, attention: Iterable[torch.nn.Module], changes: ModelChanges) -> int:
    """Mark the full-attention layers of a model whose image blocks are on its sliding layers only (Gemma 4).

    Args:
        model: the model; attention: its decoder's attention layers; changes: the preparation's journal.

    Returns:
        The number of layers marked (0 for every other model).
    """
    if not _sliding_only(model):
        return 0
    marked = [m for m in attention if getattr(m, "sliding_window", None) is None]
    for m in marked:
        changes.put(m, CAUSAL_LAYER, True)
    return len(marked)


def layer_blocks(module: torch.nn.Module, blocks: Any) -> Any:
    """The blocks one attention layer applies: ``blocks``, or ``None`` on a layer :func:`mark_causal_layers`
    marked."""
    return None if blocks is not None and state_of(module, CAUSAL_LAYER) else blocks
