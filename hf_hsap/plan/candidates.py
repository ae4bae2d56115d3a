"""``auto``'s candidate placements, each priced by the cost model; the cheapest starts the search (:mod:`.auto`).

``balanced`` at small token slacks (each at most ``token_slack``) and at ``token_slack``, token-neutral and priced;
``density`` at the two largest slacks; ``contiguous``; ``zigzag`` (priced in closed form on full attention, built
only if it wins: its transfers grow as documents x parts squared); with windowed layers, contiguous cuts at equal
estimated cost. Small slacks pay because tokens cost every linear layer. With vision items (:mod:`.items`), every
greedy pass is also refined with each part's encoder work on its load, and every candidate is priced with it.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

from .balanced import balanced_greedy
from .cost import zigzag_part_times, zigzag_time_bound
from .density import density_greedy
from .greedy import Greedy
from .placement import Placement, contiguous, zigzag
from .search import Option, Search
from .windows import weighted_contiguous, window_transfers

__all__ = ["AUTO_TOKEN_SLACKS", "cheapest_candidate"]

AUTO_TOKEN_SLACKS = (0.01, 0.03)  # the balanced candidates' slacks (capped by token_slack; token_slack is added)
ZIGZAG_WINDOWED_SEGMENTS = 65536  # with windowed layers zigzag is priced by building it, up to this many segments


def cheapest_candidate(s: Search) -> Option:
    """Every candidate (module docstring), priced by :func:`.cost.step_time`; the cheapest (the first of equals).

    Args:
        s: the search.

    Returns:
        The winner's :class:`.search.Option`.
    """
    layout, n_parts, tc = s.layout, s.n_parts, s.cost.token_cost
    slacks = sorted({min(x, s.token_slack) for x in AUTO_TOKEN_SLACKS} | {s.token_slack})
    greedy = [(g, c) for g in (balanced_greedy(layout, n_parts, e) for e in slacks) for c in (tc, None)]
    greedy += [(density_greedy(layout, n_parts, tc, e), tc) for e in slacks[-2:]]
    cands: list[Callable[[], Placement]] = [functools.partial(g.placement, c) for g, c in greedy]
    if s.items is not None:  # the same passes refined with each part's encoder work on it
        cands += [functools.partial(_with_encoder, s, g, c) for g, c in greedy]
    cands.append(functools.partial(contiguous, layout, n_parts))
    if not s.full:  # contiguous cuts at equal estimated cost, within the small slacks' cap
        eps = min(AUTO_TOKEN_SLACKS[-1], s.token_slack)
        cap = int(math.ceil(layout.total_tokens / n_parts * (1 + eps)))
        cands.append(functools.partial(weighted_contiguous, layout, n_parts, s.layers, tc, cap, s.min_tokens))
    best = _cheapest(s, cands)
    return _zigzag_if_cheaper(s, best) or best


def _with_encoder(s: Search, g: Greedy, token_cost: float | None) -> Placement:
    """``g`` refined with the encoder work of the items each part encodes (in its plain refinement) added to the
    part's load, as :func:`.cost.step_time` adds it: the refinement moves decoder work off the parts that encode
    more (:mod:`.items`)."""
    plain = g.placement(token_cost)
    return g.placement(token_cost, extra=s.encoder(plain).tolist())


def _cheapest(s: Search, cands: list[Callable[[], Placement]]) -> Option:
    """The cheapest candidate (the first of equals). Full layers are priced from the segments
    (:func:`.cost.part_times`), only the winner's transfers built; a candidate that leaves a part below
    ``s.min_tokens`` tokens is dropped."""
    best, out = math.inf, None
    built: list[Placement] = []
    for build in cands:
        pl = build()
        if any(pl is b for b in built):  # one pass refined alike two ways: priced once, the first wins ties
            continue
        built.append(pl)
        if pl.tokens_per_part().min() < s.min_tokens:
            continue
        tr = {w: None if w is None else window_transfers(pl, s.layout, w) for w in s.layers}
        t = s.step_time(pl, tr)
        if t < best:
            best, out = t, (pl, tr)
    assert out is not None, "contiguous leaves every part a token when T >= P"
    pl, tr = out
    return Option(pl, {w: window_transfers(pl, s.layout, w) if x is None else x for w, x in tr.items()}, best)


def _zigzag_if_cheaper(s: Search, best: Option) -> Option | None:
    """``zigzag`` priced, if its step time is below ``best``'s, else None. Built only past its closed-form price
    (full attention), or when small enough to price by building (windowed layers)."""
    layout, n_parts, cost = s.layout, s.n_parts, s.cost
    bound = sum(n * (zigzag_time_bound(layout, n_parts, cost) if w is None  # cheap, before the closed form
                     else cost.token_cost * math.floor(layout.total_tokens / n_parts)) for w, n in s.layers.items())
    if bound >= best.time or (s.full and s.layers[None] * float(zigzag_part_times(layout, n_parts, cost).max())
                              >= best.time):
        return None
    if not s.full and 2 * n_parts * layout.n_docs > ZIGZAG_WINDOWED_SEGMENTS:
        return None
    pl = zigzag(layout, n_parts)
    tr = {w: window_transfers(pl, layout, w) for w in s.layers}
    t = s.step_time(pl, tr)  # with a hybrid's recurrent layers and the encoder, beyond the closed form
    return Option(pl, tr, t) if t < best.time and pl.tokens_per_part().min() >= s.min_tokens else None
