"""The state of ``placement="auto"``'s search (:mod:`.auto`): what it plans for (:class:`Search`), a priced plan
(:class:`Option`), the one price (:meth:`Search.price`) and the one rule by which a proposal replaces the plan
(:meth:`Search.accepts`): faster by the one-layer model (:func:`.cost.step_time`) by more than :data:`MARGIN`, and,
on full attention, no slower with the plan's rounds simulated forward and backward (:func:`.simulation.simulated`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

import numpy as np

from .cost import CostModel, step_time
from .items import ItemWork, encoder_per_part, part_of_positions
from .layout import Layout
from .placement import Placement, token_cap
from .simulation import RoundOrderTimes, simulated
from .transfers import Transfers
from .windows import Window, window_transfers

__all__ = ["MARGIN", "Option", "Search"]

logger = logging.getLogger(__name__)

MARGIN = 1e-3  # a proposal must be faster than the plan by more than this share: a smaller gain is within the
# model's error, and a refinement may trade real work balance for it


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
        items: the vision items' encoder work (:mod:`.items`), or None. item_cost: a decoder token's price per
            layer (the cost model's ``token_cost`` before Ulysses' all-to-all share).
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
    items: ItemWork | None = None
    item_cost: float = 0.0

    @property
    def full(self) -> bool:
        """Whether every layer is full attention (the only kind the refinements and the simulation weigh)."""
        return all(w is None for w in self.layers)

    @property
    def cap(self) -> float:
        """The most tokens a part may hold."""
        return token_cap(self.layout.total_tokens, self.n_parts, self.token_slack)

    def encoder(self, pl: Placement) -> np.ndarray | None:
        """``[n_parts]`` encoder time per decoder layer (pairs) of the items each part of ``pl`` encodes, or None
        (no items: the text-only price, unchanged)."""
        if self.items is None:
            return None
        part_of = part_of_positions(pl.start, pl.end, pl.part, self.items.positions)
        return self.item_cost * encoder_per_part(self.items, part_of, pl.n_parts)

    def step_time(self, pl: Placement, tr: Mapping[Window, Transfers | None]) -> float:
        """The one price: :func:`.cost.step_time` of ``pl`` with its encoder work."""
        return step_time(self.layout, pl, tr, self.layers, self.cost, encoder=self.encoder(pl))

    def price(self, pl: Placement | None) -> Option | None:
        """``pl`` with its transfers and step time, or None (no placement, or a part below ``min_tokens``)."""
        if pl is None or pl.tokens_per_part().min() < self.min_tokens:
            return None
        tr = {w: window_transfers(pl, self.layout, w) for w in self.layers}
        return Option(pl, tr, self.step_time(pl, tr))

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
