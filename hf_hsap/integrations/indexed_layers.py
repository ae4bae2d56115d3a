"""Which layers of a model are ``"indexed_attention"`` (DeepSeek-sparse) layers, read from the config and the modules
only (what :mod:`.model_check` and :mod:`.indexed` both ask)."""
from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from ..config import text_config

__all__ = ["INDEXED_LAYER_TYPE", "KIND_INDICES", "KIND_SELECT_MASK", "KIND_TOPK_MASK", "has_indexed_layers",
           "indexed_kind", "indexed_layers", "other_indexed_layers"]

INDEXED_LAYER_TYPE = "indexed_attention"
# How an indexed layer hands its indexer's selection to the attention (what :mod:`.indexed` adapts to):
KIND_INDICES = "indices"  # top-k indices passed to the attention interface as `indices=` (DeepSeek-V3.2, ...)
KIND_TOPK_MASK = "topk_mask"  # top-k indices turned into a dense mask by the layer's `build_attention_mask_from_topk`
# (GLM-5-Next's pooled indexer)
KIND_SELECT_MASK = "select_mask"  # the indexer returns a bool selection mask that the layer ANDs with its causal
# mask (Qwen4-Exp's QSA)


def has_indexed_layers(config: Any) -> bool:
    """Whether the config's decoder has ``"indexed_attention"`` layers (``config.layer_types``)."""
    types = getattr(text_config(config), "layer_types", None) or ()
    return INDEXED_LAYER_TYPE in {str(t) for t in types}


def _source(fn: Any) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


@functools.lru_cache(maxsize=None)
def indexed_kind(cls: type) -> str | None:
    """How an indexed layer class hands its indexer's selection to the attention (``KIND_*``), read from its methods
    and source (cached per class); ``None``: none hf_hsap knows (the layer is refused).

    Args:
        cls: the class of an ``"indexed_attention"`` layer (one with an ``indexer`` attribute).
    """
    if callable(getattr(cls, "build_attention_mask_from_topk", None)):
        return KIND_TOPK_MASK
    src = _source(cls.forward)
    if "selected_token_mask" in src and "& selected_token_mask" in src:
        return KIND_SELECT_MASK
    if "indices=" in src:
        return KIND_INDICES
    return None


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
    """The decoder's indexed attention layers of a kind hf_hsap knows (:func:`indexed_kind`: top-k indices through
    the attention interface, or a mask the layer builds from its indexer's top-k or selection); what
    :func:`prepare_indexed` makes exact."""
    return [m for m in _indexed_candidates(model) if indexed_kind(type(m)) is not None]


def other_indexed_layers(model: torch.nn.Module) -> list[str]:
    """Class names of indexed-attention layers that hand their selection to the attention in a way
    :func:`indexed_kind` does not know (refused by the model check)."""
    return sorted({type(m).__name__ for m in _indexed_candidates(model) if indexed_kind(type(m)) is None})
