"""Placements: which part (a rank, or a rank group under Ulysses) holds which global tokens.

A placement is a set of *segments*, contiguous token ranges inside one document, each owned by one part. A part
holds its segments in global order, so it runs its own documents with a plain causal kernel. The simple placements
(``P`` parts; ``balanced`` and ``density``, held to :func:`token_cap`, are in :mod:`.balanced` and :mod:`.density`)::

    contiguous   |  part 0  |  part 1  |  part 2  |  part 3  |   equal token ranges, documents cut anywhere
    zigzag       |0|1|2|3|3|2|1|0| per document                  2P chunks, chunk i and 2P-1-i on part i
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .layout import Layout

PLACEMENTS = ("contiguous", "zigzag", "balanced", "density", "auto")
DEFAULT_TOKEN_SLACK = 0.10
DEFAULT_WORK_SLACK = 0.03


@dataclass(frozen=True, eq=False)
class Placement:
    """Segments sorted by (part, start); arrays ``[n_segments]`` int64 except ``part_ptr``."""

    name: str
    n_parts: int
    doc: np.ndarray  # a segment is global [start, end) inside document doc, held by part
    start: np.ndarray
    end: np.ndarray
    part: np.ndarray
    part_ptr: np.ndarray  # [n_parts + 1]: part p owns segments part_ptr[p]:part_ptr[p + 1]
    local_start: np.ndarray  # offset of each segment in its part's local buffer

    @functools.cached_property
    def runs(self) -> tuple[np.ndarray, np.ndarray]:
        """The (part, document) runs (a part's segments of one document are consecutive), computed once:
        ``(first, own)``, ``[n_runs]`` each run's first segment and the tokens it holds."""
        doc, part = self.doc, self.part
        first = np.flatnonzero(np.concatenate([[True], (doc[1:] != doc[:-1]) | (part[1:] != part[:-1])]))
        if doc.shape[0] == 0:
            first = first[:0]
        return first, np.add.reduceat(self.end - self.start, first) if first.shape[0] else first.copy()

    def tokens_per_part(self) -> np.ndarray:
        """``[n_parts]`` tokens held by each part."""
        return np.bincount(self.part, weights=self.end - self.start, minlength=self.n_parts).astype(np.int64)

    def work_per_part(self, layout: Layout) -> np.ndarray:
        """``[n_parts]`` (query, key) pairs of causal document-masked attention of each part's queries."""
        doc_start = layout.cu_seqlens[self.doc]
        a = self.start - doc_start
        b = self.end - doc_start
        return np.bincount(self.part, weights=rows_work(a, b), minlength=self.n_parts).astype(np.int64)


def token_cap(total_tokens: int, n_parts: int, token_slack: float) -> float:
    """The most tokens a part of ``balanced`` or ``density`` holds: ``ceil(T / P) * (1 + token_slack)`` (a float)."""
    return math.ceil(total_tokens / n_parts) * (1.0 + token_slack)


def rows_work(u, v):
    """(query, key) pairs of the rows at document offsets ``[u, v)`` (a row at ``x`` attends ``x + 1`` keys);
    ints or integer arrays."""
    return (v * (v + 1) - u * (u + 1)) // 2


def _finish(name: str, n_parts: int, doc, start, end, part, *, ordered: bool = False) -> Placement:
    """The placement of segments ``(doc, start, end, part)`` in any order, empty ones dropped; ``ordered``: they
    are by (part, start) already and none is empty."""
    doc, start, end, part = (np.asarray(x, dtype=np.int64) for x in (doc, start, end, part))
    if not ordered:
        keep = end > start
        if not keep.all():
            doc, start, end, part = doc[keep], start[keep], end[keep], part[keep]
        # by (part, start): one key (starts are distinct once empty segments are gone), one argsort
        order = np.argsort(part * (int(end.max(initial=0)) + 1) + start)
        doc, start, end, part = doc[order], start[order], end[order], part[order]
    counts = np.bincount(part, minlength=n_parts)
    part_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    lengths = end - start
    csum = np.concatenate([[0], np.cumsum(lengths)])  # exclusive prefix over all segments, [n + 1]
    local_start = csum[:-1] - np.repeat(csum[part_ptr[:-1]], counts)
    return Placement(name, n_parts, doc, start, end, part, part_ptr, local_start.astype(np.int64))


def _cut(layout: Layout, bounds: np.ndarray, owner_of_range: np.ndarray, name: str, n_parts: int) -> Placement:
    """Cut the tokens at document boundaries and at ``bounds`` (``[bounds[i], bounds[i+1])`` owned by
    ``owner_of_range[i]``)."""
    cuts = np.sort(np.concatenate([layout.cu_seqlens, bounds]))  # a repeated cut makes an empty range: dropped
    start, end = cuts[:-1], cuts[1:]
    keep = end > start
    start, end = start[keep], end[keep]
    doc = layout.doc_of(start)
    rng = np.searchsorted(bounds, start, side="right") - 1
    owner = owner_of_range[rng]
    # owners never decreasing along the line (contiguous ranges): the segments are by (part, start) already
    return _finish(name, n_parts, doc, start, end, owner, ordered=bool((owner[1:] >= owner[:-1]).all()))


def contiguous(layout: Layout, n_parts: int) -> Placement:
    """Equal token ranges: part ``p`` holds ``[p*T//P, (p+1)*T//P)``."""
    T = layout.total_tokens
    bounds = (np.arange(n_parts + 1, dtype=np.int64) * T) // n_parts
    return _cut(layout, bounds, np.arange(n_parts, dtype=np.int64), "contiguous", n_parts)


def _zigzag_chunks(lengths: np.ndarray, k: int, rotate_from: int = 0) -> tuple[np.ndarray, int]:
    """Chunk sizes ``[n_docs, 2k]`` of a dual-chunk split (chunks ``i`` and ``2k-1-i`` on part ``i``), and the next
    ``rotate_from``: each document's ``L mod 2k`` extra tokens go round-robin over the parts, across documents."""
    base = lengths // (2 * k)
    rem = lengths % (2 * k)
    # chunk order in which extras are handed out: first chunks of parts 0..k-1, then second chunks
    order = np.concatenate([np.arange(k), 2 * k - 1 - np.arange(k)])
    first = (rotate_from + np.concatenate([[0], np.cumsum(rem)[:-1]])) % (2 * k)  # [n]
    slot = (np.arange(2 * k)[None, :] - first[:, None]) % (2 * k)  # rank of each order slot
    extra = (slot < rem[:, None]).astype(np.int64)  # [n, 2k] in `order` positions
    sizes = np.repeat(base[:, None], 2 * k, axis=1)
    sizes[:, order] += extra
    return sizes, int((rotate_from + rem.sum()) % (2 * k))


def _zigzag_segments(doc_ids: np.ndarray, doc_starts: np.ndarray, sizes: np.ndarray,
                     parts_of_doc: np.ndarray) -> tuple[np.ndarray, ...]:
    """(doc, start, end, part) of dual-chunk splits. Shapes: sizes ``[n, 2k]``; parts_of_doc ``[n, k]``, the part of
    chunk pair ``i``."""
    two_k = sizes.shape[1]
    offs = np.cumsum(sizes, axis=1) - sizes  # [n, 2k]
    start = doc_starts[:, None] + offs
    end = start + sizes
    pair = np.minimum(np.arange(two_k), two_k - 1 - np.arange(two_k))  # chunk -> pair index
    part = parts_of_doc[:, pair]  # [n, 2k]
    doc = np.repeat(doc_ids[:, None], two_k, axis=1)
    return doc.ravel(), start.ravel(), end.ravel(), part.ravel()


def zigzag(layout: Layout, n_parts: int) -> Placement:
    """TransformerEngine-style: every document cut into ``2P`` chunks, chunk i and 2P-1-i on part i."""
    lengths = layout.doc_lengths
    sizes, _ = _zigzag_chunks(lengths, n_parts)
    parts = np.broadcast_to(np.arange(n_parts, dtype=np.int64), (lengths.shape[0], n_parts))
    seg = _zigzag_segments(np.arange(lengths.shape[0]), layout.cu_seqlens[:-1], sizes, parts)
    return _finish("zigzag", n_parts, *seg)
