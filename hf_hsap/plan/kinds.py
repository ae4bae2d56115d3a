"""What a plan holds per mask kind. Layers with different masks (sliding, full) share one token placement but need
different KV (a window only the keys it sees): the plan makes a :class:`KindPlan` per kind (``Plan.kind``)."""
from __future__ import annotations

from dataclasses import dataclass

from .cost import CostModel
from .simulation import RoundOrderTimes, round_order, round_order_times
from .layout import Layout
from .placement import Placement
from .rounds import RoundPieces, split_rounds
from .transfers import Transfers
from .windows import Window, window_transfers


@dataclass(frozen=True, eq=False)
class KindPlan:
    """The KV one mask kind moves under a placement."""

    window: Window  # the kind (None: full causal attention)
    transfers: Transfers  # the minimal transfers
    pieces: RoundPieces  # the transfers cut into rounds
    round_order: str  # "batched" or "by_peer"


def plan_kind(layout: Layout, pl: Placement, window: Window, cost: CostModel, budget: int | None, rounds: str, *,
              transfers: Transfers | None = None, order_times: RoundOrderTimes | None = None) -> KindPlan:
    """The :class:`KindPlan` of mask kind ``window``; ``rounds``: ``"auto"`` (:func:`.simulation.round_order`),
    ``"batched"`` or ``"by_peer"``; ``transfers``, ``order_times`` (:func:`round_order_times`): when already known."""
    tr = transfers if transfers is not None else window_transfers(pl, layout, window)
    if rounds == "auto":
        times = order_times if order_times is not None else round_order_times(layout, pl, tr, cost, budget, window)
        order = round_order(times)
        pieces = times[order][1]
    else:
        order, pieces = rounds, split_rounds(tr, pl.n_parts, budget, rounds)
    return KindPlan(window, tr, pieces, order)
