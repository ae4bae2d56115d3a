"""Learned embeddings at each item's start / end tokens (Ovis 2.5's visual indicators), on packed rows and under SP.

Ovis 2.5 writes a learned row over each image's start and end tokens and each video's (its projector's
``get_visual_indicator_features``: image start, image end, video start, video end, the same row for every item), in
its private merge, which also checks that one forward holds as many start and end tokens as encoded items. A rank's
part of a packed row may hold an item's start token but not its end token, or boundary tokens of an item another
rank encodes, or no pixels at all, so that check cannot hold and the rows would not be written. hf_hsap writes them
at the token level instead (:func:`prepare_indicators`):

- a forward hook on the input embeddings replaces every boundary token's embedding with its indicator row (the
  model's own rows, gradients into its own table), on every rank and whatever items it encodes;
- the model's merge is replaced by its placeholder part alone (the model's ``get_placeholder_mask`` and
  ``masked_scatter``); the per-item rows are checked every forward by :mod:`.select` and each document's boundary
  tokens against its items by the collator (:func:`check_boundaries`, the spec's document check).

The boundary ids come from the config (``{image,video}_{start,end}_token_id``) in the model's indicator order.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["BOUNDARY_KEYS", "boundary_check", "boundary_ids", "has_indicators", "indicators_supported",
           "prepare_indicators"]

# the config's boundary tokens, in the order of the model's indicator rows (Ovis 2.5: image start / end, video ...)
BOUNDARY_KEYS = ("image_start_token_id", "image_end_token_id", "video_start_token_id", "video_end_token_id")
_MERGE = "_merge_visual_features"  # the model's merge of features and boundary rows (replaced, see the docstring)
_MERGE_PARAMS = ("input_ids", "inputs_embeds", "visual_features", "is_video")


def _projector(inner: torch.nn.Module) -> Any:
    return getattr(inner, "multi_modal_projector", None)


def has_indicators(inner: torch.nn.Module) -> bool:
    """Whether the model writes learned rows over its items' start / end tokens (``get_visual_indicator_features``)."""
    return callable(getattr(_projector(inner), "get_visual_indicator_features", None))


def boundary_ids(config: Any) -> list[int] | None:
    """The boundary token ids in indicator order, or ``None`` when the config does not name all of them."""
    ids = [getattr(config, k, None) for k in BOUNDARY_KEYS]
    return ids if all(isinstance(i, int) for i in ids) else None


def indicators_supported(model: torch.nn.Module, inner: torch.nn.Module) -> bool:
    """Whether :func:`prepare_indicators` reads this model: its config names every boundary token, its projector
    gives one indicator row per boundary token, and its merge is the one it replaces (same parameters)."""
    ids = boundary_ids(model.config)
    merge = getattr(inner, _MERGE, None)
    if ids is None or not callable(merge):
        return False
    if tuple(inspect.signature(merge).parameters) != _MERGE_PARAMS:
        return False
    count = getattr(getattr(model.config, "vision_config", None), "num_visual_indicator_tokens", len(ids))
    return int(count) == len(ids)


def boundary_check(config: Any, *, grid_keys: Mapping[str, str]) -> Callable[[Mapping[str, Any], int], dict[str, Any]]:
    """The collator's document check of a family with indicators: each document holds one start and one end token
    per item of each modality (what the model checks on a document alone).

    Args:
        config: the model's config; grid_keys: ``{"image": "image_grid_thw", "video": "video_grid_thw"}``: the
            per-item key whose rows count the items.

    Returns:
        ``document(example, n) -> example`` (unchanged), raising ``ValueError`` naming the document and the counts.
    """
    ids = dict(zip(BOUNDARY_KEYS, boundary_ids(config) or []))

    def document(ex: Mapping[str, Any], n: int) -> dict[str, Any]:
        tokens = torch.as_tensor(ex["input_ids"]).reshape(-1)
        for name, key in grid_keys.items():
            grid = ex.get(key)
            items = 0 if grid is None else int(torch.as_tensor(grid).reshape(-1, 3).shape[0])
            for side in ("start", "end"):
                token = ids[f"{name}_{side}_token_id"]
                found = int((tokens == token).sum())
                if found != items:
                    raise ValueError(f"example {n} holds {found} {name} {side} tokens (id {token}) for its {items} "
                                     f"{name}(s) ({key}); the model writes a learned row over one per {name}: "
                                     "tokenize each document with the model's processor and keep its pixels with it")
        return dict(ex)

    return document


def prepare_indicators(model: torch.nn.Module, inner: torch.nn.Module, changes: Any) -> bool:
    """Write the indicator rows at the token level and reduce the model's merge to its placeholders (module
    docstring).

    Args:
        model: the model; inner: its module with the merge; changes: the preparation's journal
            (:class:`~hf_hsap.model_state.ModelChanges`).

    Returns:
        Whether the model has indicators (and is now prepared).
    """
    if not has_indicators(inner) or not indicators_supported(model, inner):
        return False
    ids = boundary_ids(model.config)
    projector = _projector(inner)
    embed = inner.get_input_embeddings()

    def boundaries(module: torch.nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        tokens = args[0] if args else None
        if not torch.is_tensor(tokens) or tokens.dim() == 0:
            return output
        marks = [tokens == t for t in ids]
        if not any(bool(m.any()) for m in marks):
            return output
        rows = projector.get_visual_indicator_features(output.device).to(output.dtype)  # [4, D]
        for k, mark in enumerate(marks):
            output = torch.where(mark.unsqueeze(-1), rows[k], output)
        return output

    def merge(input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor, visual_features: Any,
              is_video: bool) -> torch.Tensor:
        if input_ids is None:
            raise ValueError(f"{model.config.model_type} on packed rows takes input_ids (its item boundary rows are "
                             "written from them), not inputs_embeds")
        feats = torch.cat(list(visual_features), dim=0).to(inputs_embeds.device, inputs_embeds.dtype)
        image_mask, video_mask = inner.get_placeholder_mask(
            input_ids, inputs_embeds=inputs_embeds, image_features=None if is_video else feats,
            video_features=feats if is_video else None)
        return inputs_embeds.masked_scatter(video_mask if is_video else image_mask, feats)

    changes.hook(embed.register_forward_hook(boundaries))
    changes.set(inner, _MERGE, merge)
    return True
