"""Documents of the multimodal zoo's families without an image placeholder id, as their processors give them.

- Images placed by a per-token mask (Kosmos-2, Kosmos-2.5: ``image_embeds_position_mask``): ``text, start,
  [rows marked 1], end, text`` with the image's pixels (Kosmos-2: ``[1, C, S, S]``; Kosmos-2.5: ``flattened_patches
  [1, P, 2 + patch]``, each patch's row and column first, the last patches zero: padding). Kosmos-2.5 marks the
  start and end tokens -1 (its processor's segment), Kosmos-2 0. A family whose forward needs pixels has an image
  in every document.
- Videos queried by a Q-Former (InstructBLIP-Video): ``text, [video token x queries x frames], text`` with
  ``pixel_values [1, frames, C, S, S]`` and the Q-Former's instruction (``qformer_input_ids`` /
  ``qformer_attention_mask``, of different lengths); a video in every document (its forward requires one).
"""
from __future__ import annotations

from typing import Any

import torch

from hf_hsap.multimodal import vision_spec

__all__ = ["unplaced_documents"]

FRAMES = 8  # per video (one frame count per packed batch)


def unplaced_documents(config: Any, model: torch.nn.Module, shapes: list, *, seed: int = 0,
                       dtype: torch.dtype = torch.float64) -> list[dict[str, Any]] | None:
    """The documents of a marked-image or video-Q-Former family (module docstring), or ``None`` for another.

    Args:
        config: the tiny config; model: a model of it; shapes: per document ``(text before, grid or None, text
        after)`` (a grid: the document has an image / video); seed: tokens and pixels; dtype: pixels.
    """
    try:
        spec = vision_spec(model)
    except ValueError:
        return None
    mod = spec.layout.modalities[0]
    if mod.mark_key is None and not (mod.name == "video" and len(spec.layout.modalities) == 1):
        return None
    vocab = int(config.get_text_config().vocab_size)
    low = min(vocab, mod.token_id) if mod.token_id >= 0 else vocab
    g = torch.Generator().manual_seed(seed)
    docs = []
    for k, (before, grid, after) in enumerate(shapes):
        if grid is None and spec.layout.empty_items:
            grid = (1, 2, 2)  # every document has an item
        doc: dict[str, Any] = {}
        head = torch.randint(3, low, (before,), generator=g)
        tail = torch.randint(3, low, (after,), generator=g)
        if grid is None:
            ids, marks = torch.cat([head, tail]), None
        elif mod.mark_key is not None:
            doc[mod.pixel_key] = _image(config, mod.pixel_key, k, g, dtype)
            doc.update({key: torch.tensor([24 + k]) for key in mod.item_keys})  # Kosmos-2.5: the image's width, height
            n = spec.item_tokens("image", doc)[0]
            edge = -1 if hasattr(_text_module(model), "segment_emb") else 0  # Kosmos-2.5's start / end segment
            body = torch.randint(3, low, (n + 2,), generator=g)
            ids = torch.cat([head, body, tail])
            marks = torch.cat([torch.zeros(before, dtype=torch.int64), torch.tensor([edge] + [1] * n + [edge]),
                               torch.zeros(after, dtype=torch.int64)])
        else:
            doc.update(_video(config, g, dtype, instruction=2 + k))
            n = spec.item_tokens("video", doc)[0]
            ids, marks = torch.cat([head, torch.full((n,), mod.token_id), tail]), None
        doc["input_ids"] = ids
        if marks is not None:
            doc[mod.mark_key] = marks
        labels = ids.clone()
        labels[ids >= low] = -100
        if marks is not None:
            labels[marks != 0] = -100  # no loss on the image's rows and its start / end
        doc["labels"] = labels
        docs.append(doc)
    return docs


def _text_module(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module that embeds the text and the image rows (Kosmos' text transformer)."""
    return next((m for m in model.modules() if hasattr(m, "embed_positions") and hasattr(m, "embed_tokens")), None)


def _image(config: Any, key: str, k: int, g: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """One image's pixels: ``[1, C, S, S]``, or (``flattened_patches``) ``[1, P, 2 + patch]`` patches with their row
    and column, the last ``k % 3`` of them zero (padding)."""
    v = config.vision_config
    if key != "flattened_patches":
        size = int(v.image_size)
        return torch.randn(1, int(getattr(v, "num_channels", 3)), size, size, generator=g, dtype=dtype)
    side, pad = 3, k % 3
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    patches = torch.randn(side * side, int(v.patch_embed_hidden_size), generator=g, dtype=dtype)
    flat = torch.cat([rows.reshape(-1, 1).to(dtype) + 1, cols.reshape(-1, 1).to(dtype) + 1, patches], dim=1)
    if pad:
        flat[-pad:] = 0
    return flat.unsqueeze(0)


def _video(config: Any, g: torch.Generator, dtype: torch.dtype, *, instruction: int) -> dict[str, Any]:
    """One video (``pixel_values [1, FRAMES, C, S, S]``) with its Q-Former instruction of ``instruction`` tokens."""
    v = config.vision_config
    size, c = int(v.image_size), int(getattr(v, "num_channels", 3))
    words = int(config.qformer_config.vocab_size)
    return {"pixel_values": torch.randn(1, FRAMES, c, size, size, generator=g, dtype=dtype),
            "qformer_input_ids": torch.randint(3, words, (1, instruction), generator=g),
            "qformer_attention_mask": torch.ones(1, instruction, dtype=torch.int64)}
