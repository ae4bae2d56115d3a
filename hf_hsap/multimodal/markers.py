"""Per-token modality keys that also mark an item's start / end tokens (ERNIE-4.5-VL's ``moe_mm_token_type_ids``).

ERNIE-4.5-VL routes each token to its text or its vision experts by ``moe_mm_token_type_ids``: the modality type
(1 image, 2 video) on each placeholder *and* on the start / end tokens around it, 0 elsewhere (its processor's
``create_moe_mm_token_type_ids``). Such a key is a plain per-token value: the packing collator concatenates each
document's own (or fills it from the token ids, as the processor does) and ``shard_batch`` gives each rank its
tokens' slice, so every token keeps its own routing on a packed row and under SP.

The rule, read from the model: a forward key that is a variant of the multimodal types (``*_mm_token_type_ids``)
is such a key where the config names start or end tokens of a modality (``{image,video}_start_token_id`` /
``_end_token_id``): each of those, and the modality's placeholder, gets the modality's type. Any other per-token key
stays refused by :func:`~hf_hsap.multimodal.spec.vision_spec` (named).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .structure import CARRIED_KEYS, token

__all__ = ["MODALITY_TYPES", "marker_keys", "marker_types"]

MODALITY_TYPES = (("image", 1), ("video", 2))  # a modality's value in the per-token type keys


def marker_types(config: Any) -> dict[int, int]:
    """``{token id: type}``: each modality's placeholder and its start / end tokens, where the config names start or
    end tokens (else empty).

    Args:
        config: the model's config.

    Returns:
        The types of the marked tokens (``{}`` when the config names no start / end token).
    """
    out: dict[int, int] = {}
    marks = False
    for name, kind in MODALITY_TYPES:
        for suffix in ("start_token_id", "end_token_id"):
            value = token(config, f"{name}_{suffix}")
            if value is not None:
                out[value] = kind
                marks = True
        placeholder = token(config, f"{name}_token_id", f"{name}_token_index")
        if placeholder is not None:
            out[placeholder] = kind
    return out if marks else {}


def marker_keys(config: Any, keys: Iterable[str]) -> dict[str, dict[int, int]]:
    """The forward's further per-token type keys this module derives (see the module docstring).

    Args:
        config: the model's config; keys: its forward's keys.

    Returns:
        ``{key: {token id: type}}`` (empty when there is none, or the config names no start / end token).
    """
    extra = sorted(k for k in keys if k.endswith("_mm_token_type_ids") and k not in CARRIED_KEYS)
    types = marker_types(config)
    return {k: dict(types) for k in extra} if types else {}
