"""Documents of one single-device ``"hsap"`` attention call: which queries see which keys.

The ``"hsap"`` attention function (:mod:`.transformers`) turns its inputs into a :class:`LocalLayout`, the
segments of one varlen call over the flattened ``B * L`` tokens. Where the documents come from:

1. ``cu_seq_lens_q`` / ``cu_seq_lens_k`` given to the attention function (:func:`layout_from_cu`);
2. ``L_q == L_k`` (training, prefill, :func:`layout_same_length`): the mask function's document ids when it
   gave them (packing and chunk boundaries exactly as ``masking_utils`` defines them, also for models that
   do not forward ``position_ids`` to attention), else ``position_ids`` (a new document wherever the
   position does not continue), and a 2D padding mask (valid tokens of a row contiguous);
3. ``L_q != L_k`` (generation with a KV cache, :func:`layout_cached`): one bottom-right causal segment per
   row over its filled, unpadded keys (left padding only).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data.positions import document_starts

__all__ = ["LocalLayout", "document_ids", "document_starts", "layout_cached", "layout_from_cu",
           "layout_same_length"]


@dataclass(frozen=True)
class LocalLayout:
    """Documents of one local attention call over flattened tokens.

    ``q_index`` / ``k_index`` select the kept queries / keys of the flattened ``B * L`` tensors (``None``:
    all, in order); ``cu_q`` / ``cu_k`` are the segment boundaries over the kept tokens.
    """

    cu_q: tuple[int, ...]
    cu_k: tuple[int, ...]
    q_index: torch.Tensor | None = None
    k_index: torch.Tensor | None = None

    @property
    def max_k(self) -> int:
        return max((b - a for a, b in zip(self.cu_k, self.cu_k[1:])), default=0)


def _cu_from_starts(starts: torch.Tensor) -> tuple[int, ...]:
    """Segment boundaries from a flat bool ``[N]`` tensor marking segment starts (``starts[0]`` True)."""
    idx = torch.nonzero(starts, as_tuple=False).flatten().tolist()
    return tuple(idx) + (int(starts.numel()),)


_HOLES_FIX = "pack documents with position_ids / cu_seq_lens_q instead of masking, or pad on one side only"
_LEFT_PAD_FIX = "generate with left padding: set tokenizer.padding_side = 'left'"


def _row_ranges(valid: torch.Tensor, fix: str = _HOLES_FIX) -> tuple[torch.Tensor, torch.Tensor]:
    """First valid column and number of valid columns per row; raise if a row's valid part has holes.

    Args:
        valid: ``[B, M]`` bool padding mask.
        fix: the remedy named in the error message.

    Returns:
        ``(first, count)``, each ``[B]`` int64 (``first`` is meaningless where ``count == 0``).
    """
    count = valid.sum(dim=1)
    first = valid.int().argmax(dim=1)
    last = valid.shape[1] - 1 - valid.flip(1).int().argmax(dim=1)
    holes = (count > 0) & (last - first + 1 != count)
    if bool(holes.any()):
        raise ValueError(
            "attn_implementation='hsap' needs each row's attention_mask to be one contiguous block of ones "
            f"(left or right padding), got padding between tokens; {fix}"
        )
    return first, count


def _positions(position_ids: torch.Tensor | None, batch: int, length: int) -> torch.Tensor | None:
    """``position_ids`` as ``[B, L]`` (expanding a shared ``[1, L]``), or ``None``."""
    if position_ids is None:
        return None
    if position_ids.dim() == 3 and position_ids.shape[0] == 4:  # [text, t, h, w] rows: the text row
        position_ids = position_ids[0]
    elif position_ids.dim() == 3 and position_ids.shape[0] == 3:
        # multimodal rotary rows [t, h, w] that a model hands its layers instead of the text positions (GLM-4.5V's
        # MoE): their steps inside an image are not document starts; the documents come from the mask function,
        # which Transformers builds from the text positions
        return None
    if position_ids.dim() != 2 or position_ids.shape[-1] != length:
        raise ValueError(
            f"attn_implementation='hsap' expects position_ids of shape [batch, {length}], got "
            f"{tuple(position_ids.shape)}; pass cu_seq_lens_q / cu_seq_lens_k to give the documents explicitly"
        )
    if position_ids.shape[0] != batch:
        position_ids = position_ids.expand(batch, -1)  # [1, L] -> [B, L]
    return position_ids


def layout_same_length(
    batch: int, length: int, position_ids: torch.Tensor | None, mask: torch.Tensor | None, device: torch.device
) -> "LocalLayout":
    """Documents when queries and keys are the same tokens (training, prefill).

    Args:
        batch, length: ``B`` and ``L``.
        position_ids: ``[B, L]`` (or ``[1, L]``) positions (multimodal rotary ``[4, B, L]``: the text row; ``[3, B,
            L]``: not used), or ``None``; used when ``mask`` is not the mask
            function's document ids.
        mask: ``None``, a ``[B, L]`` bool padding mask, or the ``[B, L]`` integer document ids of
            :func:`document_ids` (``0`` = padding), which add their boundaries to those of ``position_ids``.
        device: where the index tensors go.

    Returns:
        The :class:`LocalLayout` (padded tokens left out when there is padding).

    Raises:
        ValueError: ``position_ids`` of the wrong shape, or a row whose valid tokens are not contiguous.
    """
    starts = torch.zeros(batch, length, dtype=torch.bool, device=device)  # [B, L]
    pos = _positions(position_ids, batch, length)
    if pos is not None:  # restarts split documents even where masking_utils did not look (a padding mask)
        starts = document_starts(pos).to(device)
    if mask is not None and not mask.dtype == torch.bool:  # document ids from the mask function
        ids = mask.to(device)
        starts[:, 1:] |= ids[:, 1:] != ids[:, :-1]  # documents and chunks of the composed mask
        mask = ids > 0
        if bool(mask.all()):
            mask = None
    starts[:, 0] = True
    if mask is None:
        cu = _cu_from_starts(starts.flatten())
        return LocalLayout(cu, cu)
    valid = mask.to(device=device, dtype=torch.bool)
    _row_ranges(valid)
    starts[:, 1:] |= ~valid[:, :-1]  # a valid token after padding starts a document
    keep = torch.nonzero(valid.flatten(), as_tuple=False).flatten()  # [N_valid] into B * L
    cu = _cu_from_starts(starts.flatten()[keep]) if keep.numel() else (0,)
    return LocalLayout(cu, cu, keep, keep)


def layout_cached(batch: int, lq: int, lk: int, mask: torch.Tensor | None, device: torch.device) -> "LocalLayout":
    """One bottom-right causal segment per row (decoding with a KV cache).

    ``mask`` ``[B, m]``: the padding of the first ``m <= lk`` key slots; slots past ``m`` are not filled
    yet (a static cache), so the last query sees exactly the ``m`` filled keys.

    Args:
        batch, lq, lk: ``B``, ``L_q`` and ``L_k`` (``L_k`` cache slots, ``L_q`` new tokens).
        mask: ``None`` (all ``L_k`` slots filled, no padding) or ``[B, m]`` bool padding of the filled slots.
        device: where the index tensors go.

    Returns:
        The :class:`LocalLayout`: one segment per row, queries aligned to the row's last filled key.

    Raises:
        ValueError: a mask longer than the cache or shorter than the queries, or padding not on the left.
    """
    if mask is None:
        return LocalLayout(tuple(range(0, batch * lq + 1, lq)), tuple(range(0, batch * lk + 1, lk)))
    valid = mask.to(device=device, dtype=torch.bool)
    m = valid.shape[1]  # a static cache holds lk >= m slots; slots past m are not filled yet
    if m > lk or m < lq:
        raise ValueError(f"attention_mask covers {m} keys but the cache holds {lk} keys for {lq} queries")
    first, count = _row_ranges(valid, _LEFT_PAD_FIX)
    if bool(((count > 0) & (first + count != m)).any()):
        raise ValueError(
            "attn_implementation='hsap' needs the new tokens to follow the last valid key of each row; "
            + _LEFT_PAD_FIX
        )
    first = torch.where(count > 0, first, torch.full_like(first, m))  # [B]; empty rows keep nothing
    k_cols = torch.arange(lk, device=device)  # [Lk]
    k_keep = (k_cols[None, :] >= first[:, None]) & (k_cols[None, :] < m)  # [B, Lk]
    q_keep = (m - lq + torch.arange(lq, device=device))[None, :] >= first[:, None]  # [B, Lq]
    cu_q = (0,) + tuple(int(x) for x in q_keep.sum(1).cumsum(0).tolist())
    cu_k = (0,) + tuple(int(x) for x in k_keep.sum(1).cumsum(0).tolist())
    q_index = torch.nonzero(q_keep.flatten(), as_tuple=False).flatten()  # [N_q kept] into B * Lq
    k_index = torch.nonzero(k_keep.flatten(), as_tuple=False).flatten()  # [N_k kept] into B * Lk
    return LocalLayout(cu_q, cu_k, q_index, k_index)


def layout_from_cu(batch: int, lq: int, lk: int, cu_seq_lens_q: torch.Tensor, cu_seq_lens_k: torch.Tensor | None,
                   mask: torch.Tensor | None) -> "LocalLayout":
    """Documents given explicitly by ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (flash-attention's padding-free form).

    Args:
        batch, lq, lk: ``B``, ``L_q`` and ``L_k``.
        cu_seq_lens_q: ``[n + 1]`` query document boundaries over the flattened ``B * L_q`` tokens.
        cu_seq_lens_k: ``[n + 1]`` key boundaries over ``B * L_k``, or ``None`` (the same as the queries').
        mask: ``None`` or the mask function's ``[B, L]`` integer document ids (their chunk boundaries split the
            documents too); a padding mask is refused.

    Returns:
        The :class:`LocalLayout` (all tokens kept).

    Raises:
        ValueError: a padding mask, or boundaries that do not cover the flattened batch.
    """
    if mask is not None and (mask.dtype == torch.bool or bool((mask <= 0).any())):
        raise ValueError(
            "attn_implementation='hsap' got both cu_seq_lens_q and a padding attention_mask; put padding into "
            "its own document in cu_seq_lens_q and drop the attention_mask"
        )
    cu_q = tuple(int(x) for x in cu_seq_lens_q.tolist())
    cu_k = cu_q if cu_seq_lens_k is None else tuple(int(x) for x in cu_seq_lens_k.tolist())
    if cu_q[-1] != batch * lq or cu_k[-1] != batch * lk or cu_q[0] != 0 or len(cu_q) != len(cu_k):
        raise ValueError(
            f"cu_seq_lens_q/k must start at 0 and end at the flattened token counts {batch * lq} / {batch * lk}, "
            f"got {cu_q[:1]}..{cu_q[-1:]} / {cu_k[:1]}..{cu_k[-1:]}; build them over the whole batch "
            "(hf_hsap.data.PackingCollator does)"
        )
    if mask is not None and lq == lk and cu_q == cu_k:  # the mask function's ids: chunks split segments too
        starts = torch.zeros(batch * lq, dtype=torch.bool, device=mask.device)  # [B*L]
        starts[list(cu_q[:-1])] = True
        ids = mask.reshape(batch, lq)
        row = torch.zeros_like(ids, dtype=torch.bool)  # [B, L]
        row[:, 1:] = ids[:, 1:] != ids[:, :-1]
        cu_q = cu_k = _cu_from_starts(starts | row.flatten())
    return LocalLayout(cu_q, cu_k)


def document_ids(starts: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """Per-token document ids of rows (what the ``"hsap"`` mask function hands the attention function).

    Args:
        starts: ``[B, L]`` bool, True where a document starts (column 0 is a start).
        valid: ``[B, L]`` bool padding mask, or ``None`` (all valid).

    Returns:
        ``[B, L]`` int32: ids ``>= 1`` that change exactly at document starts and after padding, ``0`` on
        padding. So ``ids.bool()`` is the padding mask: Transformers may feed the mask function's output back
        to it as a 2D padding mask (``generate`` builds the masks, then the model builds them again).
    """
    starts = starts.clone()
    if valid is not None:
        starts[:, 1:] |= valid[:, 1:] & ~valid[:, :-1]  # a valid token after padding starts a document
    ids = starts.to(torch.int32).cumsum(1, dtype=torch.int32)  # [B, L], >= 1
    if valid is not None:
        ids = ids.masked_fill(~valid, 0)
    return ids
