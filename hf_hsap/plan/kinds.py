"""What a plan holds per mask kind: the transfers and round pieces of one kind over the shared placement.

Layers with different masks in one model (Gemma 3: five sliding layers to one global; GPT-OSS: alternating)
share one token placement (the tokens a rank holds cannot change between layers) but need different KV: a
window needs only the keys it can see. A :class:`KindPlan` is one kind's transfers and rounds; the plan
makes one per kind of the model it plans for, and any other kind on demand (:meth:`hf_hsap.Plan.kind`).
"""
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
    """The KV one mask kind moves under a placement.

    Attributes:
        window: the kind (``None``: full causal attention). transfers: the minimal transfers.
        pieces: the transfers cut into rounds. round_order: ``"batched"`` or ``"by_peer"``.
    """

    window: Window
    transfers: Transfers
    pieces: RoundPieces
    round_order: str


def plan_kind(layout: Layout, pl: Placement, window: Window, cost: CostModel, budget: int | None, rounds: str,
              transfers: Transfers | None = None, order_times: RoundOrderTimes | None = None) -> KindPlan:
    """The transfers and rounds of one mask kind.

    Args:
        layout, pl: the documents and placement. window: the kind. cost: the cost model (for ``"auto"``
            rounds). budget: the receive budget (None: none). rounds: ``"auto"``, ``"batched"`` or
            ``"by_peer"``: ``by_peer`` when ``cost`` predicts it at least 1% faster for the slowest part.
        transfers: the kind's transfers when already computed.
        order_times: :func:`.simulation.round_order_times` of these transfers when already simulated (``auto``'s
            checks simulate the plans they weigh).

    Returns:
        The :class:`KindPlan`.
    """
    tr = transfers if transfers is not None else window_transfers(pl, layout, window)
    if rounds == "auto":
        times = order_times if order_times is not None else round_order_times(layout, pl, tr, cost, budget, window)
        order = round_order(times)
        pieces = times[order][1]
    else:
        order, pieces = rounds, split_rounds(tr, pl.n_parts, budget, rounds)
    return KindPlan(window, tr, pieces, order)
