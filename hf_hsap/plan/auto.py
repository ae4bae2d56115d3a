"""``placement="auto"`` as one search: candidate placements, refinements of the best, one price, one rule (the
search's state, its price and its rule: :mod:`.search`).

1. Every candidate the planner builds (:mod:`.candidates`) is priced by :meth:`.search.Search.price`; the cheapest wins.
2. Each refinement of :data:`REFINEMENTS` proposes a placement from the plan so far: the bounded local search
   (:func:`.local_search.polish`, small groups), contiguous cuts priced with their transfers (:mod:`.cutting`) and
   sliced cuts (:mod:`.slicing`). A proposal replaces the plan only under :meth:`.search.Search.accepts`: faster by the
   one-layer model (:func:`.cost.step_time`) by more than :data:`.search.MARGIN`, and, on full attention, no slower with
   the plan's rounds simulated forward and backward (:func:`.simulation.simulated`).

So ``auto`` is never slower than any simpler placement by the cost model (with windowed layers, zigzag is weighed up
to a size: :mod:`.candidates`), and no refinement makes a plan slower by either model. The refinements are those
the placement sweep justifies (BENCHMARKS.md, ``benchmarks/analytic/sweep.py``); windowed plans are priced per mask kind and
take no refinement.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable

from .candidates import cheapest_candidate
from .cost import balance_bound
from .cutting import priced_cuts
from .local_search import polish
from .placement import Placement
from .search import Option, Search
from .slicing import sliced_cuts

__all__ = ["POLISH_MAX_PARTS", "POLISH_MAX_SEGMENTS", "REFINEMENTS", "SLICED_MIN_EXCESS", "auto"]

logger = logging.getLogger(__name__)

POLISH_MAX_PARTS = 16  # the local search runs on groups of at most this many parts
POLISH_MAX_SEGMENTS = 512  # ... from a plan of at most this many segments (it reads every part's)
SLICED_MIN_EXCESS = 0.01  # sliced cuts are tried only on plans this far above the compute bound


def _polished(s: Search, current: Option) -> Placement | None:
    """The bounded local search (:func:`.local_search.polish`) from the plan, on groups small enough to search."""
    pl = current.placement
    if s.n_parts > POLISH_MAX_PARTS or pl.doc.size > POLISH_MAX_SEGMENTS:
        return None
    moved = polish(s.layout, s.n_parts, s.cost, pl, token_slack=s.token_slack)[1]
    return dataclasses.replace(moved, name=pl.name if pl.name.endswith("+polish") else f"{pl.name}+polish")


def _priced_cuts(s: Search, current: Option) -> Placement | None:
    """Contiguous cuts priced with their transfers, below the plan's time (:func:`.cutting.priced_cuts`)."""
    return priced_cuts(s.layout, s.n_parts, s.cost, s.cap, current.time / s.layers[None], s.min_tokens)


def _sliced_cuts(s: Search, current: Option) -> Placement | None:
    """Sliced cuts (:func:`.slicing.sliced_cuts`) where the plan is well above the compute bound."""
    one = current.time / s.layers[None]
    if one < (1 + SLICED_MIN_EXCESS) * balance_bound(s.layout, s.n_parts, s.cost):
        return None
    return sliced_cuts(s.layout, s.n_parts, s.cost, s.cap, one, s.min_tokens)


REFINEMENTS: tuple[Callable[[Search, Option], Placement | None], ...] = (_polished, _priced_cuts, _sliced_cuts)


def auto(s: Search) -> Option:
    """``placement="auto"``: the cheapest candidate, then every refinement the rule accepts (module docstring).

    Args:
        s: the search (its ``sims`` memo is updated: the caller reads the final plan's round orders).

    Returns:
        The plan's :class:`Option`.
    """
    current = cheapest_candidate(s)
    if not s.full:
        return current
    for refine in REFINEMENTS:
        found = s.price(refine(s, current))
        if found is not None and s.accepts(current, found):
            logger.debug("auto: %r replaces %r (%.6g against %.6g)", found.placement.name, current.placement.name,
                         found.time, current.time)
            current = found
    return current
