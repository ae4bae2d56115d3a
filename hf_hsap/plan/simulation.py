"""The rounds a plan runs, simulated: which order (``rounds="auto"``) and how long a layer takes with them. The fuller
model beside :func:`.cost.part_times`: the runtime's own steps (:mod:`.pipeline`) timed by dataflow, one layer per round
order (:func:`round_order_times`) or the chosen order over consecutive layers in steady state (:func:`simulated`)."""
from __future__ import annotations

import numpy as np

from .cost import CostModel
from .layout import Layout
from .pipeline import backward_steps, forward_steps, pipeline_shape, simulate_layers, simulate_steps
from .placement import Placement
from .rounds import RoundPieces, RoundTables, piece_remote_work, round_tables, split_rounds
from .transfers import Transfers
from .windows import Window, local_work_per_part, work_per_part

__all__ = ["RoundOrderTimes", "round_order_times", "round_order", "simulated", "simulated_time"]

ATTENTION_FWD, ATTENTION_BWD = 1 / 3.5, 2.5 / 3.5  # shares of a layer's attention work: backward 2.5x the forward
Simulated = tuple[float, RoundPieces, np.ndarray, tuple[RoundTables, np.ndarray, np.ndarray]]
RoundOrderTimes = dict[str, tuple[float, RoundPieces, np.ndarray]]  # what round_order_times returns


def round_order_times(layout: Layout, pl: Placement, tr: Transfers, cost: CostModel,
                      budget: int | None, window: Window = None) -> RoundOrderTimes:
    """``{order: (slowest part's time, pieces, [n_parts] every part's time)}``: a layer's attention (pairs) with ``tr``
    (of mask kind ``window``), forward and backward. A transfer costs half of ``kv_token_cost`` a token each way plus
    half of ``round_cost``; ``by_peer`` is skipped (``inf``) when ``batched`` already hides its transfers."""
    return {order: sim[:3] for order, sim in _orders(layout, pl, tr, cost, budget, window)[0].items()}


def _orders(layout: Layout, pl: Placement, tr: Transfers, cost: CostModel, budget: int | None,
            window: Window = None) -> tuple[dict[str, Simulated], np.ndarray]:
    """:func:`round_order_times` with each order's :func:`_round_times`, and ``[n_parts]`` local work."""
    local = local_work_per_part(layout, pl, window)
    f, b = ATTENTION_FWD, ATTENTION_BWD
    bound = float(work_per_part(layout, pl, window).max())  # no exposed transfer at all: nothing to pipeline
    out: dict[str, Simulated] = {}
    for order in ("batched", "by_peer"):
        if order == "by_peer" and out["batched"][0] <= 1.005 * bound:
            out[order] = (float("inf"), *out["batched"][1:])
            continue
        pieces = split_rounds(tr, pl.n_parts, budget, order)
        tab, xfer, ret = arrays = _round_times(layout, pl, pieces, cost, window)
        shape = pipeline_shape(pieces.n_rounds, budget is not None)
        t = (simulate_steps(forward_steps(shape), f * local, xfer, f * tab.remote_work, tab.peers)
             + simulate_steps(backward_steps(shape), b * local, xfer, b * tab.remote_work, tab.peers, ret))
        out[order] = (float(t.max()), pieces, t, arrays)
    return out, local


def _round_times(layout: Layout, pl: Placement, pieces: RoundPieces, cost: CostModel,
                 window: Window = None) -> tuple[RoundTables, np.ndarray, np.ndarray]:
    """The round tables of ``pieces`` and their ``[R, n]`` transfer and return times."""
    tab = round_tables(pieces, piece_remote_work(layout, pl, pieces, window), pl.n_parts)
    xfer = np.where(tab.recv > 0, (cost.kv_token_cost * tab.recv + cost.round_cost) / 2, 0.0)
    ret = np.where(tab.sent > 0, (cost.kv_token_cost * tab.sent + cost.round_cost) / 2, 0.0)
    return tab, xfer, ret


def round_order(times: RoundOrderTimes, rounds: str = "auto") -> str:
    """The round order (one rule): ``rounds``, or for ``"auto"`` ``by_peer`` if ``times`` prices it >= 1 % faster."""
    if rounds != "auto":
        return rounds
    return "by_peer" if times["by_peer"][0] < 0.99 * times["batched"][0] else "batched"


def simulated_time(layout: Layout, pl: Placement, tr: Transfers, cost: CostModel, budget: int | None = None,
                   rounds: str = "auto") -> float:
    """:func:`simulated`'s time alone."""
    return simulated(layout, pl, tr, cost, budget, rounds)[0]


def simulated(layout: Layout, pl: Placement, tr: Transfers, cost: CostModel, budget: int | None = None,
              rounds: str = "auto") -> tuple[float, RoundOrderTimes]:
    """The slowest part's time per full-attention layer (pairs), and the :func:`round_order_times` it picked from: the
    plan's rounds over consecutive layers in steady state (:func:`.pipeline.simulate_layers`), projections and MLP
    (``token_cost``) between the attentions, their ``qkv_share`` just before the forward and after the backward one.
    ``tr``: full-attention transfers; ``budget``: None for none. Leaves out ``diag_block`` and ``overlap``."""
    times, local = _orders(layout, pl, tr, cost, budget)
    _, pieces, _, (tab, xfer, ret) = times[round_order(times, rounds)]
    shape = pipeline_shape(pieces.n_rounds, budget is not None)
    gemm = cost.token_cost * pl.tokens_per_part().astype(np.float64)  # [n_parts] projections and MLP, fwd + bwd
    qkv = cost.qkv_share
    f, b = ATTENTION_FWD, ATTENTION_BWD
    fwd = simulate_layers(forward_steps(shape), f * local, xfer, f * tab.remote_work, tab.peers, None,
                          before=gemm * qkv / 3, after=gemm * (1 - qkv) / 3)
    bwd = simulate_layers(backward_steps(shape), b * local, xfer, b * tab.remote_work, tab.peers, ret,
                          before=gemm * (1 - qkv) * 2 / 3, after=gemm * qkv * 2 / 3)
    return float((fwd + bwd).max()), {order: sim[:3] for order, sim in times.items()}
