"""Indexed-attention layers that turn their indexer's selection into the attention mask in their own code.

Two kinds besides DeepSeek-V3.2's top-k ``indices=`` (:func:`~.indexed_layers.indexed_kind`), made exact per document
by :mod:`.indexed` with the helpers here:

* ``"topk_mask"`` (GLM-5-Next): the indexer returns top-k key indices (of 16-token key pools, plus the incomplete
  tail pool) and the layer's ``build_attention_mask_from_topk`` scatters them into a dense mask over its *local* keys.
  hf_hsap runs the indexer on each document alone (global key indices, as for DeepSeek) and replaces that method on
  the layer instance (:func:`topk_mask_builder`) by one that scatters the indices over the whole row's keys and keeps
  the document-causal mask of the call (``INDEXED_MASK``, set by the layer's pre-hook): the bool ``[B, 1, S, L]``
  mask that reaches the ``"hsap"`` attention is then exactly the keys the document alone attends to.
* ``"select_mask"`` (Qwen4-Exp's QSA): the indexer itself returns a bool ``[B, 1, S, L]`` selection mask, read off
  the visible keys of the layer's 4-D mask, which the layer ANDs with that mask. hf_hsap hands the layer the
  document-causal mask, runs the indexer on each document alone and places each document's selection
  (:func:`place_selection`) in the row's mask.

Either way the attention gets no ``indices`` and its bool mask is the allowed keys (:func:`~.indexed.indexed_forward`).
"""
from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from ..model_state import INDEXED_MASK, state_of

__all__ = ["check_padding", "place_selection", "topk_mask_builder"]


def check_padding(module: torch.nn.Module, mask: Any, plan: Any, *, fix: str) -> None:
    """Refuse a ``"topk_mask"`` layer's own mask unless it is a ``[B, S]`` bool padding mask, and padding in a row
    split over ranks (the indexer of a document alone sees no padding).

    Args:
        module: the layer. mask: the ``attention_mask`` it got. plan: the call's plan, or ``None``. fix: the fix to
            name for a mask of another kind.
    """
    if mask is not None and (not torch.is_tensor(mask) or mask.dtype != torch.bool or mask.dim() != 2):
        raise ValueError(f"{type(module).__name__}: an indexed-attention layer that builds its own mask got "
                         f"{type(mask).__name__} {tuple(getattr(mask, 'shape', ()))}, not its [B, S] bool padding "
                         f"mask; {fix}")
    if plan is not None and plan.size > 1 and mask is not None and not bool(mask.all()):
        raise ValueError(f"{type(module).__name__}: padding inside a row split over ranks; pack rows without padding "
                         "(PackingCollator) under sequence parallelism")


def _selected(topk_indices: torch.Tensor, n_keys: int) -> torch.Tensor:
    """The keys named by top-k indices (negative or past the row: none). Shapes: ``[B, S, k] -> [B, S, L]`` bool."""
    idx = topk_indices.long()
    idx = torch.where((idx < 0) | (idx >= n_keys), torch.full_like(idx, n_keys), idx)
    picked = torch.zeros(*idx.shape[:2], n_keys + 1, dtype=torch.bool, device=idx.device)
    return picked.scatter(-1, idx, True)[..., :n_keys]


def topk_mask_builder(layer: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """The ``build_attention_mask_from_topk`` of a ``"topk_mask"`` layer instance (bound to it): the selected keys of
    the whole row (global indices) within the call's document-causal mask.

    Args:
        layer: the indexed layer (its pre-hook stores the call's mask under ``INDEXED_MASK``).

    Returns:
        The bound method; it takes ``(topk_indices [B, S, k], query_states, kv_length)`` (the local key count is not
        used: the indices are global) and returns a bool ``[B, 1, S, L]`` mask.
    """

    def build(self: torch.nn.Module, topk_indices: torch.Tensor, query_states: torch.Tensor | None = None,
              kv_length: int | None = None) -> torch.Tensor:
        allowed = state_of(self, INDEXED_MASK)  # [B or 1, 1, S, L]
        if allowed is None:
            raise ValueError(f"{type(self).__name__}: its top-k mask was built outside a forward that hf_hsap "
                             "prepared (the layer's pre-hook gives the documents); call the model, not the layer")
        return allowed & _selected(topk_indices, allowed.shape[-1])[:, None]

    return types.MethodType(build, layer)


def place_selection(picked: list[tuple[int, torch.Tensor, tuple[int, int], torch.Tensor]], *, batch: int, local: int,
                    length: int, device: torch.device) -> torch.Tensor:
    """The row's selection mask from each document's own (``"select_mask"`` indexers run per document).

    Args:
        picked: ``(row, query rows [n_rows], (start, end) span, selection [n_rows, end - start] bool)`` per document.
        batch, local: the call's rows and local queries. length: the row's keys (global). device: of the result.

    Returns:
        Shapes: ``[B, 1, S, L]`` bool, false outside each query's document.
    """
    out = torch.zeros(batch, 1, local, length, dtype=torch.bool, device=device)
    for row, rows, span, sel in picked:
        out[row, 0, rows, span[0]:span[1]] = sel
    return out
