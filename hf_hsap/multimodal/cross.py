"""Cross-attention vision-language models (Mllama / Llama-3.2-Vision) on packed rows, under SP too.

Such a model does not put image features in the text: its vision tower's states are the keys and values of
cross-attention layers between the self-attention layers, and ``cross_attention_mask`` says which tiles of which
image each text token attends to. It is read off the model, not listed: its forward takes ``cross_attention_mask``
and ``aspect_ratio_ids`` (the images' tile layouts). Per document, a token attends to its own document's images only:

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

from ..data.vision import Modality, VisionLayout, VisionSpec

__all__ = ["CROSS_KEY", "CrossDocs", "cross_spec", "is_cross_attention", "is_cross_attention_vlm", "shard_cross"]

CROSS_KEY = "hsap_cross"  # local batch key: the CrossDocs of this rank's tokens
_CROSS_INPUTS = ("cross_attention_mask", "aspect_ratio_ids")  # what a cross-attention VLM's forward takes
_ITEM_KEYS = ("aspect_ratio_ids", "aspect_ratio_mask")  # per image, along axis 1 as the pixels


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


def is_cross_attention_vlm(model: torch.nn.Module) -> bool:
    """Whether ``model`` attends to its images through cross-attention layers (see the module docstring)."""
    forward = inspect.signature(type(model).forward).parameters
    return all(k in forward for k in _CROSS_INPUTS) and "pixel_values" in forward


@functools.lru_cache(maxsize=None)
def _takes_cross_states(cls: type) -> bool:
    try:
        return "cross_attention_states" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False


def is_cross_attention(module: torch.nn.Module) -> bool:
    """Whether an attention layer attends from the text to vision states (its forward takes
    ``cross_attention_states``): not the self-attention plan's business."""
    return _takes_cross_states(type(module))


def cross_spec(model: torch.nn.Module) -> VisionSpec:
    """The :class:`~hf_hsap.data.vision.VisionSpec` of a cross-attention family: images ``pixel_values [1, images,
    tiles, C, H, W]`` (item axis 1) with their ``aspect_ratio_ids`` / ``aspect_ratio_mask``, one placeholder token
    each (Mllama's ``<|image|>``), and the ``cross_attention_mask`` of every token."""
    config = model.config
    token = next(getattr(config, n) for n in ("image_token_index", "image_token_id")
                 if isinstance(getattr(config, n, None), int))
    mod = Modality("image", token, "pixel_values", item_keys=_ITEM_KEYS, item_axis=1, padded=("pixel_values",
                   "aspect_ratio_mask"))
    return VisionSpec(VisionLayout(str(config.model_type), (mod,), cross_key="cross_attention_mask"))


def shard_cross(batch: Mapping[str, Any], layout: VisionLayout, ids: torch.Tensor, cu_seqlens: torch.Tensor,
                shard: Any) -> dict[str, Any]:
    """This rank's images, their per-image keys, its tokens' mask rows and :class:`CrossDocs`.

    Args:
        batch: the packed batch (``pixel_values [1, N, ...]``, ``cross_attention_mask [B, L, N, T]``);
        layout: its layout; ids: ``[B * L]`` token ids; cu_seqlens: ``[n + 1]`` documents over them;
        shard: ``plan.shard`` for this rank.

    Returns:
        ``{pixel_values, aspect_ratio_ids, aspect_ratio_mask, cross_attention_mask [1, T_local, n, T]}`` of the
        rank's ``n`` images (left out when it holds none) and ``{CROSS_KEY: CrossDocs}``.

    Raises:
        ValueError: the placeholders and the images disagree.
    """
    m = layout.modalities[0]
    ids = ids.detach().to("cpu").reshape(-1)
    cu = np.asarray(torch.as_tensor(cu_seqlens).detach().to("cpu"), dtype=np.int64)
    if int(cu[-1]) != ids.numel():
        raise ValueError(f"the documents cover {int(cu[-1])} of the batch's {ids.numel()} tokens")
    pixels = batch.get(m.pixel_key)
    n_total = 0 if pixels is None else int(pixels.shape[m.item_axis])
    per_doc = np.add.reduceat((ids == m.token_id).numpy().astype(np.int64), cu[:-1]) * (np.diff(cu) > 0)
    if int(per_doc.sum()) != n_total:
        raise ValueError(f"the batch has {int(per_doc.sum())} {m.name} placeholder tokens (id {m.token_id}) for "
                         f"{n_total} images in {m.pixel_key}; one placeholder per image (the processor's)")
    first = np.concatenate([[0], np.cumsum(per_doc)[:-1]])
    doc_of = np.repeat(np.arange(cu.size - 1), np.diff(cu))  # [B*L]
    tokens = shard(torch.arange(ids.numel())).to("cpu").numpy()  # global index of every local token
    docs = doc_of[tokens]
    held = np.unique(docs)
    images = np.concatenate([np.arange(first[d], first[d] + per_doc[d]) for d in held] + [np.zeros(0, np.int64)])
    local_of = np.full(max(n_total, 1), -1, dtype=np.int64)
    local_of[images] = np.arange(images.size)
    lo = np.where(per_doc[docs] > 0, local_of[np.minimum(first[docs], max(n_total - 1, 0))], 0)
    ranges = torch.from_numpy(np.stack([lo, lo + per_doc[docs]], axis=1))
    out: dict[str, Any] = {CROSS_KEY: CrossDocs(ranges, int(images.size))}
    if images.size:
        idx = torch.from_numpy(images)
        for key in (m.pixel_key, *m.item_keys):
            if batch.get(key) is not None:
                value = torch.as_tensor(batch[key])
                out[key] = value.index_select(m.item_axis, idx.to(value.device))
        mask = torch.as_tensor(batch[layout.cross_key])
        flat = mask.reshape(-1, *mask.shape[2:])  # [B*L, N, T]
        rows = flat.index_select(0, torch.from_numpy(tokens).to(flat.device))
        out[layout.cross_key] = rows.index_select(1, idx.to(flat.device)).unsqueeze(0)  # [1, T_local, n, T]
    return out
