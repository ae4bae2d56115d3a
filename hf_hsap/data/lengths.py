"""Document lengths of one packed row, drawn from the benchmark spec's distributions (pure numpy).

The one sampler of the project: ``benchmarks.analytic.distributions.doc_lengths`` and
``hf_hsap.inspect.sample_lengths`` (``hsap-plan --dist``) are this :func:`doc_lengths`.

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
from typing import Mapping

import numpy as np

__all__ = ["DISTRIBUTIONS", "MIN_DOC", "doc_lengths"]

DISTRIBUTIONS = ("longtail", "sft", "single", "mixed")
MIN_DOC = 16
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
