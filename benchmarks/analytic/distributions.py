"""Document-length distributions of the benchmark spec (``benchmarks/SPEC.md``), the planning case's row
(:func:`planning_lengths`), and layout arithmetic on them.

Every distribution returns the lengths of the documents packed into one row of ``T`` tokens. The
sampler lives in the library, :func:`hf_hsap.data.lengths.doc_lengths` (its docstring holds the
table of draws); it is re-exported here with ``DISTRIBUTIONS``, ``MIN_DOC`` and :func:`planning_lengths`
(also the library's), so the benchmarks and ``hsap-plan --dist`` draw the very same rows.

The long document of `mixed` is placed first (global positions ``[0, T // 2)``): contiguous and
zigzag placements then see it at the start of the row, which is where a data loader that sorts or
prepends the longest sample would put it.
"""
from __future__ import annotations

import numpy as np

from hf_hsap.data.lengths import DISTRIBUTIONS, MIN_DOC, doc_lengths, planning_lengths

__all__ = ["DISTRIBUTIONS", "MIN_DOC", "cu_seqlens", "doc_lengths", "pair_matrix", "per_doc_chunk_matrix",
           "planning_lengths", "row_chunk_matrix", "useful_pairs", "zigzag_owner"]


def cu_seqlens(lengths: np.ndarray) -> np.ndarray:
    """Cumulative document boundaries.

    Args:
        lengths: ``[n_docs]`` positive document lengths.

    Returns:
        ``[n_docs + 1]`` int64, starting at 0 and ending at ``sum(lengths)``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])


# ----------------------------------------------------------------------------- layout arithmetic
def useful_pairs(lengths: np.ndarray) -> int:
    """(query, key) pairs of document-masked causal attention over a layout.

    Args:
        lengths: ``[n_docs]`` document lengths.

    Returns:
        ``sum_d L_d (L_d + 1) / 2`` (a query at offset ``x`` of its document sees ``x + 1`` keys).
    """
    L = np.asarray(lengths, dtype=np.int64)
    return int((L * (L + 1) // 2).sum())


def zigzag_owner(n_parts: int) -> np.ndarray:
    """Owner of each of ``2 n_parts`` chunks under dual-chunk swap.

    Args:
        n_parts: number of parts.

    Returns:
        ``[2 n_parts]`` int: chunk ``i`` and chunk ``2 n_parts - 1 - i`` belong to part ``i``.
    """
    c = np.arange(2 * n_parts)
    return np.where(c < n_parts, c, 2 * n_parts - 1 - c)


def row_chunk_matrix(lengths: np.ndarray, n_chunks: int) -> np.ndarray:
    """Tokens of each document inside each of ``n_chunks`` near-equal chunks of the whole row.

    Args:
        lengths: ``[n_docs]`` document lengths (sum ``T``).
        n_chunks: ``C``; chunk ``c`` is ``[c T // C, (c + 1) T // C)``.

    Returns:
        ``[n_docs, C]`` float64 (exact integers).
    """
    cu = cu_seqlens(lengths)
    b = (np.arange(n_chunks + 1, dtype=np.int64) * int(cu[-1])) // n_chunks  # [C + 1]
    m = np.minimum(cu[1:, None], b[None, 1:]) - np.maximum(cu[:-1, None], b[None, :-1])  # [n_docs, C]
    return np.clip(m, 0, None).astype(np.float64)


def per_doc_chunk_matrix(lengths: np.ndarray, n_chunks: int) -> np.ndarray:
    """Every document cut in ``n_chunks`` equal chunks (lengths must be multiples of ``n_chunks``).

    Args:
        lengths: ``[n_docs]`` document lengths, each divisible by ``n_chunks``.
        n_chunks: ``C``.

    Returns:
        ``[n_docs, C]`` float64: ``L_d / C`` everywhere.
    """
    L = np.asarray(lengths, dtype=np.int64)
    if np.any(L % n_chunks):
        raise ValueError("every length must be a multiple of n_chunks")
    return np.repeat((L // n_chunks).astype(np.float64)[:, None], n_chunks, axis=1)


def pair_matrix(chunks: np.ndarray, owner: np.ndarray, n_parts: int) -> np.ndarray:
    """Document-masked causal work between parts.

    Within a document, chunks are in position order: a query chunk attends fully to every earlier
    chunk of its document and causally to itself.

    Args:
        chunks: ``[n_docs, C]`` tokens of document ``d`` in chunk ``c``.
        owner: ``[C]`` part holding each chunk.
        n_parts: number of parts.

    Returns:
        ``[n_parts, n_parts]`` float64 (exact integers): pairs of part ``a``'s queries with part ``b``'s keys.
    """
    m = chunks
    wc = np.tril(m.T @ m, -1) + np.diag((m * (m + 1) / 2).sum(axis=0))  # [C, C] query chunk × key chunk
    onehot = np.zeros((m.shape[1], n_parts))
    onehot[np.arange(m.shape[1]), owner] = 1.0  # [C, n_parts]
    return np.rint(onehot.T @ wc @ onehot)

