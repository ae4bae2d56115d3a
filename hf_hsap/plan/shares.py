"""Which parts take a document's equal shares in :mod:`.balanced`'s greedy pass: the fewest least-loaded parts
that can each hold a ``1/k`` share within the token cap and the work cap (:func:`choose`).

Speed: most documents fit one of their fewest part counts, most often in the first parts tried, so those counts are
tested by a plain Python scan that stops at the ``k``-th part that fits (:func:`_scan`); where they fail, every
larger count is tested at once in a numpy table (:func:`_table`, :func:`_fits`): a failing count costs a scan of
every part, and the scalar loop over all counts, up to P^2 tests per document, was most of the planning time at
P = 64 with a few dozen long documents. Both make the same float64 operations (a test checks they agree with a
scalar loop over every count).
"""
from __future__ import annotations

import numpy as np

__all__ = ["SCANNED_COUNTS", "cap_binds", "choose", "share_room", "split_share_max"]

SCANNED_COUNTS = 4  # choose() scans this many of the fewest part counts in Python before a numpy table of the rest


def split_share_max(L: int, k: int | np.ndarray) -> int | np.ndarray:
    """The most tokens one part holds of a ``k``-way dual-chunk split of ``L`` tokens (:func:`.balanced._chunk_sizes`:
    a pair's two chunks take ``2 * (L // 2k)`` tokens and at most ``ceil(rem / k)`` of the ``rem`` left over, so
    ``ceil(L / k)``): what the token cap is tested against, not the mean share ``L / k``.

    Args:
        L: the document's tokens. k: parts (an int, or an int array: one figure per count).

    Returns:
        ``ceil(L / k)``.
    """
    return -(-L // k)


def share_room(cap_t: float, L: int, k: int | np.ndarray) -> float | np.ndarray:
    """The most tokens a part may hold before taking one part of a ``k``-way split of ``L`` tokens within the token
    cap: ``cap_t - split_share_max(L, k)`` (the one room test of :func:`choose`, :func:`cap_binds` and
    :mod:`.density`'s heavy documents; exact: the cap's fraction survives subtracting an integer).

    Args:
        cap_t: the token cap. L: the document's tokens. k: parts (an int, or an int array).

    Returns:
        The room, per count.
    """
    return cap_t - split_share_max(L, k)


def choose(by_load: list[int], L: int, w: float, k0: int, P: int, tok: list[float], wrk: list[float],
           caps: tuple[float, float, float], rho: float) -> tuple[int, list[int]] | None:
    """The parts a document goes to: the fewest least-loaded parts (``k >= k0``) that can each take a ``1/k`` share
    within the work cap and the remaining documents' work (``rho``), else within the work cap alone, else at equal
    work shares (the token cap always); a document that needs most parts anyway goes to all of them (no idle part,
    best balance). Each of the three at the :data:`SCANNED_COUNTS` fewest counts first (:func:`_scan`), then at
    every larger one (:func:`_table`).

    Args:
        by_load: the parts, least loaded first. L, w: the document's tokens and pairs. k0: the fewest parts.
        P: parts. tok, wrk: every part's tokens and pairs. caps: ``(cap_t, cap_w, mean_t)``. rho: the remaining
            documents' average work per token (:func:`_fits`).

    Returns:
        ``(which of the three, the parts)``, or None.
    """
    k_first = _first_count(k0, P)
    k_last = min(P, L)
    k_table = k_first + SCANNED_COUNTS  # the counts from here on are tested in a table
    order = None  # by_load, and tok and wrk in its order, as [P] arrays once a table is needed
    for j, r in enumerate((rho, 0.0, None)):
        chosen = _scan(by_load, L, w, range(k_first, min(k_table, k_last + 1)), tok, wrk, caps, r)
        if chosen is None and k_table <= k_last:
            if order is None:
                order = np.asarray(by_load, dtype=np.int64)
                tok_o, wrk_o = np.asarray(tok)[order], np.asarray(wrk)[order]
            chosen = _table(order, L, w, np.arange(k_table, k_last + 1), tok_o, wrk_o, caps, r)
        if chosen is not None:
            return j, chosen
    return None


def cap_binds(L: int, k0: int, P: int, tok: list[float], cap_t: float) -> bool:
    """Whether the token cap ``cap_t`` can turn a part away at any count :func:`choose` tries for this document:
    when not (every part has room for the largest share, that of the fewest count), ``choose`` chooses alike at
    every cap from ``cap_t`` up (the cap enters nowhere else).

    Args:
        L: the document's tokens. k0: the fewest parts. P: parts. tok: every part's tokens. cap_t: the token cap.

    Returns:
        False when every part holds at most ``cap_t`` minus the share of the fewest count.
    """
    return max(tok) > share_room(cap_t, L, _first_count(k0, P))


def _first_count(k0: int, P: int) -> int:
    """The fewest part count :func:`choose` tries: ``k0``, or every part when more than half would take it."""
    return P if 2 * k0 > P else k0


def _scan(by_load: list[int], L: int, w: float, ks: range, tok: list[float], wrk: list[float],
          caps: tuple[float, float, float], rho: float | None) -> list[int] | None:
    """The first ``k`` parts of ``by_load`` that can each take a ``1/k`` share, at the fewest count ``k`` of ``ks``
    where there are that many, in plain Python (a scan that stops at the ``k``-th part that fits: most documents fit
    their fewest counts, most often in the first parts tried). The test is :func:`_fits`', written out for scalars
    (a test checks the two agree).

    Args:
        by_load: the parts, least loaded first. ks: the part counts, ascending. tok, wrk: every part's tokens and
            pairs (by part). L, w, caps, rho: as :func:`_fits`.

    Returns:
        The parts, or None.
    """
    cap_t, cap_w, mean_t = caps
    for k in ks:
        t, x = L / k, w / k
        room = share_room(cap_t, L, k)  # a part's share may be a token or two above the mean L / k
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


def _table(by_load: np.ndarray, L: int, w: float, ks: np.ndarray, tok: np.ndarray, wrk: np.ndarray,
           caps: tuple[float, float, float], rho: float | None) -> list[int] | None:
    """:func:`_scan` over many counts at once (:func:`_fits`, a ``[K, P]`` table: a failing count costs a scan
    of every part, and a document that fits none of its fewest counts often fails many).

    Args:
        by_load: ``[P]`` the parts, least loaded first. ks: ``[K]`` the part counts, ascending. tok, wrk:
            ``[P]`` the tokens and pairs of the parts in ``by_load`` order. L, w, caps, rho: as :func:`_fits`.

    Returns:
        The parts (the first ``k`` of ``by_load`` that fit), or None.
    """
    fits = _fits(ks, L, w, tok, wrk, caps, rho)  # [K, P]
    enough = np.flatnonzero(np.count_nonzero(fits, axis=1) >= ks)
    if enough.size == 0:
        return None
    i = int(enough[0])
    return by_load[fits[i]][:ks[i]].tolist()


def _fits(ks: np.ndarray, L: int, w: float, tok: np.ndarray, wrk: np.ndarray, caps: tuple[float, float, float],
          rho: float | None) -> np.ndarray:
    """Whether each part can take a ``1/k`` share of the document at each part count ``k``, in the float64
    operations of :func:`_scan`'s scalar test.

    Args:
        ks: ``[K]`` part counts. L, w: the document's tokens and pairs. tok, wrk: ``[P]`` every part's tokens and
            pairs. caps: ``(cap_t, cap_w, mean_t)``.
        rho: a share fits a part within the token cap and, unless None, within the work cap even once the
            part is filled up to the mean token count ``mean_t`` with the remaining documents' average work
            per token ``rho`` (0: the work cap alone).

    Returns:
        ``[K, P]`` booleans.
    """
    cap_t, cap_w, mean_t = caps
    room = share_room(cap_t, L, ks)  # [K] a share may be a token or two above L / k
    fits = tok[None, :] <= room[:, None]  # [K, P]
    if rho is not None:
        wp = wrk[None, :] + (w / ks)[:, None]  # [K, P] a part's pairs with its share
        free = (mean_t - tok)[None, :] - (L / ks)[:, None]  # [K, P] its tokens below the mean after it
        fits &= (wp <= cap_w) & (wp + rho * np.maximum(free, 0.0) <= cap_w)
    return fits
