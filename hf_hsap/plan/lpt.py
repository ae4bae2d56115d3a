"""Least-loaded placement of many whole documents at once (the light documents of :mod:`.density`'s passes).

LPT places each document, heaviest first, on the part with the least load (``work + token_cost * tokens``, ties
by part index): a heap and one document at a time in plain Python, about 0.4-0.6 us a document. On a row of a few
thousand short documents over many parts, the next documents go to the least-loaded parts in turn, each to the
next one of the parts sorted by load, for as long as each of those parts is still below every part a document of
the batch has gone to: :func:`least_loaded_batch` finds that run with a handful of numpy operations per batch
(about 12 us) and places it at once. The choices are the heap's, exactly: the loads are the same float64
operations, ties stop a batch (the next batch sorts them by index). It pays where batches are long, on many parts:
2,000 documents over 64 parts took 35 batches, 0.44 ms against the heap's 0.83; at 32 parts the two were even,
at 8 parts the batches were 6x slower (251 batches; :data:`BATCH_MIN_PARTS`). No library offers LPT with this
tie rule and a token cap.
"""
from __future__ import annotations

import numpy as np

__all__ = ["BATCH_MIN_PARTS", "least_loaded_batch"]

BATCH_MIN_PARTS = 48  # density's passes place their light documents by batches from this many parts (heap below)


def least_loaded_batch(lens: np.ndarray, pairs: np.ndarray, token_cost: float, cap_t: float, tok: np.ndarray,
                       wrk: np.ndarray, out: np.ndarray) -> int:
    """Place the documents in order, each on the least-loaded part (the heap's choice), until one whose
    least-loaded part has no room for it under ``cap_t``.

    Args:
        lens, pairs: ``[n]`` float64 tokens and pairs of the documents, heaviest first. token_cost: a token's
            price in pairs. cap_t: the token cap.
        tok, wrk: ``[P]`` float64 tokens and pairs of every part (updated).
        out: ``[n]`` int64, the part of every document placed (updated).

    Returns:
        The index of the first document not placed (``n`` when every one was): its least-loaded part lacks room.
    """
    n, P = lens.shape[0], tok.shape[0]
    score = wrk + token_cost * tok  # [P] every part's load, as the heap holds it
    i = 0
    while i < n:
        m = min(P, n - i)
        o = np.argsort(score, kind="stable")[:m]  # [m] least loaded first, ties by index
        nt = tok[o] + lens[i:i + m]  # [m] document i + j on part o[j]: its tokens, pairs and load
        nw = wrk[o] + pairs[i:i + m]
        ns = nw + token_cost * nt
        # document i + j goes to o[j] while o[j] is below every part the batch has loaded before it (ties stop)
        ok = score[o[1:]] < np.minimum.accumulate(ns[:-1])  # [m - 1]
        k = m if ok.all() else int(ok.argmin()) + 1
        full = nt[:k] > cap_t
        if full.any():
            k = int(full.argmax())  # the first document without room stops the batch
            if k == 0:
                return i
        o = o[:k]
        tok[o], wrk[o], score[o], out[i:i + k] = nt[:k], nw[:k], ns[:k], o
        i += k
    return n
