"""``placement="auto"`` as one search: candidate placements, refinements of the best, one price, one rule.

1. Every candidate the planner builds (:mod:`.candidates`) is priced by :meth:`Search.price`; the cheapest wins.
2. Each refinement of :data:`REFINEMENTS` proposes a placement from the plan so far: the bounded local search
   (:func:`.oracle.polish`, small groups), contiguous cuts priced with their transfers (:mod:`.cutting`) and
   sliced cuts (:mod:`.slicing`). A proposal replaces the plan only under :meth:`Search.accepts`: faster by the
   one-layer model (:func:`.cost.step_time`) by more than :data:`MARGIN`, and, on full attention, no slower with
   the plan's rounds simulated forward and backward (:func:`.simulation.simulated`).

So ``auto`` is never slower than any simpler placement by the cost model (with windowed layers, zigzag is weighed up
to a size: :mod:`.candidates`), and no refinement makes a plan slower by either model. The refinements are those the placement sweep justifies (BENCHMARKS.md, ``benchmarks/analytic/sweep.py``);
windowed plans are priced per mask kind and take no refinement.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple

from .cost import CostModel, balance_bound, step_time
from .cutting import priced_cuts
from .layout import Layout
from .oracle import polish
from .placement import Placement, token_cap
from .simulation import RoundOrderTimes, simulated
from .slicing import sliced_cuts
from .transfers import Transfers
from .windows import Window, window_transfers

__all__ = ["MARGIN", "Option", "REFINEMENTS", "Search", "auto"]

logger = logging.getLogger(__name__)

MARGIN = 1e-3  # a proposal must be faster than the plan by more than this share: a smaller gain is within the
# model's error, and a refinement may trade real work balance for it
POLISH_MAX_PARTS = 16  # the local search runs on groups of at most this many parts
POLISH_MAX_SEGMENTS = 512  # ... from a plan of at most this many segments (it reads every part's)
SLICED_MIN_EXCESS = 0.01  # sliced cuts are tried only on plans this far above the compute bound


class Option(NamedTuple):
    """A priced plan: its placement, its transfers of every mask kind and its step time (in pairs)."""

    placement: Placement
    transfers: dict[Window, Transfers]
    time: float


@dataclass
class Search:
    """What one ``auto`` search plans for, and the simulations it has run (memo by placement object).

    Args:
        layout: the documents. n_parts: parts P. cost: the cost model (all-to-all share included).
        token_slack: the token cap's slack. min_tokens: the fewest tokens a part may hold.
        layers: layers per mask kind. budget, rounds: the plan's receive budget and rounds option (what the
            simulation runs).
    """

    layout: Layout
    n_parts: int
    cost: CostModel
    token_slack: float
    min_tokens: int = 1
    layers: Mapping[Window, int] = field(default_factory=lambda: {None: 1})
    budget: int | None = None
    rounds: str = "auto"
    sims: dict[int, tuple[Placement, Transfers, float, RoundOrderTimes]] = field(default_factory=dict)

    @property
    def full(self) -> bool:
        """Whether every layer is full attention (the only kind the refinements and the simulation weigh)."""
        return all(w is None for w in self.layers)

    @property
    def cap(self) -> float:
        """The most tokens a part may hold."""
        return token_cap(self.layout.total_tokens, self.n_parts, self.token_slack)

    def price(self, pl: Placement | None) -> Option | None:
        """``pl`` with its transfers and step time, or None (no placement, or a part below ``min_tokens``)."""
        if pl is None or pl.tokens_per_part().min() < self.min_tokens:
            return None
        tr = {w: window_transfers(pl, self.layout, w) for w in self.layers}
        return Option(pl, tr, step_time(self.layout, pl, tr, self.layers, self.cost))

    def accepts(self, current: Option, found: Option) -> bool:
        """The one rule by which a proposal replaces the plan (module docstring); each plan is simulated once."""
        if found.time >= current.time * (1 - MARGIN):
            return False
        if not self.full:
            return True
        t_found, t_current = self._simulated(found), self._simulated(current)
        if t_found > t_current:
            logger.debug("auto: kept %r: %r is faster by the one-layer model but slower with the rounds simulated "
                         "(%.6g against %.6g)", current.placement.name, found.placement.name, t_found, t_current)
        return t_found <= t_current

    def orders(self, pl: Placement, tr: Transfers) -> RoundOrderTimes | None:
        """The round orders' times the search simulated for this placement and full transfers, else None."""
        held = self._held(pl, tr)
        return None if held is None else held[1]

    def _held(self, pl: Placement, tr: Transfers) -> tuple[float, RoundOrderTimes] | None:
        """``(simulated time, round orders' times)`` of these very objects, if the search simulated them."""
        held = self.sims.get(id(pl))
        return held[2:] if held is not None and held[0] is pl and held[1] is tr else None

    def _simulated(self, opt: Option) -> float:
        held = self._held(opt.placement, opt.transfers[None])
        if held is not None:
            return held[0]
        t, orders = simulated(self.layout, opt.placement, opt.transfers[None], self.cost, self.budget, self.rounds)
        self.sims[id(opt.placement)] = (opt.placement, opt.transfers[None], t, orders)  # objects kept: ids stay
        return t


def _polished(s: Search, current: Option) -> Placement | None:
    """The bounded local search (:func:`.oracle.polish`) from the plan, on groups small enough to search."""
    pl = current.placement
    if s.n_parts > POLISH_MAX_PARTS or pl.doc.size > POLISH_MAX_SEGMENTS:
        return None
    moved = polish(s.layout, s.n_parts, s.cost, pl, s.token_slack)[1]
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
    from .candidates import cheapest_candidate

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
