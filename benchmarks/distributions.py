"""Document-length distributions of the benchmark spec (``shared/BENCHMARK_SPEC.md``).

Every distribution returns the lengths of the documents packed into one row of ``T`` tokens. Lengths
are drawn with ``numpy.random.default_rng(seed)`` until their running sum reaches ``T``; the last
document is then cut so that the sum is exactly ``T`` (so the last one may be shorter than the lower
clip bound).

| name       | draw                                                      | meaning                          |
| ---------- | --------------------------------------------------------- | -------------------------------- |
| `longtail` | ``int(clip(rng.lognormal(log(2048), 1.6), 16, T))``       | pretraining mix                  |
| `sft`      | ``int(clip(rng.lognormal(log(600), 0.9), 16, T))``        | fine-tuning conversations        |
| `single`   | one document of length ``T``                              | plain long-context training      |
| `mixed`    | one document of ``T // 2`` **first**, then `longtail`      | one long document among short    |
|            | draws (clip bound ``T``) filling the remaining tokens     |                                  |

The long document of `mixed` is placed first (global positions ``[0, T // 2)``): contiguous and
zigzag placements then see it at the start of the row, which is where a data loader that sorts or
prepends the longest sample would put it.

Draws are made in batches: numpy's ``Generator`` produces the same values whether a stream of
draws is requested one at a time or in blocks, so the result equals the one-at-a-time definition.
"""
from __future__ import annotations

import numpy as np

DISTRIBUTIONS = ("longtail", "sft", "single", "mixed")
MIN_DOC = 16
_LOGNORMAL = {"longtail": (2048.0, 1.6), "sft": (600.0, 0.9)}


def _draw_until(rng: np.random.Generator, median: float, sigma: float, total: int, clip_hi: int) -> np.ndarray:
    """Draw clipped log-normal lengths until their sum reaches ``total``; cut the last.

    Args:
        rng: the generator (its stream is consumed in order).
        median: ``exp(mu)`` of the log-normal.
        sigma: log-space standard deviation.
        total: the exact sum the lengths must reach (``>= 1``).
        clip_hi: upper clip bound of a single draw (the spec uses the row length ``T``).

    Returns:
        ``[n_docs]`` int64 lengths, each ``>= 1``, summing to exactly ``total``.
    """
    chunks: list[np.ndarray] = []
    acc = 0
    batch = max(16, int(2 * total / median) + 1)
    while acc < total:
        draw = rng.lognormal(np.log(median), sigma, size=batch)
        lens = np.clip(draw, MIN_DOC, clip_hi).astype(np.int64)  # int() truncation, as the spec
        chunks.append(lens)
        acc += int(lens.sum())
    lens = np.concatenate(chunks)
    csum = np.cumsum(lens)
    n = int(np.searchsorted(csum, total, side="left")) + 1  # first prefix whose sum reaches total
    out = lens[:n].copy()
    out[-1] = total - (int(csum[n - 2]) if n >= 2 else 0)
    return out


def doc_lengths(name: str, T: int, seed: int) -> np.ndarray:
    """Document lengths of one packed row, per the benchmark spec.

    Args:
        name: one of ``longtail``, ``sft``, ``single``, ``mixed``.
        T: row length in tokens (``>= 2``).
        seed: seed of ``numpy.random.default_rng``.

    Returns:
        ``[n_docs]`` int64 lengths summing to exactly ``T``. All documents but the last lie in
        ``[16, T]``; the last lies in ``[1, T]`` (it is cut to make the sum exact). For ``mixed`` the
        first document has length ``T // 2``.

    Raises:
        ValueError: unknown name or ``T < 2``.
    """
    if T < 2:
        raise ValueError(f"T must be >= 2, got {T}")
    rng = np.random.default_rng(seed)
    if name == "single":
        return np.array([T], dtype=np.int64)
    if name in _LOGNORMAL:
        median, sigma = _LOGNORMAL[name]
        return _draw_until(rng, median, sigma, T, T)
    if name == "mixed":
        long_doc = T // 2
        median, sigma = _LOGNORMAL["longtail"]
        rest = _draw_until(rng, median, sigma, T - long_doc, T)
        return np.concatenate([np.array([long_doc], dtype=np.int64), rest])
    raise ValueError(f"unknown distribution {name!r}; expected one of {DISTRIBUTIONS}")


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
