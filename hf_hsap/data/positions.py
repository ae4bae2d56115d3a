"""Document boundaries read from packed position ids (the data side of a packed batch): where documents start,
their ``cu_seqlens``, and the check that position ids and a :class:`~hf_hsap.plan.layout.Layout` agree."""
from __future__ import annotations

import numpy as np
import torch

from ..plan.layout import Layout

__all__ = ["check_position_ids", "cu_seqlens_from_position_ids", "document_starts"]


def document_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` bool, True where a document starts in packed positions: row starts and ``p[t] != p[t - 1] + 1``,
    Transformers' rule (``find_packed_sequence_indices``), so a packed row means the same to "hsap" as to eager/SDPA."""
    starts = torch.ones(position_ids.shape, dtype=torch.bool, device=position_ids.device)  # [B, L]
    starts[:, 1:] = position_ids[:, 1:] - position_ids[:, :-1] != 1  # [B, L - 1]
    return starts


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """``[n_docs + 1]`` int64 CPU ``cu_seqlens`` of ``[B, T_row]`` or ``[T]`` packed positions (document_starts)."""
    pos = position_ids.detach().reshape(position_ids.shape[0], -1) if position_ids.dim() == 2 \
        else position_ids.detach().reshape(1, -1)  # [B, T_row]
    flat = document_starts(pos).reshape(-1).nonzero().squeeze(1).to(torch.int64)  # [n_docs]
    total = torch.tensor([pos.numel()], dtype=torch.int64, device=flat.device)
    return torch.cat([flat, total]).cpu()


def check_position_ids(position_ids: torch.Tensor, layout: Layout) -> None:
    """Raise ``ValueError`` unless ``position_ids`` (``[B, T_row]`` or ``[T]``) count 0, 1, ... in every document."""
    pos = position_ids.detach().reshape(-1).to("cpu", torch.int64).numpy()
    if pos.shape[0] != layout.total_tokens:
        raise ValueError(f"position_ids cover {pos.shape[0]} tokens but cu_seqlens covers {layout.total_tokens}")
    doc_start = np.repeat(layout.cu_seqlens[:-1], layout.doc_lengths)  # [T]
    expected = np.arange(layout.total_tokens, dtype=np.int64) - doc_start
    if not np.array_equal(pos, expected):
        bad = int(np.argmax(pos != expected))
        raise ValueError(f"position_ids disagree with cu_seqlens at token {bad} (got {int(pos[bad])}, expected "
                         f"{int(expected[bad])}); position ids must restart at 0 at every document start and count up "
                         "by one (build both from the same PackingCollator output)")
