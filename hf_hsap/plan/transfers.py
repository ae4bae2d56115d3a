"""Which KV tokens each part needs from which peer, the minimum a plan may send: part ``r`` needs key ``j`` of document
``d`` exactly when it does not hold ``j`` but holds a query ``i >= j`` of ``d``, i.e. every foreign segment of ``d``
before the part's last segment in ``d``. Nothing else is ever sent."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .placement import Placement


@dataclass(frozen=True, eq=False)
class Transfers:
    """Forward KV transfers: ``[n]`` int64 arrays, a row per (segment, receiving part), sorted by (dst, src, start)."""

    src: np.ndarray  # owning part
    dst: np.ndarray  # receiving part
    seg: np.ndarray  # the segment that travels (index into the placement's arrays)
    start: np.ndarray  # its global token range [start, end)
    end: np.ndarray
    src_local: np.ndarray  # its offset in the owner's local buffer

    @property
    def lengths(self) -> np.ndarray:
        return self.end - self.start

    def pair_matrix(self, n_parts: int) -> np.ndarray:
        """``[n_parts, n_parts]`` KV tokens sent from part i (row) to part j (column)."""
        m = np.zeros((n_parts, n_parts), dtype=np.int64)
        np.add.at(m, (self.src, self.dst), self.lengths)
        return m


def compute_transfers(pl: Placement) -> Transfers:
    """The minimal forward transfers of a placement, vectorised over its segments."""
    order = np.lexsort((pl.start, pl.doc))  # segments in document order
    doc, part = pl.doc[order], pl.part[order]
    n = order.shape[0]
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Transfers(empty, empty, empty, empty, empty, empty)
    first_of_doc = np.concatenate([[True], doc[1:] != doc[:-1]])
    doc_lo = np.maximum.accumulate(np.where(first_of_doc, np.arange(n), 0))  # [n] first seg of its doc
    # last segment of each (doc, part): the part's query frontier in that document
    key = doc * pl.n_parts + part
    uniq, last_idx = np.unique(key[::-1], return_index=True)
    last_idx = n - 1 - last_idx  # index (in doc order) of the last segment of each (doc, part)
    split = doc_lo[last_idx] < last_idx  # only frontiers with earlier segments in the doc can need KV
    last_idx, uniq = last_idx[split], uniq[split]
    recv_part = uniq % pl.n_parts
    # every (frontier, earlier segment of its doc) pair: prefix [doc_lo, last_idx)
    lo = doc_lo[last_idx]
    cnt = last_idx - lo
    rows = np.repeat(np.arange(last_idx.shape[0]), cnt)
    within = np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    cand = lo[rows] + within  # candidate segment (doc order)
    dst = recv_part[rows]
    keep = part[cand] != dst
    cand, dst = cand[keep], dst[keep]
    seg = order[cand]
    src = pl.part[seg]
    start = pl.start[seg]
    o = np.lexsort((start, src, dst))
    seg, src, dst, start = seg[o], src[o], dst[o], start[o]
    return Transfers(src=src, dst=dst, seg=seg, start=start, end=pl.end[seg], src_local=pl.local_start[seg])
