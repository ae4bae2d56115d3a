"""Layout: the document boundaries of a packed batch, ``cu_seqlens`` over the flattened ``T = B * T_row`` tokens
(documents never span two rows). Plain data: validated once, hashed for the plan cache and the cross-rank check."""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass(frozen=True, eq=False)
class Layout:
    """Validated document boundaries."""

    cu_seqlens: np.ndarray  # [n_docs + 1] int64, 0 = cu[0] < cu[1] < ... < cu[-1] = T
    digest: bytes  # 8-byte blake2b of cu_seqlens

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
        """Tokens of the longest document (cached: every layer asks, to pick its mask kind)."""
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
    """Validate ``cu_seqlens`` (``[n_docs + 1]``) into a :class:`Layout` (a layout is returned as it is); raise
    ``ValueError``, naming the fix, unless 1-D integers from 0 strictly increasing to ``total_tokens`` (if given)."""
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
        raise ValueError("cu_seqlens must be a 1-D list of document boundaries [0, len_0, len_0+len_1, ..., T] with at "
                         f"least one document; got shape {tuple(arr.shape)}. For a batch [B, T_row] flatten it first.")
    if arr[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0 (got {int(arr[0])}); prepend 0 to the cumulative lengths")
    steps = np.diff(arr)
    if (steps <= 0).any():
        bad = int(np.argmax(steps <= 0))
        raise ValueError(f"cu_seqlens must be strictly increasing (document {bad} has length {int(steps[bad])}); "
                         "drop empty documents before packing")
    if total_tokens is not None and int(arr[-1]) != int(total_tokens):
        raise ValueError(f"cu_seqlens ends at {int(arr[-1])} but the batch has {int(total_tokens)} tokens; "
                         "cu_seqlens must end at the total number of tokens of the flattened batch")
    arr = np.ascontiguousarray(arr)
    digest = hashlib.blake2b(arr.tobytes(), digest_size=8).digest()
    return Layout(cu_seqlens=arr, digest=digest)
