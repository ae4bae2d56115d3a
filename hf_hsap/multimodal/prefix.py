"""Prefix-LM vision-language models (PaliGemma): each document's image and prompt attend to each other both ways,
its suffix causally.

The family is read off the model, not listed: its text model is not causal by itself
(``use_bidirectional_attention``) and its forward takes ``token_type_ids``, from which it builds its mask
(``create_causal_mask`` with the type-0 tokens as one bidirectional group). On packed rows ``shard_batch`` turns
each document's type-0 run into a bidirectional block (:func:`hf_hsap.multimodal.shard.prefix_blocks`) that the
``"hsap"`` attention computes exactly at every SP size; the model's own overlay, which would join the prefixes of
different documents, is not used.
"""
from __future__ import annotations

import inspect
from collections.abc import Iterable

import torch

from ..model_state import PREFIX_LM, ModelChanges

__all__ = ["is_prefix_lm", "mark_prefix_lm", "prefix_token_types"]


def is_prefix_lm(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a prefix-LM vision-language model (see the module docstring)."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    if getattr(text, "use_bidirectional_attention", None) is not True:
        return False
    return "token_type_ids" in inspect.signature(type(model).forward).parameters


def mark_prefix_lm(model: torch.nn.Module, attention: Iterable[torch.nn.Module], changes: ModelChanges) -> bool:
    """Mark the decoder's attention layers of a prefix-LM as causal (``prepare_model`` calls this first).

    Their ``is_causal`` is False because the model's own mask makes them causal: the ``"hsap"`` mask function refuses
    a mask that is not, and the bidirectional prefixes come as the batch's blocks (``hsap_blocks``).

    Args:
        model: the model; attention: its decoder's attention layers; changes: the preparation's journal.

    Returns:
        Whether ``model`` is a prefix-LM (and its layers are now marked).
    """
    if not is_prefix_lm(model):
        return False
    for m in attention:
        if getattr(m, "is_causal", True) is False:
            changes.put(m, PREFIX_LM, True)
    return True


def prefix_token_types(n_tokens: int, n_prefix: int) -> torch.Tensor:
    """A prefix-LM document's ``token_type_ids``: 0 on its first ``n_prefix`` tokens (image and prompt), 1 on the
    rest (the suffix, causal), as PaliGemma's processor gives them.

    Shapes:
        Returns ``[n_tokens]`` int64.
    """
    types = torch.ones(n_tokens, dtype=torch.int64)
    types[:n_prefix] = 0
    return types
