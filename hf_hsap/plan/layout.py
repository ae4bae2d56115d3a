"""Layout: the document boundaries of a packed batch (``cu_seqlens`` over the flattened batch).

A batch of ``B`` rows of ``T_row`` tokens is treated as one row of ``T = B * T_row`` tokens whose
documents never span two rows. A layout is plain data: validated once, hashed for the plan cache and
for the cross-rank consistency check.
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass(frozen=True, eq=False)
class Layout:
    """Validated document boundaries.

    Attributes:
        cu_seqlens: ``[n_docs + 1]`` int64 numpy array, ``0 = cu[0] < cu[1] < ... < cu[-1] = T``.
        digest: 8-byte blake2b digest of ``cu_seqlens`` (equal layouts have equal digests).
    """

    cu_seqlens: np.ndarray
    digest: bytes

    @property
    def total_tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    @property
    def n_docs(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def doc_lengths(self) -> np.ndarray:
        """``[n_docs]`` tokens of each document."""
        return np.diff(self.cu_seqlens)

    @functools.cached_property
    def longest_doc(self) -> int:
        """Tokens of the longest document (a layout has at least one; computed once: every layer asks for its
        mask kind)."""
        return int(self.doc_lengths.max())

    @property
    def hash64(self) -> int:
        """The digest as a signed 64-bit int (what ranks exchange to compare layouts)."""
        return int.from_bytes(self.digest, "little", signed=True)

    def doc_of(self, positions: np.ndarray) -> np.ndarray:
        """Document index of every global position. Shapes: ``[N] -> [N]``."""
        return np.searchsorted(self.cu_seqlens, positions, side="right") - 1


def make_layout(cu_seqlens: torch.Tensor | np.ndarray | Sequence[int] | Layout,
                total_tokens: int | None = None) -> Layout:
    """Validate ``cu_seqlens`` and wrap it in a :class:`Layout` (a :class:`Layout` is returned as it is).

    Args:
        cu_seqlens: ``[n_docs + 1]`` cumulative document lengths over the flattened batch, or a layout.
        total_tokens: if given, the number of tokens the caller holds; ``cu_seqlens[-1]`` must equal it.

    Returns:
        The layout.

    Raises:
        ValueError: naming the fix, for a non-1D or empty input, a first entry other than 0, empty or
            negative documents (entries not strictly increasing), or a last entry other than T.
    """
    if isinstance(cu_seqlens, Layout) and total_tokens in (None, cu_seqlens.total_tokens):
        return cu_seqlens
    if isinstance(cu_seqlens, Layout):
        cu_seqlens = cu_seqlens.cu_seqlens
    if torch.is_tensor(cu_seqlens):
        if cu_seqlens.is_floating_point():
            raise ValueError("cu_seqlens must hold integers (token offsets), not floats")
        arr = cu_seqlens.detach().to("cpu", torch.int64).numpy()
    else:
        arr = np.asarray(cu_seqlens)
        if arr.dtype.kind not in "iu":
            raise ValueError("cu_seqlens must hold integers (token offsets)")
        arr = arr.astype(np.int64, copy=False)
    if arr.ndim != 1 or arr.shape[0] < 2:
        raise ValueError(
            "cu_seqlens must be a 1-D list of document boundaries [0, len_0, len_0+len_1, ..., T] with at "
            f"least one document; got shape {tuple(arr.shape)}. For a batch [B, T_row] flatten it first."
        )
    if arr[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0 (got {int(arr[0])}); prepend 0 to the cumulative lengths")
    steps = np.diff(arr)
    if (steps <= 0).any():
        bad = int(np.argmax(steps <= 0))
        raise ValueError(
            f"cu_seqlens must be strictly increasing (document {bad} has length {int(steps[bad])}); "
            "drop empty documents before packing"
        )
    if total_tokens is not None and int(arr[-1]) != int(total_tokens):
        raise ValueError(
            f"cu_seqlens ends at {int(arr[-1])} but the batch has {int(total_tokens)} tokens; "
            "cu_seqlens must end at the total number of tokens of the flattened batch"
        )
    arr = np.ascontiguousarray(arr)
    digest = hashlib.blake2b(arr.tobytes(), digest_size=8).digest()
    return Layout(cu_seqlens=arr, digest=digest)


def document_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """Where documents start in packed rows: every row start, and wherever the position does not continue.

    The one document-boundary rule of hf_hsap (the sharding hook, the local "hsap" attention, the labels
    and :func:`cu_seqlens_from_position_ids` all use it). It is the rule of Transformers'
    ``masking_utils.find_packed_sequence_indices`` (``p[t] != p[t - 1] + 1``), so a packed row means the
    same to "hsap" as to eager/SDPA; it includes every restart at 0.

    Args:
        position_ids: ``[B, L]`` integer positions.

    Returns:
        ``[B, L]`` bool, True on the first token of each document.
    """
    starts = torch.ones(position_ids.shape, dtype=torch.bool, device=position_ids.device)  # [B, L]
    starts[:, 1:] = position_ids[:, 1:] - position_ids[:, :-1] != 1  # [B, L - 1]
    return starts


def cu_seqlens_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Document boundaries from packed position ids (:func:`document_starts`).

    Args:
        position_ids: ``[B, T_row]`` or ``[T]``; a new document starts wherever the position does not
            continue the previous one (e.g. restarts at 0) and at the start of every row.

    Returns:
        ``[n_docs + 1]`` int64 ``cu_seqlens`` over the flattened batch (CPU).
    """
    pos = position_ids.detach().reshape(position_ids.shape[0], -1) if position_ids.dim() == 2 \
        else position_ids.detach().reshape(1, -1)  # [B, T_row]
    flat = document_starts(pos).reshape(-1).nonzero().squeeze(1).to(torch.int64)  # [n_docs]
    total = torch.tensor([pos.numel()], dtype=torch.int64, device=flat.device)
    return torch.cat([flat, total]).cpu()


def check_position_ids(position_ids: torch.Tensor, layout: Layout) -> None:
    """Raise ``ValueError`` unless ``position_ids`` count 0, 1, 2, ... inside every document.

    Args:
        position_ids: ``[B, T_row]`` or ``[T]`` position ids of the flattened batch.
        layout: the documents they must agree with.
    """
    pos = position_ids.detach().reshape(-1).to("cpu", torch.int64).numpy()
    if pos.shape[0] != layout.total_tokens:
        raise ValueError(f"position_ids cover {pos.shape[0]} tokens but cu_seqlens covers {layout.total_tokens}")
    doc_start = np.repeat(layout.cu_seqlens[:-1], layout.doc_lengths)  # [T]
    expected = np.arange(layout.total_tokens, dtype=np.int64) - doc_start
    if not np.array_equal(pos, expected):
        bad = int(np.argmax(pos != expected))
        raise ValueError(
            f"position_ids disagree with cu_seqlens at token {bad} (got {int(pos[bad])}, expected "
            f"{int(expected[bad])}); position ids must restart at 0 at every document start and count up "
            "by one (build both from the same PackingCollator output)"
        )
