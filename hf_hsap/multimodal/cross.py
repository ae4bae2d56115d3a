"""Cross-attention vision-language models (Mllama / Llama-3.2-Vision, Idefics) on packed rows, under SP too.

Such a model does not put image features in the text: its vision tower's states are the keys and values of
cross-attention layers between the self-attention layers, and ``cross_attention_mask`` says which tiles of which
image each text token attends to (Idefics: ``image_attention_mask``, per image). It is read off the model, not listed:
its forward takes such a mask (Mllama's with ``aspect_ratio_ids`` / ``aspect_ratio_mask``, its images' tile layouts).
Per document, a token attends to its own document's images only:

- a token whose mask row is empty (before its document's first image) attends to all its document's image states
  evenly (the model zeroes an empty row of its additive mask) and its layer's MLP output is masked;
- a document without images skips the cross-attention layers (no states), so its tokens get nothing from them.

On a packed row the collator lays every document's mask block at its tokens and its images (:mod:`hf_hsap.data.cross`);
:func:`shard_cross` gives each rank its tokens' mask rows and the images of every document it holds a token of (each
holder encodes them; the SP group's gradient reduction sums the pieces), and :class:`CrossDocs`, each local token's
own images, with which the ``"hsap"`` attention computes every cross-attention call per document
(:mod:`hf_hsap.integrations.cross_attention`): no communication, the keys are local.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..data.cross import IMAGES_KEY
from ..data.vision import Modality, VisionLayout, VisionSpec

__all__ = ["CROSS_KEY", "CrossDocs", "cross_probe_inputs", "cross_spec", "is_cross_attention", "is_cross_attention_vlm",
           "shard_cross"]

CROSS_KEY = "hsap_cross"  # local batch key: the CrossDocs of this rank's tokens
# what a cross-attention VLM's forward takes besides pixel_values: Mllama's per-token mask with its images' tile
# layouts, Idefics' per-token image mask
_CROSS_INPUTS = {"cross_attention_mask": ("aspect_ratio_ids", "aspect_ratio_mask"), "image_attention_mask": ()}


@dataclass(frozen=True)
class CrossDocs:
    """Each local token's own images among the rank's images.

    Attributes:
        ranges: ``[T_local, 2]`` int64: the first and one-past-last local image of the token's document (equal: a
            document without images).
        n_images: the rank's images (the cross-attention keys are ``n_images`` equal runs, one per image).
    """

    ranges: torch.Tensor
    n_images: int


def _cross_inputs(model: torch.nn.Module) -> tuple[str, tuple[str, ...]] | None:
    """``(mask key, per-image keys)`` of a cross-attention VLM's forward, or ``None``."""
    try:
        forward = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return None
    if "pixel_values" not in forward:
        return None
    return next(((k, items) for k, items in _CROSS_INPUTS.items()
                 if k in forward and all(i in forward for i in items)), None)


def is_cross_attention_vlm(model: torch.nn.Module) -> bool:
    """Whether ``model`` attends to its images through cross-attention layers (see the module docstring)."""
    return _cross_inputs(model) is not None


@functools.lru_cache(maxsize=None)
def _takes_cross_states(cls: type) -> bool:
    try:
        return "cross_attention_states" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False


def is_cross_attention(module: torch.nn.Module) -> bool:
    """Whether an attention layer attends from the text to vision states (its forward takes
    ``cross_attention_states``, Mllama's, or it says ``is_cross_attention``, Idefics'): not the self-attention
    plan's business."""
    return getattr(module, "is_cross_attention", False) is True or _takes_cross_states(type(module))


def cross_spec(model: torch.nn.Module) -> VisionSpec:
    """The :class:`~hf_hsap.data.vision.VisionSpec` of a cross-attention family: images along axis 1 of
    ``pixel_values`` (Mllama's ``[1, images, tiles, C, H, W]`` with their ``aspect_ratio_ids`` / ``aspect_ratio_mask``
    and one ``<|image|>`` placeholder each; Idefics' ``[1, images, C, H, W]``, no placeholder id in its config) and
    the per-token mask (``cross_attention_mask`` / ``image_attention_mask``)."""
    config = model.config
    key, items = _cross_inputs(model)
    token = next((getattr(config, n) for n in ("image_token_index", "image_token_id")
                  if isinstance(getattr(config, n, None), int)), -1)  # Idefics: none (its mask says where)
    mod = Modality("image", token, "pixel_values", item_keys=items, item_axis=1,
                   padded=("pixel_values", *items[1:]))
    return VisionSpec(VisionLayout(str(config.model_type), (mod,), cross_key=key))


def cross_probe_inputs(model: torch.nn.Module, spec: VisionSpec, device: torch.device, dtype: torch.dtype
                       ) -> dict[str, Any] | None:
    """``check_model``'s probe inputs for a cross-attention family: ``None`` (a text probe) where the model runs text
    alone (Mllama skips its cross-attention layers then, as a rank holding no image does, so they are not counted);
    else two tokens attending to one zero image (Idefics runs nothing without an image).

    Args:
        model: the model; spec: its :func:`cross_spec`; device, dtype: of the inputs and pixels.
    """
    m = spec.layout.modalities[0]
    if m.token_id >= 0 or m.item_keys:  # Mllama: a text forward runs
        return None
    vision = model.config.vision_config
    size = int(vision.image_size)
    pixels = torch.zeros(1, 1, int(getattr(vision, "num_channels", 3)), size, size, device=device, dtype=dtype)
    return {"input_ids": torch.ones(1, 2, dtype=torch.long, device=device), m.pixel_key: pixels,
            spec.layout.cross_key: torch.ones(1, 2, 1, dtype=torch.long, device=device)}


def shard_cross(batch: Mapping[str, Any], layout: VisionLayout, shard: Any) -> dict[str, Any]:
    """This rank's images, their per-image keys, its tokens' mask rows and :class:`CrossDocs`.

    Args:
        batch: the packed batch (``pixel_values [1, N, ...]``, the cross mask ``[B, L, N, ...]`` and
            ``hsap_cross_images [B, L, 2]``, :mod:`hf_hsap.data.cross`); layout: its layout;
        shard: ``plan.shard`` for this rank (``[B * L, ...] -> [T_local, ...]``).

    Returns:
        ``{pixel_values, its per-image keys, cross mask [1, T_local, n, ...]}`` of the rank's ``n`` images (the
        images of every document it holds a token of; a rank holding none gets the batch's first image, which none
        of its tokens attends to, as Idefics runs no forward without an image) and ``{CROSS_KEY: CrossDocs}``.

    Raises:
        ValueError: the batch's images and its documents' image ranges disagree.
    """
    m = layout.modalities[0]
    pixels = batch.get(m.pixel_key)
    n_total = 0 if pixels is None else int(pixels.shape[m.item_axis])
    ranges = batch.get(IMAGES_KEY)
    if ranges is None:
        if n_total:
            raise ValueError(f"the batch has {m.pixel_key} but no {IMAGES_KEY} (each token's images); pack the "
                             "documents with PackingCollator(max_length, vision=hf_hsap.vision_spec(model))")
        return {CROSS_KEY: None}
    ranges = torch.as_tensor(ranges)
    if int(ranges.max()) > n_total:
        raise ValueError(f"the batch's documents hold {int(ranges.max())} images but its {m.pixel_key} has {n_total}; "
                         "pack the documents with PackingCollator(max_length, vision=hf_hsap.vision_spec(model))")
    mine = shard(ranges.reshape(-1, 2)).to("cpu").numpy()  # [T_local, 2] global images of each local token
    pairs = np.unique(mine[mine[:, 1] > mine[:, 0]], axis=0)
    images = np.concatenate([np.arange(lo, hi) for lo, hi in pairs] + [np.zeros(0, np.int64)]).astype(np.int64)
    if images.size == 0 and n_total:  # a rank with no document's image (Idefics runs no forward without one):
        images = np.zeros(1, dtype=np.int64)  # the batch's first image, attended by none of its tokens (output 0)
    local_of = np.zeros(max(n_total, 1), dtype=np.int64)
    local_of[images] = np.arange(images.size)
    lo = np.where(mine[:, 1] > mine[:, 0], local_of[np.minimum(mine[:, 0], max(n_total - 1, 0))], 0)
    local_ranges = torch.from_numpy(np.stack([lo, lo + mine[:, 1] - mine[:, 0]], axis=1))
    out: dict[str, Any] = {CROSS_KEY: CrossDocs(local_ranges, int(images.size))}
    if images.size:
        idx = torch.from_numpy(images)
        for key in (m.pixel_key, *m.item_keys):
            if batch.get(key) is not None:
                value = torch.as_tensor(batch[key])
                out[key] = value.index_select(m.item_axis, idx.to(value.device))
        mask = torch.as_tensor(batch[layout.cross_key])
        rows = shard(mask.reshape(-1, *mask.shape[2:]))  # [T_local, N, ...]
        out[layout.cross_key] = rows.index_select(1, idx.to(rows.device)).unsqueeze(0)  # [1, T_local, n, ...]
    return out
