"""Document lengths of one packed row, drawn from the benchmark spec's distributions (pure numpy).

The samplers of the project's layouts, one implementation each:

* :func:`doc_lengths`: the spec's distributions (table below); ``benchmarks.analytic.distributions.doc_lengths``
  and ``hf_hsap.inspect.sample_lengths`` (``hsap-plan --dist``) are this function.
* :func:`sweep_lengths`: the placement sweep's layouts (:data:`SWEEP_DISTRIBUTIONS`), which the planner's
  tests and ``benchmarks.analytic.sweep`` share.
* :func:`planning_lengths`: a row of a given number of ``longtail``-shaped documents (the planning case).

Lengths are drawn with ``numpy.random.default_rng(seed)`` until their running sum reaches ``T``; the
last document is then cut so that the sum is exactly ``T`` (so the last one may be shorter than the
lower clip bound).

| name       | draw                                                      | meaning                          |
| ---------- | --------------------------------------------------------- | -------------------------------- |
| `longtail` | ``int(clip(rng.lognormal(log(2048), 1.6), 16, T))``       | pretraining mix                  |
| `sft`      | ``int(clip(rng.lognormal(log(600), 0.9), 16, T))``        | fine-tuning conversations        |
| `single`   | one document of length ``T``                              | plain long-context training      |
| `mixed`    | one document of ``T // 2`` **first**, then `longtail`      | one long document among short    |
|            | draws (clip bound ``T``) filling the remaining tokens     |                                  |

Draws are made in batches: numpy's ``Generator`` produces the same values whether a stream of
draws is requested one at a time or in blocks, so the result equals the one-at-a-time definition.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

__all__ = ["DISTRIBUTIONS", "MIN_DOC", "SWEEP_DISTRIBUTIONS", "doc_lengths", "planning_lengths", "sweep_lengths"]

DISTRIBUTIONS = ("longtail", "sft", "single", "mixed")
MIN_DOC = 16
SWEEP_DISTRIBUTIONS = ("lognormal-0.5", "lognormal-1.0", "lognormal-1.6", "lognormal-2.2", "pareto-1.1",
                       "pareto-1.5", "bimodal", "one-dominant", "two-dominant", "tiny", "sft")
_LOGNORMAL: Mapping[str, tuple[float, float]] = MappingProxyType(
    {"longtail": (2048.0, 1.6), "sft": (600.0, 0.9)})  # (median, sigma)


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


def _fill(draw: Callable[[int], np.ndarray], T: int) -> np.ndarray:
    """Lengths drawn by ``draw`` in blocks of 256 until they reach ``T``; the last one cut.

    Args:
        draw: ``draw(n)`` returns ``n`` lengths (values below 1 are raised to 1).
        T: the exact sum the lengths must reach.

    Returns:
        ``[n_docs]`` int64 lengths, each ``>= 1``, summing to exactly ``T``.
    """
    out, acc = [], 0
    while acc < T:
        x = np.maximum(1, np.asarray(draw(256), dtype=np.int64))
        out.append(x)
        acc += int(x.sum())
    lens = np.concatenate(out)
    c = np.cumsum(lens)
    n = int(np.searchsorted(c, T)) + 1
    lens = lens[:n].copy()
    lens[-1] = T - (int(c[n - 2]) if n > 1 else 0)
    return lens


def sweep_lengths(name: str, T: int, seed: int) -> np.ndarray:
    """Document lengths of one row of the placement sweep.

    Layouts: log-normal lengths of four spreads, Pareto tails, a two-mode mixture, rows where one or two
    documents hold most of the pairs, many tiny documents, and the spec's ``sft`` (:func:`doc_lengths`).

    Args:
        name: one of :data:`SWEEP_DISTRIBUTIONS`.
        T: row length in tokens.
        seed: seed of ``numpy.random.default_rng``.

    Returns:
        ``[n_docs]`` int64 lengths summing to ``T``, each ``>= 1``.

    Raises:
        ValueError: unknown name.
    """
    rng = np.random.default_rng(seed)
    if name.startswith("lognormal-"):
        sigma = float(name.split("-")[1])
        return _fill(lambda n: np.clip(rng.lognormal(np.log(1024.0), sigma, n), 16, T), T)
    if name.startswith("pareto-"):
        alpha = float(name.split("-")[1])
        return _fill(lambda n: np.clip(16 + 128 * rng.pareto(alpha, n), 16, T), T)
    if name == "bimodal":  # short chats and long documents of ~T/8
        return _fill(lambda n: np.where(rng.random(n) < 0.9, rng.lognormal(np.log(300.0), 0.5, n),
                                        rng.lognormal(np.log(T / 8), 0.3, n)).clip(16, T), T)
    if name in ("one-dominant", "two-dominant"):  # one or two documents hold most of the pairs
        k = 1 if name == "one-dominant" else 2
        big = (T * rng.uniform(0.25, 0.45, k)).astype(np.int64)
        rest = _fill(lambda n: np.clip(rng.lognormal(np.log(500.0), 1.0, n), 16, T), T - int(big.sum()))
        return rng.permutation(np.concatenate([big, rest]))
    if name == "tiny":
        return _fill(lambda n: rng.integers(16, 65, n), T)
    if name == "sft":
        return doc_lengths("sft", T, seed)
    raise ValueError(f"unknown sweep distribution {name!r}; choose one of {', '.join(SWEEP_DISTRIBUTIONS)}")


def planning_lengths(T: int, n_docs: int, seed: int) -> np.ndarray:
    """``n_docs`` document lengths summing to ``T``: ``longtail`` draws (log-normal, median 2048,
    sigma 1.6) scaled to the row, each at least 16 tokens; the rounding rest goes to the longest.

    Args:
        T: row length in tokens.
        n_docs: number of documents.
        seed: seed of ``numpy.random.default_rng``.

    Returns:
        ``[n_docs]`` int64 lengths, sum ``T``.
    """
    rng = np.random.default_rng(seed)
    w = rng.lognormal(np.log(2048.0), 1.6, size=n_docs)
    lengths = np.maximum(16, np.floor(w / w.sum() * T)).astype(np.int64)
    lengths[np.argmax(lengths)] += T - int(lengths.sum())
    return lengths
