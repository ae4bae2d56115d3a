"""The per-token, per-image mask of a cross-attention vision-language model (Mllama's ``cross_attention_mask``) on
packed rows.

A document's mask is ``[1, n_tokens, n_images, n_tiles]``: which tiles of which of its own images each of its text
tokens attends to. A packed batch carries every document's images along one item axis (in document order, as the
pixels), so its mask is ``[B, L, N, T]`` with ``N`` the batch's images: each document's block sits at its tokens and
its images, zero elsewhere (no token attends to another document's image). Tiles are zero-padded to the batch's most.
Each token also gets its document's images (``hsap_cross_images [B, L, 2]``: first and one-past-last image of the
batch), what ``shard_batch`` gives each rank (:mod:`hf_hsap.multimodal.cross`): no placeholder is needed to find them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["IMAGES_KEY", "pack_cross_mask"]

IMAGES_KEY = "hsap_cross_images"  # batch key: [B, L, 2] the images of each token's document


def pack_cross_mask(key: str, pixel_key: str, examples: Sequence[Mapping[str, Any]], docs: list[tuple[np.ndarray,
                    np.ndarray]], rows: list[list[int]], row_len: int) -> dict[str, torch.Tensor]:
    """The packed batch's cross-attention mask.

    Args:
        key: the mask's key (``cross_attention_mask``); pixel_key: the images' pixels (axis 1 lists the images);
        examples: one document each; docs: ``(input_ids, labels)`` per document; rows: document indices per
        packed row; row_len: ``L``.

    Returns:
        ``{key: [B, L, N, T], IMAGES_KEY: [B, L, 2]}`` int64 (the mask's trailing per-image dimensions are the
        documents', Mllama's tiles or none; ``{}``: no document has images).

    Raises:
        ValueError: a document with images and no mask, or a mask whose shape disagrees with its tokens or images.
    """
    order = [i for row in rows for i in row]
    n_images = [int(torch.as_tensor(examples[i][pixel_key]).shape[1]) if examples[i].get(pixel_key) is not None
                else 0 for i in range(len(examples))]
    total = sum(n_images[i] for i in order)
    if total == 0:
        return {}
    masks: dict[int, torch.Tensor] = {}
    for i in order:
        if not n_images[i]:
            continue
        if examples[i].get(key) is None:
            raise ValueError(f"example {i} has {pixel_key} but no {key} (which of its images each token attends to); "
                             f"keep the processor's {key} with each document")
        mask = torch.as_tensor(examples[i][key])
        mask = mask[0] if mask.dim() > 2 and mask.shape[0] == 1 else mask
        if mask.dim() < 2 or mask.shape[0] != docs[i][0].size or mask.shape[1] != n_images[i]:
            raise ValueError(f"example {i}: {key} has shape {tuple(torch.as_tensor(examples[i][key]).shape)} for "
                             f"{docs[i][0].size} tokens and {n_images[i]} images; expected [1, {docs[i][0].size}, "
                             f"{n_images[i]}, ...] (the processor's {key})")
        masks[i] = mask
    first = next(iter(masks.values()))
    rest = [max(int(m.shape[d]) for m in masks.values()) for d in range(2, first.dim())]
    if any(m.dim() != first.dim() for m in masks.values()):
        raise ValueError(f"the documents' {key} have different numbers of dimensions; give every document the same "
                         "processor's mask")
    out = torch.zeros(len(rows), row_len, total, *rest, dtype=torch.int64)
    ranges = torch.zeros(len(rows), row_len, 2, dtype=torch.int64)
    image = 0
    for r, row in enumerate(rows):
        offset = 0
        for i in row:
            n = docs[i][0].size
            if i in masks:
                m = masks[i]
                out[(r, slice(offset, offset + n), slice(image, image + n_images[i]),
                     *(slice(0, int(d)) for d in m.shape[2:]))] = m.to(torch.int64)
                ranges[r, offset:offset + n] = torch.tensor([image, image + n_images[i]])
                image += n_images[i]
            offset += n
    return {key: out, IMAGES_KEY: ranges}
