"""Which layers of a model are ``"indexed_attention"`` (DeepSeek-sparse) layers, read from the config and the modules
only (what :mod:`.model_check` and :mod:`.indexed` both ask)."""
from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from ..config import text_config

__all__ = ["INDEXED_LAYER_TYPE", "has_indexed_layers", "indexed_layers", "other_indexed_layers"]

INDEXED_LAYER_TYPE = "indexed_attention"


def has_indexed_layers(config: Any) -> bool:
    """Whether the config's decoder has ``"indexed_attention"`` layers (``config.layer_types``)."""
    types = getattr(text_config(config), "layer_types", None) or ()
    return INDEXED_LAYER_TYPE in {str(t) for t in types}


@functools.lru_cache(maxsize=None)
def _passes_indices(cls: type) -> bool:
    """Whether a layer class's forward hands the indexer's top-k to the attention interface as ``indices=`` (the
    DeepSeek-sparse contract :mod:`.indexed` implements), read from its source (cached per class)."""
    try:
        return "indices=" in inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False


def _indexed_candidates(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules with an ``indexer`` attribute (``None`` on layers that reuse the previous layer's top-k) whose
    ``config.layer_types[layer_idx]`` is ``"indexed_attention"``."""
    found = []
    for m in model.modules():
        config, idx = getattr(m, "config", None), getattr(m, "layer_idx", None)
        if not hasattr(m, "indexer") or config is None or not isinstance(idx, int):
            continue
        types = getattr(config, "layer_types", None) or ()
        if 0 <= idx < len(types) and str(types[idx]) == INDEXED_LAYER_TYPE:
            found.append(m)
    return found


def indexed_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder's DeepSeek-sparse indexed attention layers: indexed-attention modules that pass their top-k key
    indices to the attention interface (``indices=``); what :func:`prepare_indexed` makes exact."""
    return [m for m in _indexed_candidates(model) if _passes_indices(type(m))]


def other_indexed_layers(model: torch.nn.Module) -> list[str]:
    """Class names of indexed-attention layers that select their keys in their own code (a selection mask, pooled
    key blocks: Qwen4-Exp's QSA, GLM-5-Next's pooled indexer) rather than top-k indices through the interface."""
    return sorted({type(m).__name__ for m in _indexed_candidates(model) if not _passes_indices(type(m))})
