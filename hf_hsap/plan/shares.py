"""Which parts take a document's equal shares in :mod:`.balanced`'s greedy pass (:func:`choose`). The fewest counts
usually fit, so a Python scan tests them (:func:`_scan`), a numpy table the rest at once (:func:`_table`); both make the
same float64 operations (a test checks they agree)."""
from __future__ import annotations

import numpy as np

__all__ = ["SCANNED_COUNTS", "choose", "share_room", "split_share_max"]

SCANNED_COUNTS = 4  # choose() scans this many of the fewest part counts in Python before a numpy table of the rest


def split_share_max(L: int, k: int | np.ndarray) -> int | np.ndarray:
    """``ceil(L / k)``: the most tokens a part holds of a ``k``-way dual-chunk split of ``L`` tokens."""
    return -(-L // k)


def share_room(cap_t: float, L: int, k: int | np.ndarray) -> float | np.ndarray:
    """The most tokens a part may hold before taking a share of a ``k``-way split of ``L`` within the token cap."""
    return cap_t - split_share_max(L, k)


def choose(by_load: list[int], L: int, w: float, k0: int, P: int, tok: list[float], wrk: list[float],
           caps: tuple[float, float, float], rho: float) -> tuple[int, list[int]] | None:
    """``(which test, the parts)`` a document of ``L`` tokens and ``w`` pairs goes to, or None: the fewest least-loaded
    parts (``k >= k0``; ``by_load``: least loaded first) that can each take a ``1/k`` share within the work cap and the
    remaining documents' work (``rho`` pairs per token), else the work cap alone, else at equal work shares (the token
    cap always; :func:`_fits`); a document needing most parts goes to all. ``tok``, ``wrk``: every part's figures."""
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


def _first_count(k0: int, P: int) -> int:
    """The fewest part count :func:`choose` tries: ``k0``, or every part when more than half would take it."""
    return P if 2 * k0 > P else k0


def _scan(by_load: list[int], L: int, w: float, ks: range, tok: list[float], wrk: list[float],
          caps: tuple[float, float, float], rho: float | None) -> list[int] | None:
    """The first ``k`` parts of ``by_load`` that fit (:func:`_fits`, scalar) at the fewest ``k`` of ``ks`` that can."""
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
    """:func:`_scan` over ``[K]`` counts at once (``by_load``, ``tok``, ``wrk``: ``[P]``, in ``by_load`` order)."""
    fits = _fits(ks, L, w, tok, wrk, caps, rho)  # [K, P]
    enough = np.flatnonzero(np.count_nonzero(fits, axis=1) >= ks)
    if enough.size == 0:
        return None
    i = int(enough[0])
    return by_load[fits[i]][:ks[i]].tolist()


def _fits(ks: np.ndarray, L: int, w: float, tok: np.ndarray, wrk: np.ndarray, caps: tuple[float, float, float],
          rho: float | None) -> np.ndarray:
    """``[K, P]``: whether each part can take a ``1/k`` share at each count of ``ks``: within the token cap and, unless
    ``rho`` is None, the work cap even once filled up to ``mean_t`` tokens at ``rho`` pairs per token (``caps``)."""
    cap_t, cap_w, mean_t = caps
    room = share_room(cap_t, L, ks)  # [K] a share may be a token or two above L / k
    fits = tok[None, :] <= room[:, None]  # [K, P]
    if rho is not None:
        wp = wrk[None, :] + (w / ks)[:, None]  # [K, P] a part's pairs with its share
        free = (mean_t - tok)[None, :] - (L / ks)[:, None]  # [K, P] its tokens below the mean after it
        fits &= (wp <= cap_w) & (wp + rho * np.maximum(free, 0.0) <= cap_w)
    return fits
