"""Which parts take a document's equal shares in :mod:`.balanced`'s greedy pass (:func:`choose`): the fewest
least-loaded parts that can each take a share within the caps, scanned in plain Python (it runs per batch)."""
from __future__ import annotations

import numpy as np

__all__ = ["choose", "share_room", "split_share_max"]


def split_share_max(L: int, k: int | np.ndarray) -> int | np.ndarray:
    """``ceil(L / k)``: the most tokens a part holds of a ``k``-way dual-chunk split of ``L`` tokens."""
    return -(-L // k)


def share_room(cap_t: float, L: int, k: int | np.ndarray) -> float | np.ndarray:
    """The most tokens a part may hold before taking a share of a ``k``-way split of ``L`` within the token cap."""
    return cap_t - split_share_max(L, k)


def choose(by_load: list[int], L: int, w: float, k0: int, *, n_parts: int, tok: list[float], wrk: list[float],
           caps: tuple[float, float, float], rho: float) -> tuple[int, list[int]] | None:
    """``(which test, the parts)`` a document of ``L`` tokens and ``w`` pairs goes to, or None: the fewest least-loaded
    parts (``k >= k0``; ``by_load``: least loaded first) that can each take a ``1/k`` share within the work cap and the
    remaining documents' work (``rho`` pairs per token), else the work cap alone, else at equal work shares (the token
    cap always; :func:`_scan`); a document needing most parts goes to all. ``tok``, ``wrk``: every part's figures
    (``n_parts`` of each)."""
    P = n_parts
    ks = range(P if 2 * k0 > P else k0, min(P, L) + 1)  # every part when more than half would take it
    for j, r in enumerate((rho, 0.0, None)):
        chosen = _scan(by_load, L, w, ks, tok=tok, wrk=wrk, caps=caps, rho=r)
        if chosen is not None:
            return j, chosen
    return None


def _scan(by_load: list[int], L: int, w: float, ks: range, *, tok: list[float], wrk: list[float],
          caps: tuple[float, float, float], rho: float | None) -> list[int] | None:
    """The first ``k`` parts of ``by_load`` that fit at the fewest ``k`` of ``ks`` that can: within the token cap and,
    unless ``rho`` is None, the work cap even once filled up to ``mean_t`` tokens at ``rho`` pairs per token."""
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
