"""Per-document processor outputs of a vision-language model packed into one batch (:func:`vision_batch`, called
by the packing collator): every item key concatenated in document order along its modality's item axis (other
dimensions zero-padded where the family's processor pads a batch), the counted items' placeholders, per-token keys
and each document's own rope positions. What a batch carries is defined in :mod:`.vision`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .cross import pack_cross_mask
from .vision import LAYOUT_KEY, TOKENS_KEY, VisionSpec, check_pixel_keys

__all__ = ["check_uncarried", "pack_vision", "vision_batch"]


def check_uncarried(spec: VisionSpec, examples: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a document holding a key the model's forward takes but packed rows do not carry (``spec.uncarried``):
    packing it without that key would train on other inputs than the document's.

    Raises:
        ValueError: naming the document, the keys and the fix.
    """
    for i, ex in enumerate(examples):
        held = [k for k in spec.uncarried if ex.get(k) is not None]
        if held:
            raise ValueError(f"example {i}: {spec.layout.family}'s {held} are not carried on packed rows yet (only "
                             "input_ids, labels, the pixels and their per-item keys); train such documents with one "
                             "document per row (no packing)")


def _cat_items(parts: list[torch.Tensor], axis: int, pad: bool, key: str) -> torch.Tensor:
    """The documents' entries of one key concatenated along the item ``axis``; with ``pad``, every other dimension
    zero-padded (at its end) to the largest of the documents."""
    if pad and len(parts) > 1:
        shape = [max(int(p.shape[d]) for p in parts) for d in range(parts[0].dim())]
        padded = []
        for p in parts:
            widths = []  # F.pad's order: last dimension first, (before, after) each
            for d in reversed(range(p.dim())):
                widths += [0, 0 if d == axis else shape[d] - int(p.shape[d])]
            padded.append(torch.nn.functional.pad(p, widths) if any(widths) else p)
        parts = padded
    try:
        return torch.cat(parts, dim=axis)
    except RuntimeError as e:
        raise ValueError(f"the documents' {key} do not stack along their item axis {axis} ({e}); give every "
                         "document this key from the same processor") from e


def _doc_positions(spec: VisionSpec, ex: Mapping[str, Any], ids: np.ndarray, types: np.ndarray) -> np.ndarray:
    """``[3, n]`` rotary positions of one document alone, from the model's own rope index."""
    doc = {"input_ids": torch.from_numpy(ids).unsqueeze(0), "mm_token_type_ids": torch.from_numpy(types).unsqueeze(0)}
    for m in spec.layout.modalities:
        for key in m.item_keys:
            if ex.get(key) is not None:
                doc[key] = torch.as_tensor(ex[key])
    with torch.no_grad():
        pos = spec.rope_index(**doc)  # [3, 1, n]
    return pos.reshape(3, -1).to(torch.int64).numpy()


def _token_values(given: Any, ids: np.ndarray, marks: Mapping[int, int]) -> np.ndarray:
    """``[n]`` one document's values of a per-token key (:attr:`VisionSpec.token_keys`): its own, else ``marks``'
    type on each marked token id, 0 elsewhere."""
    if given is not None:
        return np.asarray(torch.as_tensor(given).reshape(-1), dtype=np.int64)
    out = np.zeros(ids.size, dtype=np.int64)
    for token_id, kind in marks.items():
        out[ids == token_id] = kind
    return out


def pack_vision(spec: VisionSpec, examples: Sequence[Mapping[str, Any]], docs: list[tuple[np.ndarray, np.ndarray]],
                rows: list[list[int]], row_len: int) -> dict[str, Any]:
    """The vision part of a packed batch: pixels and items in row order, token types, rotary positions.

    Args:
        spec: the model's :class:`VisionSpec`.
        examples: the collator's examples, one document each (``docs[i]`` comes from ``examples[i]``).
        docs: ``(input_ids, labels)`` per document; rows: document indices per packed row; row_len: ``L``.

    Returns:
        ``{pixel_key: cat, item_key: cat, token_type_key: [B, L], each token key: [B, L], "rope": [3, B, L] or
        None, "hsap_vision", "hsap_vision_tokens" (counted items only)}``.

    Shapes:
        ``B = len(rows)``; padding tokens get type 0 and rotary positions continuing from 0 like text.
    """
    order = [i for row in rows for i in row]
    check_pixel_keys(spec.layout, [key for ex in examples for key in ex if ex.get(key) is not None])
    check_uncarried(spec, examples)
    out: dict[str, Any] = {LAYOUT_KEY: spec.layout}
    counted: dict[str, torch.Tensor] = {}
    for m in spec.layout.modalities:
        for key in (m.pixel_key, *m.item_keys):
            parts = [torch.as_tensor(examples[i][key]) for i in order if examples[i].get(key) is not None]
            if parts:
                out[key] = _cat_items(parts, m.axis(key), key in m.padded, key)
        if spec.counts(m.name):
            counts = [c for i in order if examples[i].get(m.pixel_key) is not None
                      for c in spec.item_tokens(m.name, examples[i])]
            if counts:
                counted[m.name] = torch.tensor(counts, dtype=torch.int64)
    if counted:
        out[TOKENS_KEY] = counted
    if spec.layout.cross_key is not None:  # Mllama, Idefics: which of its own images each token attends to
        out.update(pack_cross_mask(spec.layout.cross_key, spec.layout.modalities[0].pixel_key, examples, docs, rows,
                                   row_len))
    n_rows = len(rows)
    types = np.zeros((n_rows, row_len), dtype=np.int64)
    rope = np.zeros((3, n_rows, row_len), dtype=np.int64) if spec.rope_index is not None else None
    marked = {key: np.zeros((n_rows, row_len), dtype=np.int64) for key in spec.token_keys}
    for r, row in enumerate(rows):
        offset = 0
        for i in row:
            ids = docs[i][0]
            for key, value in marked.items():
                value[r, offset:offset + ids.size] = _token_values(examples[i].get(key), ids, spec.token_keys[key])
            given = examples[i].get(spec.token_type_key) if spec.token_type_key else None
            t = np.asarray(torch.as_tensor(given).reshape(-1)) if given is not None else np.zeros(ids.size, np.int64)
            if given is None and spec.layout.prefix_blocks:  # no types: the model runs the document causally
                t = np.ones(ids.size, np.int64)
            elif given is None:
                for m in spec.layout.modalities:
                    t[ids == m.token_id] = m.type_id
            types[r, offset:offset + ids.size] = t
            if rope is not None:
                rope[:, r, offset:offset + ids.size] = _doc_positions(spec, examples[i], ids, t.astype(np.int64))
            offset += ids.size
        if rope is not None and offset < row_len:  # the padding document: text positions from 0
            rope[:, r, offset:] = np.arange(row_len - offset)
        if spec.layout.prefix_blocks:  # padding is causal (type 1), never a bidirectional prefix
            types[r, offset:] = 1
    if spec.token_type_key:
        out[spec.token_type_key] = torch.from_numpy(types)
    out.update({key: torch.from_numpy(value) for key, value in marked.items()})
    out["rope"] = None if rope is None else torch.from_numpy(rope)
    return out


def vision_batch(spec: VisionSpec, examples: Sequence[Mapping[str, Any]], docs: list[tuple[np.ndarray, np.ndarray]],
                 rows: list[list[int]], row_len: int, *, input_ids: np.ndarray, labels: np.ndarray,
                 position_ids: np.ndarray, cu: np.ndarray) -> dict[str, Any]:
    """The packed batch of vision examples (``PackingCollator``'s "Vision examples"): the text part the collator
    built plus :func:`pack_vision`'s.

    Args:
        spec: the model's spec; examples, docs, rows, row_len: as :func:`pack_vision`; input_ids, labels,
            position_ids: ``[B, L]`` of the text part; cu: ``[n + 1]`` document boundaries.

    Returns:
        The batch (``position_ids [4, B, L]`` for multimodal-rotary families, else ``[B, L]``).
    """
    vision = pack_vision(spec, examples, docs, rows, row_len)
    pos = torch.from_numpy(position_ids)  # [B, L]
    rope = vision.pop("rope")
    if rope is not None:
        pos = torch.cat([pos.unsqueeze(0), rope])  # [1, B, L] + [3, B, L] -> [4, B, L]
    max_len = int(np.diff(cu).max())
    return {"input_ids": torch.from_numpy(input_ids), "labels": torch.from_numpy(labels), "position_ids": pos,
            "cu_seq_lens_q": torch.from_numpy(cu), "cu_seq_lens_k": torch.from_numpy(cu.copy()),
            "max_length_q": max_len, "max_length_k": max_len, **vision}
