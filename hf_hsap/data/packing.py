"""Packing collator: turns tokenized examples into fixed-length packed rows with varlen metadata.

A *packed row* holds several whole documents back to back. Attention must stay inside each document, so the
collator returns, besides the tokens, the per-document ``position_ids`` (restarting at 0 at every document start)
and the cumulative document lengths over the flattened batch (``cu_seq_lens_q`` / ``cu_seq_lens_k``), which is
exactly what the packed ("padding-free") path of Transformers' flash attention consumes. SDPA/eager attention in
Transformers derives the same block-diagonal mask from ``position_ids`` when no ``attention_mask`` is given and no
KV cache is used (call the model with ``use_cache=False``, as TRL's ``SFTTrainer`` does), so the collator never
returns an ``attention_mask``.

Label convention (the same one Transformers models and TRL use): ``labels`` is **unshifted**, aligned with
``input_ids``; ``labels[t]`` is the target of the prediction made at position ``t - 1``. hf_hsap computes the
next-token targets itself (see :func:`shift_labels_packed`), which is needed under sequence parallelism because a
rank cannot shift across its shard boundary. ``labels`` is ``-100`` (``label_pad``) on the first token of every
document, so the last token of one document never learns to predict the start of the next one, and on padding.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..log import get_logger, log_once
from .positions import cu_seqlens_from_position_ids
from .vision import PIXEL_KEYS
from .vision_pack import vision_batch
from .vision_checks import check_vision_example

__all__ = [
    "IGNORE_INDEX",
    "PackingCollator",
    "best_fit_decreasing",
    "shift_labels_global",
    "shift_labels_packed",
]

IGNORE_INDEX = -100  # the label of a token without loss (PyTorch's and Transformers' convention)
_MASK_KEYS = ("completion_mask", "assistant_masks")

logger = get_logger(__name__)


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bin-pack items with the best-fit-decreasing heuristic.

    Items are visited longest first (ties by index); each goes to the open bin with the *least* free space that
    still fits it, or to a new bin. Deterministic.

    Args:
        lengths: Item sizes, each in ``[1, capacity]``.
        capacity: Bin size.

    Returns:
        One list of item indices per bin, bins in creation order, indices ascending inside a bin.
    """
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free space, bin index), sorted; full bins are dropped
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        size = int(lengths[i])
        if not 0 < size <= capacity:
            raise ValueError(f"item {i} has size {size}, expected 1..{capacity}")
        k = bisect_left(free, (size, -1))
        if k == len(free):
            bins.append([i])
            room, b = capacity - size, len(bins) - 1
        else:
            room, b = free.pop(k)
            bins[b].append(i)
            room -= size
        if room > 0:
            insort(free, (room, b))
    return [sorted(b) for b in bins]


def shift_labels_global(labels: torch.Tensor, cu_seqlens: torch.Tensor,
                        ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Next-token targets that never cross a document end, on the flattened global batch (the one label
    shifter of hf_hsap; :func:`shift_labels_packed` and the sharding hook use it).

    Args:
        labels: ``[B, L]`` unshifted labels (``ignore_index`` = no target).
        cu_seqlens: ``[n + 1]`` document boundaries over ``B * L`` (every row start included).
        ignore_index: value for positions without a target.

    Returns:
        ``[B * L]``: ``out[i] = labels[i + 1]`` when token ``i + 1`` is in the same document, else ``ignore_index``.
    """
    flat = labels.reshape(-1)  # [B, L] -> [B*L]
    out = torch.full_like(flat, ignore_index)
    out[:-1] = flat[1:]
    ends = torch.as_tensor(cu_seqlens)[1:].to(flat.device, torch.int64) - 1  # last token of every document
    out[ends] = ignore_index
    return out


def shift_labels_packed(
    labels: torch.Tensor, position_ids: torch.Tensor, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """Next-token targets for packed rows, never crossing a document boundary.

    ``shift[..., i] = labels[..., i + 1]`` when token ``i + 1`` belongs to the same document as token ``i``
    (:func:`hf_hsap.data.positions.document_starts`: the position continues), else ``ignore_index``; the last
    position of each row is ``ignore_index``.

    Args:
        labels: Unshifted labels, aligned with ``input_ids``.
        position_ids: Positions restarting at 0 at every document start, same shape as ``labels``.
        ignore_index: Value for positions without a target.

    Returns:
        Tensor of the same shape, dtype and device as ``labels``.

    Shapes:
        labels, position_ids, result: ``[B, L]`` (any leading dims work; the sequence is the last dim).
    """
    if labels.shape != position_ids.shape:
        raise ValueError(
            f"labels {tuple(labels.shape)} and position_ids {tuple(position_ids.shape)} must have the same shape; "
            "pass the position_ids returned by the collator for the same batch"
        )
    if labels.numel() == 0:
        return labels.clone()
    rows = position_ids.reshape(-1, labels.shape[-1])  # [..., L] -> [B, L]
    cu = cu_seqlens_from_position_ids(rows)
    return shift_labels_global(labels, cu, ignore_index).reshape(labels.shape)


def _as_int_array(value: Any, what: str) -> np.ndarray:
    """Convert a list / tuple / numpy array / tensor of ints into a 1-D int64 numpy array."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.ndim == 2 and arr.shape[0] == 1:  # a tokenizer output with a batch dimension of 1
        arr = arr[0]
    if arr.ndim != 1:
        raise ValueError(
            f"{what} must be a 1-D sequence of token ids, got shape {arr.shape}; pass one example per dict"
        )
    if arr.size and not np.issubdtype(arr.dtype, np.integer) and not np.issubdtype(arr.dtype, np.bool_):
        raise ValueError(f"{what} must contain integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=True)


class PackingCollator:
    """Pack tokenized examples into rows of fixed length with best-fit-decreasing bin packing.

    Each input example is one document (or several, if it carries TRL's ``seq_lengths`` from a pre-packed
    dataset). Documents longer than ``max_length`` are split into pieces of at most ``max_length`` tokens, each
    piece its own document (``overflow="split"``), or cut to their first ``max_length`` tokens
    (``overflow="truncate"``). Documents are then bin-packed into rows of ``L`` tokens, where ``L`` is
    ``max_length`` rounded up to ``pad_to_multiple_of`` (the rounding slack holds tokens rather than padding);
    a document never spans two rows. Each row that is not full is filled up to ``L`` with ONE padding document,
    which keeps ``cu_seq_lens`` valid and keeps real documents from attending to padding; a row that is exactly
    full gets no padding document.

    Args:
        max_length: Most tokens per document piece, and the row length before rounding. Must be >= 1.
        pad_to_multiple_of: Row length ``L`` is ``max_length`` rounded up to a multiple of this (use the
            sequence-parallel group size, or a multiple of it, so rows split evenly across ranks). Must be >= 1;
            ``None`` means 1.
        overflow: ``"split"`` or ``"truncate"``: what to do with documents longer than ``max_length``.
        completion_only_loss: If True, tokens where the example's ``completion_mask`` / ``assistant_masks`` is 0
            (the prompt) get ``label_pad``. Examples without either mask are left as they are (TRL has usually
            folded its masks into ``labels`` already). If False, the masks are ignored.
        pad_token_id: Token id used for padding.
        return_tensors: ``"pt"`` (torch tensors) or ``"np"`` (numpy arrays).
        label_pad: Label value for tokens that are not trained on (padding, document starts, prompts).
        vision: for a vision-language model, its :class:`~hf_hsap.data.vision.VisionSpec`
            (``hf_hsap.vision_spec(model)``); the examples are then its processor's outputs, one
            document each, never split (see "Vision examples").

    Input examples (mappings; other keys, e.g. ``attention_mask``, ``text`` or ``token_type_ids``, are ignored):
        ``input_ids``: list[int], 1-D numpy array or 1-D tensor; must not be empty.
        ``labels`` (optional): same length as ``input_ids``; defaults to a copy of ``input_ids``.
        ``completion_mask`` / ``assistant_masks`` (optional): same length, 1 on completion tokens, 0 on prompt.
        ``seq_lengths`` (optional): TRL's lengths of the documents already packed into this example.

    Vision examples (with ``vision``): also the processor's pixels and per-item keys (``pixel_values``,
    ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw``, ...) and optionally ``mm_token_type_ids`` /
    ``token_type_ids``; a document longer than ``max_length`` is refused (its image would be cut), and so is one whose
    pixels, grids, per-item keys, token types and placeholders disagree (the message names the example). The batch then
    also holds the pixels and items concatenated in the order of the documents in the rows, the token types
    ``[B, L]``, the ``hsap_vision`` layout that :func:`hf_hsap.shard_batch` reads and, for multimodal-rotary
    families (Qwen-VL), ``position_ids [4, B, L]``: Transformers' packed convention, row 0 the text positions
    (restarting at every document) and rows 1-3 the model's own rope index of each document alone.

    Returns (from ``__call__``), with ``B`` the number of packed rows:
        ``input_ids``: ``[B, L]`` int64 token ids, ``pad_token_id`` on padding.
        ``labels``: ``[B, L]`` int64, UNSHIFTED (aligned with ``input_ids``; the model or
            :func:`shift_labels_packed` shifts them). ``label_pad`` on each document's first token, on padding and,
            with ``completion_only_loss``, on prompt tokens; otherwise the given label or the token id.
        ``position_ids``: ``[B, L]`` int64, ``0, 1, 2, ...`` restarting at every document start (padding too).
        ``cu_seq_lens_q``, ``cu_seq_lens_k``: ``[D + 1]`` int32, cumulative lengths of the ``D`` documents
            (padding documents included) over the flattened ``B * L`` tokens: starts at 0, ends at ``B * L``.
        ``max_length_q``, ``max_length_k``: python int, length of the longest document (padding included), as
            the flash-attention varlen kernels require.

    Shapes:
        ``B`` = rows chosen by the packer (not the number of examples), ``L`` = :attr:`row_length`.

    Example:
        >>> collate = PackingCollator(max_length=8)
        >>> batch = collate([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
        >>> batch["position_ids"].tolist()
        [[0, 1, 2, 0, 1, 0, 1, 2]]
        >>> batch["cu_seq_lens_q"].tolist()
        [0, 3, 5, 8]
    """

    def __init__(
        self,
        max_length: int,
        pad_to_multiple_of: int | None = 1,
        *,
        overflow: str = "split",
        completion_only_loss: bool = False,
        pad_token_id: int = 0,
        return_tensors: str = "pt",
        label_pad: int = IGNORE_INDEX,
        vision: Any = None,
    ) -> None:
        if not isinstance(max_length, (int, np.integer)) or isinstance(max_length, bool) or max_length < 1:
            raise ValueError(f"max_length must be an int >= 1 (tokens per packed row), got {max_length!r}")
        if pad_to_multiple_of is None:  # Transformers' convention for "no rounding"
            pad_to_multiple_of = 1
        if not isinstance(pad_to_multiple_of, (int, np.integer)) or pad_to_multiple_of < 1:
            raise ValueError(
                f"pad_to_multiple_of must be an int >= 1 (use 1 for no rounding, or the sequence-parallel size), "
                f"got {pad_to_multiple_of!r}"
            )
        if overflow not in ("split", "truncate"):
            raise ValueError(f"overflow must be 'split' or 'truncate', got {overflow!r}")
        if return_tensors not in ("pt", "np"):
            raise ValueError(f"return_tensors must be 'pt' or 'np', got {return_tensors!r}")
        self.max_length = int(max_length)
        self.pad_to_multiple_of = int(pad_to_multiple_of)
        self.overflow = overflow
        self.completion_only_loss = bool(completion_only_loss)
        self.pad_token_id = int(pad_token_id)
        self.return_tensors = return_tensors
        self.label_pad = int(label_pad)
        self.vision = vision
        if vision is not None and self.pad_token_id in {m.token_id for m in vision.layout.modalities}:
            raise ValueError(f"pad_token_id={self.pad_token_id} is a placeholder of the model's images / videos: padding "
                             "would count as image tokens; pass the tokenizer's pad_token_id")
        if vision is not None and return_tensors != "pt":
            raise ValueError("PackingCollator(vision=...) returns torch tensors only (pixels are tensors): "
                             "use return_tensors='pt'")

    @property
    def row_length(self) -> int:
        """``L``: ``max_length`` rounded up to a multiple of ``pad_to_multiple_of``."""
        m = self.pad_to_multiple_of
        return -(-self.max_length // m) * m

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_length={self.max_length}, pad_to_multiple_of={self.pad_to_multiple_of}, "
            f"overflow={self.overflow!r}, completion_only_loss={self.completion_only_loss}, "
            f"pad_token_id={self.pad_token_id}, return_tensors={self.return_tensors!r}, label_pad={self.label_pad})"
        )

    def documents(self, examples: Sequence[Mapping[str, Any]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Validate the examples and cut them into documents of at most ``max_length`` tokens.

        Args:
            examples: Tokenized examples (see the class docstring).

        Returns:
            ``(input_ids, labels)`` int64 arrays per document, in input order. Labels are not yet masked at
            document starts.
        """
        if isinstance(examples, Mapping) or not isinstance(examples, Sequence):
            raise ValueError(
                f"PackingCollator expects a list of examples (dicts), got {type(examples).__name__}; "
                "pass it as a DataLoader's collate_fn or a Trainer's data_collator"
            )
        if len(examples) == 0:
            raise ValueError("PackingCollator got an empty batch; use a DataLoader batch_size >= 1")
        examples = self._as_layout(examples)
        docs: list[tuple[np.ndarray, np.ndarray]] = []
        too_long = cut_tokens = unmasked = 0  # for the log: over-long documents, tokens truncated, no masks
        seen: dict[str, tuple[int, Any]] = {}  # what earlier vision examples fixed for the batch
        for n, ex in enumerate(examples):
            if not isinstance(ex, Mapping) or "input_ids" not in ex:
                raise ValueError(f"example {n} must be a dict with an 'input_ids' key; tokenize the dataset first")
            ids = _as_int_array(ex["input_ids"], f"example {n} input_ids")
            if ids.size == 0:
                raise ValueError(
                    f"example {n} has empty input_ids; drop empty examples first, e.g. "
                    "dataset.filter(lambda e: len(e['input_ids']) > 0)"
                )
            labels = ids.copy() if ex.get("labels") is None else _as_int_array(ex["labels"], f"example {n} labels")
            if labels.shape != ids.shape:
                raise ValueError(
                    f"example {n} has {labels.size} labels for {ids.size} input_ids; labels must be aligned "
                    "token-for-token with input_ids (unshifted, -100 where no loss)"
                )
            if self.completion_only_loss:
                if ex.get("labels") is None and all(ex.get(key) is None for key in _MASK_KEYS):
                    unmasked += 1
                for key in _MASK_KEYS:
                    if ex.get(key) is None:
                        continue
                    mask = _as_int_array(ex[key], f"example {n} {key}")
                    if mask.shape != ids.shape:
                        raise ValueError(
                            f"example {n} has a {key} of length {mask.size} for {ids.size} input_ids; "
                            "the mask must have one entry per token"
                        )
                    labels[mask == 0] = self.label_pad
            bounds = [ids.size]
            if self.vision is not None:
                check_vision_example(ex, n, ids, spec=self.vision, max_length=self.max_length, seen=seen)
            elif any(ex.get(key) is not None for key in PIXEL_KEYS):
                raise ValueError(
                    f"example {n} has pixels but the collator has no vision spec: build it as "
                    "PackingCollator(max_length, vision=hf_hsap.vision_spec(model))"
                )
            if ex.get("seq_lengths") is not None:
                lens = _as_int_array(ex["seq_lengths"], f"example {n} seq_lengths")
                if lens.size == 0 or (lens <= 0).any() or int(lens.sum()) != ids.size:
                    raise ValueError(
                        f"example {n} seq_lengths {lens.tolist()} must be positive and sum to len(input_ids)="
                        f"{ids.size}; drop the column if the example is a single document"
                    )
                bounds = np.cumsum(lens).tolist()
            start = 0
            for end in bounds:
                d_ids, d_lab = ids[start:end], labels[start:end]
                start = end
                if d_ids.size <= self.max_length:
                    docs.append((d_ids, d_lab))
                    continue
                too_long += 1
                if self.overflow == "truncate":
                    cut_tokens += d_ids.size - self.max_length
                    docs.append((d_ids[: self.max_length], d_lab[: self.max_length]))
                else:
                    for s in range(0, d_ids.size, self.max_length):
                        docs.append((d_ids[s : s + self.max_length], d_lab[s : s + self.max_length]))
        if too_long or unmasked:
            self._log_documents(len(examples), too_long, cut_tokens, unmasked)
        return docs

    def _as_layout(self, examples: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
        """The examples rewritten into the vision layout's items (``VisionSpec.document``, e.g. GLM-4V's video
        frames as images); the examples themselves where the spec has no such rewrite."""
        if self.vision is None or getattr(self.vision, "document", None) is None or isinstance(examples, Mapping):
            return examples
        return [self.vision.document(ex, n) if isinstance(ex, Mapping) else ex for n, ex in enumerate(examples)]

    def _log_documents(self, examples: int, too_long: int, cut_tokens: int, unmasked: int) -> None:
        """Say once per setting what :meth:`documents` cut (INFO) and which examples had no prompt mask (WARNING)."""
        if too_long:
            what = (f"truncated to their first {self.max_length} tokens ({cut_tokens} tokens dropped in the first "
                    "such batch)" if self.overflow == "truncate"
                    else f"split into runs of at most {self.max_length} tokens, each its own document")
            log_once(logger, logging.INFO, ("overflow", self.overflow, self.max_length),
                     "PackingCollator: documents longer than max_length=%d are %s (%d such documents among the %d "
                     "examples of the first such batch)", self.max_length, what, too_long, examples)
        if unmasked:
            log_once(logger, logging.WARNING, ("no completion mask", self.label_pad),
                     "PackingCollator(completion_only_loss=True): %d of %d examples have neither completion_mask / "
                     "assistant_masks nor labels, so their prompt tokens are trained on too; tokenize with "
                     "hf_hsap.data.tokenize_corpus (prompt/completion or messages) or pass labels", unmasked, examples)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Pack ``examples`` into a batch; see the class docstring for the returned fields and shapes."""
        examples = self._as_layout(examples)  # idempotent: documents() applies it too
        docs = self.documents(examples)
        row_len = self.row_length
        rows = best_fit_decreasing([d[0].size for d in docs], row_len)
        n_rows = len(rows)

        input_ids = np.full((n_rows, row_len), self.pad_token_id, dtype=np.int64)
        labels = np.full((n_rows, row_len), self.label_pad, dtype=np.int64)
        seg_lens: list[int] = []
        for r, row in enumerate(rows):
            offset = 0
            for i in row:
                d_ids, d_lab = docs[i]
                n = d_ids.size
                input_ids[r, offset : offset + n] = d_ids
                labels[r, offset + 1 : offset + n] = d_lab[1:]  # the first token keeps label_pad
                seg_lens.append(n)
                offset += n
            if offset < row_len:
                seg_lens.append(row_len - offset)  # one padding document
        seg = np.asarray(seg_lens, dtype=np.int64)
        cu = np.zeros(seg.size + 1, dtype=np.int32)
        np.cumsum(seg, out=cu[1:])
        # position = flat index - start of its segment
        position_ids = np.arange(n_rows * row_len, dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), seg)
        position_ids = position_ids.reshape(n_rows, row_len)
        max_len = int(seg.max())

        if self.vision is not None:
            return vision_batch(self.vision, examples, docs, rows, self.row_length, input_ids=input_ids, labels=labels,
                                position_ids=position_ids, cu=cu)
        if self.return_tensors == "pt":
            input_ids_t, labels_t, pos_t = map(torch.from_numpy, (input_ids, labels, position_ids))
            cu_q, cu_k = torch.from_numpy(cu), torch.from_numpy(cu.copy())
            return {
                "input_ids": input_ids_t,
                "labels": labels_t,
                "position_ids": pos_t,
                "cu_seq_lens_q": cu_q,
                "cu_seq_lens_k": cu_k,
                "max_length_q": max_len,
                "max_length_k": max_len,
            }
        return {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": position_ids,
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu.copy(),
            "max_length_q": max_len,
            "max_length_k": max_len,
        }
