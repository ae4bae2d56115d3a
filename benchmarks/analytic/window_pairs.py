"""Sliding-window (and causal) pair counts of document-masked attention, in closed form per pair of segments
(no clock): the geometry :mod:`benchmarks.analytic.schemes` and :mod:`benchmarks.analytic.windows` count work with.

A query at offset ``i`` of its document keeps the keys ``j`` with ``j <= i`` and, with a window ``W``, ``i < j + W``.
"""
from __future__ import annotations

import numpy as np


def window_rows_work(a: np.ndarray, b: np.ndarray, window: int | None) -> np.ndarray:
    """(query, key) pairs of the queries at document offsets ``[a, b)`` against every key of their document
    that a sliding window keeps (``j <= i < j + W``; ``window=None``: causal, ``x + 1`` keys at offset ``x``).

    Args:
        a, b: query offsets inside the document (ints or integer arrays, elementwise, ``a <= b``).
        window: ``W`` (>= 1) or None.

    Returns:
        int64 pairs, elementwise.
    """
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    if window is None:
        return (b * (b + 1) - a * (a + 1)) // 2
    W = int(window)

    def g(n: np.ndarray) -> np.ndarray:  # sum_{x < n} min(x + 1, W)
        return np.where(n <= W, n * (n + 1) // 2, W * (W + 1) // 2 + (n - W) * W)

    return g(b) - g(a)


def _pairs_at_least(a: np.ndarray, b: np.ndarray, c: np.ndarray, e: np.ndarray, t: int) -> np.ndarray:
    """``#{(i, j): a <= i < b, c <= j < e, i - j >= t}`` elementwise (int64 arrays).

    ``sum_i f(i - t + 1)`` with ``f(x) = clip(x - c, 0, e - c)`` (the keys ``j < x``), via its prefix sum
    ``phi(y) = sum_{x < y} f(x)``."""
    n = e - c

    def phi(y: np.ndarray) -> np.ndarray:
        k = y - c
        return np.where(k <= 0, 0, np.where(k <= n, k * (k - 1) // 2, n * (n - 1) // 2 + (k - n) * n))

    return phi(b - t + 1) - phi(a - t + 1)


def window_pairs(qa, qb, ka, kb, window: int | None) -> np.ndarray:
    """Pairs of queries ``[qa, qb)`` with keys ``[ka, kb)`` of one document (offsets or global positions,
    the same for both) that document-masked attention computes: ``j <= i`` and, with a window, ``i < j + W``.

    Args:
        qa, qb, ka, kb: ints or integer arrays (elementwise). window: ``W`` or None (causal).

    Returns:
        int64 pairs, elementwise.
    """
    qa, qb, ka, kb = (np.asarray(x, dtype=np.int64) for x in (qa, qb, ka, kb))
    out = _pairs_at_least(qa, qb, ka, kb, 0)
    return out if window is None else out - _pairs_at_least(qa, qb, ka, kb, int(window))


def window_useful_pairs(lengths: np.ndarray, window: int | None) -> int:
    """(query, key) pairs of document-masked attention with a sliding window over a layout
    (``window=None``: :func:`~benchmarks.analytic.distributions.useful_pairs`)."""
    L = np.asarray(lengths, dtype=np.int64)
    return int(window_rows_work(np.zeros_like(L), L, window).sum())


def row_segments(lengths: np.ndarray, n_chunks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The non-empty pieces of the documents inside the ``n_chunks`` row chunks of
    :func:`~benchmarks.analytic.distributions.row_chunk_matrix` (chunk ``c`` is ``[c T // C, (c + 1) T // C)``).

    Returns:
        ``(doc, a, b, chunk)`` ``[n_segments]`` int64, ``[a, b)`` offsets inside document ``doc``.
    """
    cu = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
    bnd = (np.arange(n_chunks + 1, dtype=np.int64) * int(cu[-1])) // n_chunks
    lo = np.maximum(cu[:-1, None], bnd[None, :-1])
    hi = np.minimum(cu[1:, None], bnd[None, 1:])
    d, c = np.nonzero(hi > lo)
    return d.astype(np.int64), lo[d, c] - cu[d], hi[d, c] - cu[d], c.astype(np.int64)


def doc_chunk_segments(lengths: np.ndarray, n_chunks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every document cut in ``n_chunks`` equal chunks (:func:`~benchmarks.analytic.distributions.per_doc_chunk_matrix`).

    Returns:
        ``(doc, a, b, chunk)`` as :func:`row_segments` (empty chunks of empty documents dropped).
    """
    L = np.asarray(lengths, dtype=np.int64)
    if np.any(L % n_chunks):
        raise ValueError("every length must be a multiple of n_chunks")
    d = np.repeat(np.arange(L.size, dtype=np.int64), n_chunks)
    c = np.tile(np.arange(n_chunks, dtype=np.int64), L.size)
    size = L[d] // n_chunks
    keep = size > 0
    return d[keep], (c * size)[keep], ((c + 1) * size)[keep], c[keep]


def segment_pair_matrix(doc: np.ndarray, a: np.ndarray, b: np.ndarray, owner: np.ndarray, n_parts: int,
                        window: int | None = None) -> np.ndarray:
    """Document-masked (optionally sliding-window) work between parts, from disjoint segments.

    Args:
        doc, a, b: ``[n_segments]`` the document and its offsets ``[a, b)`` of each segment (the segments
            of a document are disjoint).
        owner: ``[n_segments]`` part of each segment.
        n_parts: number of parts.
        window: ``W`` or None (causal).

    Returns:
        ``[n_parts, n_parts]`` float64 (exact integers): pairs of part ``x``'s queries with part ``y``'s keys.
    """
    doc, a, b, owner = (np.asarray(x, dtype=np.int64) for x in (doc, a, b, owner))
    order = np.lexsort((a, doc))
    doc, a, b, owner = doc[order], a[order], b[order], owner[order]
    n = doc.size
    out = np.zeros((n_parts, n_parts))
    if n == 0:
        return out
    first = np.concatenate([[True], doc[1:] != doc[:-1]])
    gstart = np.maximum.accumulate(np.where(first, np.arange(n), 0))
    cnt = np.arange(n) - gstart + 1  # key segments at or before each query segment in its document
    qi = np.repeat(np.arange(n), cnt)
    ki = gstart[qi] + np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    w = window_pairs(a[qi], b[qi], a[ki], b[ki], window)
    np.add.at(out, (owner[qi], owner[ki]), w.astype(np.float64))
    return out
