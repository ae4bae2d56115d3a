"""Which parts take a document's equal shares in :mod:`.balanced`'s greedy pass: the fewest least-loaded parts
that can each hold a ``1/k`` share within the token cap and the work cap (:func:`choose`).

Speed: most documents fit their fewest parts, most often the first parts tried, so that count is tested by a plain
Python scan that stops at the ``k``-th part that fits (:func:`_fewest_parts`); where it fails, every larger count
is tested at once in a numpy table (:func:`_choose_parts`, :func:`_fits`: the scalar loop over counts and parts,
up to P^2 tests per document, was most of the planning time at P = 64 with a few dozen long documents). Both make
the same float64 operations (a test checks they agree with a scalar loop over every count).
"""
from __future__ import annotations

import numpy as np

__all__ = ["choose", "split_share_max"]


def split_share_max(L: int, k: int) -> int:
    """The most tokens one part holds of a ``k``-way dual-chunk split of ``L`` tokens (:func:`.balanced._chunk_sizes`:
    a pair's two chunks take ``2 * (L // 2k)`` tokens and at most ``ceil(rem / k)`` of the ``rem`` left over, so
    ``ceil(L / k)``): what the token cap is tested against, not the mean share ``L / k``.

    Args:
        L: the document's tokens. k: parts.

    Returns:
        ``ceil(L / k)``.
    """
    return -(-L // k)


def choose(by_load: list[int], L: int, w: float, k0: int, P: int, tok: list[float], wrk: list[float],
           caps: tuple[float, float, float], rho: float) -> tuple[int, list[int]] | None:
    """The parts a document goes to: the fewest least-loaded parts (``k >= k0``) that can each take a ``1/k`` share
    within the work cap and the remaining documents' work (``rho``), else within the work cap alone, else at equal
    work shares (the token cap always); a document that needs most parts anyway goes to all of them (no idle part,
    best balance). Each of the three at the fewest count first (:func:`_fewest_parts`), then at every larger one
    (:func:`_choose_parts`).

    Args:
        by_load: the parts, least loaded first. L, w: the document's tokens and pairs. k0: the fewest parts.
        P: parts. tok, wrk: every part's tokens and pairs. caps: ``(cap_t, cap_w, mean_t)``. rho: the remaining
            documents' average work per token (:func:`_fits`).

    Returns:
        ``(which of the three, the parts)``, or None.
    """
    arrays = None  # by_load, tok and wrk as arrays in by_load order, once a table is needed
    for j, r in enumerate((rho, 0.0, None)):
        chosen = _fewest_parts(by_load, L, w, k0, P, tok, wrk, caps, r)
        if chosen is None:
            if arrays is None:
                order = np.asarray(by_load, dtype=np.int64)
                arrays = order, np.asarray(tok)[order], np.asarray(wrk)[order]  # [P] each
            chosen = _choose_parts(arrays[0], L, w, k0, P, arrays[1], arrays[2], caps, r)
        if chosen is not None:
            return j, chosen
    return None


def _fewest_parts(by_load: list[int], L: int, w: float, k0: int, P: int, tok: list[float], wrk: list[float],
                  caps: tuple[float, float, float], rho: float | None) -> list[int] | None:
    """The first ``k`` parts of ``by_load`` that fit at the fewest part count ``k``, in plain Python (most documents
    fit there, most often in the first parts tried: a scan that stops at the ``k``-th part that fits beats a numpy
    table). The test is :func:`_fits`', written out for scalars (a test checks the two agree).

    Args:
        by_load: the parts, least loaded first. tok, wrk: every part's tokens and pairs (by part). The rest as
            :func:`_choose_parts`.

    Returns:
        The parts, or None.
    """
    cap_t, cap_w, mean_t = caps
    k = P if 2 * k0 > P else k0
    if k > min(P, L):
        return None
    t, x = L / k, w / k
    room = cap_t - split_share_max(L, k)  # a part's share may be a token or two above the mean L / k
    chosen = []
    for p in by_load:
        tp = tok[p]
        if tp > room:
            continue
        if rho is not None:
            wp = wrk[p] + x
            free = mean_t - tp - t
            if wp > cap_w or wp + rho * (free if free > 0.0 else 0.0) > cap_w:
                continue
        chosen.append(p)
        if len(chosen) == k:
            return chosen
    return None


def _choose_parts(by_load: np.ndarray, L: int, w: float, k0: int, P: int, tok: np.ndarray, wrk: np.ndarray,
                  caps: tuple[float, float, float], rho: float | None) -> list[int] | None:
    """The fewest least-loaded parts (more than the fewest count: :func:`_fewest_parts` tries that one) that can
    each take a 1/k share, or None. A document that needs most parts anyway goes to all of them (no idle part,
    best balance).

    Every part count is tested at once (:func:`_fits`, a ``[k, P]`` table: a scalar loop over counts and parts,
    up to P^2 tests per document, was the planner's hottest at P = 64 with a few dozen long documents).

    Args:
        by_load: ``[P]`` the parts, least loaded first. L, w: the document's tokens and pairs. k0: the fewest
            parts. P: parts. tok, wrk: ``[P]`` the tokens and pairs of the parts in ``by_load`` order.
            caps: ``(cap_t, cap_w, mean_t)``.
        rho: a share fits a part within the token cap and, unless None, within the work cap even once the
            part is filled up to the mean token count ``mean_t`` with the remaining documents' average work
            per token ``rho`` (0: the work cap alone).

    Returns:
        The parts (the first ``k`` of ``by_load`` that fit), or None.
    """
    k_first = P if 2 * k0 > P else k0
    ks = np.arange(k_first + 1, min(P, L) + 1, dtype=np.int64)  # [K] the part counts tried, fewest first
    if ks.size == 0:
        return None
    fits = _fits(ks, L, w, tok, wrk, caps, rho)  # [K, P]
    enough = np.flatnonzero(np.count_nonzero(fits, axis=1) >= ks)
    if enough.size == 0:
        return None
    i = int(enough[0])
    return by_load[fits[i]][:ks[i]].tolist()


def _fits(ks: np.ndarray, L: int, w: float, tok: np.ndarray, wrk: np.ndarray, caps: tuple[float, float, float],
          rho: float | None) -> np.ndarray:
    """Whether each part can take a ``1/k`` share of the document at each part count ``k``, in the float64
    operations of :func:`_fewest_parts`' scalar test.

    Args:
        ks: ``[K]`` part counts. L, w, tok, wrk, caps, rho: as :func:`_choose_parts`.

    Returns:
        ``[K, P]`` booleans.
    """
    cap_t, cap_w, mean_t = caps
    room = cap_t - -(-L // ks)  # [K] a share may be a token or two above L / k (split_share_max)
    fits = tok[None, :] <= room[:, None]  # [K, P]
    if rho is not None:
        wp = wrk[None, :] + (w / ks)[:, None]  # [K, P] a part's pairs with its share
        free = (mean_t - tok)[None, :] - (L / ks)[:, None]  # [K, P] its tokens below the mean after it
        fits &= (wp <= cap_w) & (wp + rho * np.maximum(free, 0.0) <= cap_w)
    return fits
