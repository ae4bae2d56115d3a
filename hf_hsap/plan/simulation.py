"""The rounds a plan runs, simulated: which order (``rounds="auto"``) and how long a layer takes with them.

The fuller model beside :func:`.cost.part_times`' one-layer formula: the runtime's own steps
(:mod:`hf_hsap.plan.pipeline`) timed by dataflow. :func:`round_order_times` runs one layer that every part starts
at once, for each round order (what :func:`round_order`, the one rule, picks from); :func:`simulated_time` runs
the chosen order over consecutive layers in steady state (what ``auto`` checks its one-layer steps against).
"""
from __future__ import annotations


import numpy as np

from .cost import CostModel, part_recv
from .layout import Layout
from .pipeline import backward_steps, forward_steps, pipeline_shape, simulate_layers, simulate_steps
from .placement import Placement
from .rounds import RoundPieces, RoundTables, piece_remote_work, round_tables, split_rounds
from .transfers import Transfers
from .windows import Window, local_work_per_part, work_per_part

__all__ = ["RoundOrderTimes", "round_order_times", "round_order", "simulated", "simulated_floor", "simulated_time"]


ATTENTION_FWD, ATTENTION_BWD = 1 / 3.5, 2.5 / 3.5  # shares of a layer's attention work: backward 2.5x the forward
Simulated = tuple[float, RoundPieces, np.ndarray, tuple[RoundTables, np.ndarray, np.ndarray]]
RoundOrderTimes = dict[str, tuple[float, RoundPieces, np.ndarray]]  # what round_order_times returns


def round_order_times(layout: Layout, pl: Placement, tr: Transfers, cost: CostModel,
                      budget: int | None, window: Window = None) -> RoundOrderTimes:
    """Estimated attention time (forward + backward, pairs) of the slowest part, the pieces, and every
    part's time, for each round order.

    Simulates the runtime's own steps (:mod:`hf_hsap.plan.pipeline`: :func:`pipeline_shape`,
    :func:`forward_steps`, :func:`backward_steps`, :func:`simulate_steps`): work split 1 : 2.5 between
    forward and backward, each transfer half of ``kv_token_cost`` per token (KV forward, dK/dV back)
    plus half of ``round_cost`` per round. ``by_peer`` is not simulated (``inf``, and the batched parts'
    times) when ``batched`` already hides its transfers within 0.5%. ``window``: the mask kind the transfers
    are of.

    Returns:
        ``{order: (slowest part's time, pieces, [n_parts] every part's time)}`` for ``"batched"`` and ``"by_peer"``.
    """
    return {order: sim[:3] for order, sim in _orders(layout, pl, tr, cost, budget, window)[0].items()}


def _orders(layout: Layout, pl: Placement, tr: Transfers, cost: CostModel, budget: int | None,
            window: Window = None) -> tuple[dict[str, Simulated], np.ndarray]:
    """:func:`round_order_times` with each order's round tables and transfer and return times
    (:func:`_round_times`, what :func:`simulated_time` runs again over layers), and ``[n_parts]`` local work."""
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
    """The round tables of ``pieces`` and their ``[R, n]`` transfer and return times: half of ``kv_token_cost``
    per token each way plus half of ``round_cost`` per round."""
    tab = round_tables(pieces, piece_remote_work(layout, pl, pieces, window), pl.n_parts)
    xfer = np.where(tab.recv > 0, (cost.kv_token_cost * tab.recv + cost.round_cost) / 2, 0.0)
    ret = np.where(tab.sent > 0, (cost.kv_token_cost * tab.sent + cost.round_cost) / 2, 0.0)
    return tab, xfer, ret


def round_order(times: RoundOrderTimes, rounds: str = "auto") -> str:
    """The round order a plan runs (the one rule): ``rounds`` itself unless ``"auto"``, which takes ``by_peer``
    when :func:`round_order_times` prices its slowest part at least 1 % faster than ``batched``'s.

    Args:
        times: :func:`round_order_times`' result. rounds: ``"auto"``, ``"batched"`` or ``"by_peer"``.

    Returns:
        ``"batched"`` or ``"by_peer"``.
    """
    if rounds != "auto":
        return rounds
    return "by_peer" if times["by_peer"][0] < 0.99 * times["batched"][0] else "batched"


def simulated_time(layout: Layout, pl: Placement, tr: Transfers, cost: CostModel, budget: int | None = None,
                   rounds: str = "auto") -> float:
    """:func:`simulated`'s time alone (the docstring there)."""
    return simulated(layout, pl, tr, cost, budget, rounds)[0]


def simulated(layout: Layout, pl: Placement, tr: Transfers, cost: CostModel, budget: int | None = None,
              rounds: str = "auto") -> tuple[float, RoundOrderTimes]:
    """The slowest part's time per full-attention layer of a deep model, with the rounds the plan would run (the
    order :func:`round_order` picks) simulated forward and backward over consecutive layers in steady state
    (:func:`.pipeline.simulate_layers`: a part starts a layer when its own previous one is done, not when every
    part is, so another part's lag costs a wait only where the transfers make it one). A part's projections and
    MLP (``token_cost`` per token, a third forward, two thirds backward) run between its attentions, the q, k, v
    projections' share (``qkv_share``) before the forward attention and after the backward one. What ``auto``
    checks a step of its one-layer model (:func:`part_times`) against. It counts neither ``diag_block``'s masked
    pairs nor ``overlap`` below 1 (its transfers overlap the work they can).

    Args:
        layout, pl, tr: the documents, the placement and its full-attention transfers. cost: the cost model.
        budget: the receive budget (None: none). rounds: the plan's ``rounds`` option.

    Returns:
        ``(the time, in attention pairs; the round orders' times it chose from)``: the latter is
        :func:`round_order_times` of the plan (what :func:`.kinds.plan_kind` reads, so that ``auto``'s final plan is
        not simulated again).
    """
    times, local = _orders(layout, pl, tr, cost, budget)
    _, pieces, _, (tab, xfer, ret) = times[round_order(times, rounds)]
    shape = pipeline_shape(pieces.n_rounds, budget is not None)
    gemm = cost.token_cost * pl.tokens_per_part().astype(np.float64)  # [n_parts] projections and MLP, fwd + bwd
    qkv = cost.qkv_share
    f, b = ATTENTION_FWD, ATTENTION_BWD
    fwd = simulate_layers(forward_steps(shape), f * local, xfer, f * tab.remote_work, tab.peers, None,
                          gemm * qkv / 3, gemm * (1 - qkv) / 3)
    bwd = simulate_layers(backward_steps(shape), b * local, xfer, b * tab.remote_work, tab.peers, ret,
                          gemm * (1 - qkv) * 2 / 3, gemm * qkv * 2 / 3)
    return float((fwd + bwd).max()), {order: sim[:3] for order, sim in times.items()}


def simulated_floor(layout: Layout, pl: Placement, cost: CostModel) -> float:
    """A lower bound of :func:`simulated_time` of ``pl`` (full attention) at any receive budget and round order,
    from its segments alone (no rounds built, nothing simulated): what lets ``auto`` skip a simulation whose result
    cannot change a decision (:func:`.exposure.simulation_agrees`).

    In a layer a part computes its projections and MLP (``token_cost`` per token, forward and backward) and its
    pairs (split :data:`ATTENTION_FWD` : :data:`ATTENTION_BWD`); waits only add to its clock. In the forward its
    fetches run one after another on its link (:func:`.pipeline.simulate_steps`), after its q, k, v projections,
    and its last one must land before the forward's end: half of ``kv_token_cost`` per received token (each round's
    ``round_cost`` only adds). So a part's layer takes at least ``gemm + ATTENTION_BWD * pairs +
    max(ATTENTION_FWD * pairs, kv_token_cost * recv / 2)``.

    Args:
        layout: the documents. pl: the placement. cost: the cost model.

    Returns:
        The largest part's bound, in attention pairs.
    """
    pairs = pl.work_per_part(layout).astype(np.float64)  # [n_parts]
    gemm = cost.token_cost * pl.tokens_per_part().astype(np.float64)
    fetch = cost.kv_token_cost * part_recv(layout, pl) / 2
    return float((gemm + ATTENTION_BWD * pairs + np.maximum(ATTENTION_FWD * pairs, fetch)).max())
