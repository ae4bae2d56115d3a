"""Exposure-aware refinement: even out the parts' whole step time, transfers included.

Every greedy placement is refined (:mod:`.refine`) to even out ``work + token_cost * tokens`` (or the work
alone, for the token-neutral candidates): the load a part carries with no communication. The cost model adds
each part's *exposed transfer*, the KV it waits for beyond what its own keys' work hides
(``max(local, kv_token_cost * recv) - local``, :mod:`.cost`). Where documents are split over many parts
priced over fast links (large groups, one dominant document), that term differs by part: the holders of a
document's last rows receive nearly all of it, the holders of its first rows nearly nothing. The refinement
then leaves the parts with the most exposed transfer the slowest.

:func:`refine_exposure` takes the exposed transfer of every part as a fixed offset of its load and runs
the same boundary moves again (:func:`.refine.refine_moves`: exchanges at equal token counts and slides
within the token cap), so that a part that waits more holds less of the rest. A move changes a part's
received KV and own keys by at most the rows it moves, so the offsets are nearly constant (a second round
with the offsets re-read brought one more of the 1,408 sweep layouts within its goal, none on NVLink); the
result is kept when the one-layer cost model (:func:`.cost.part_times`) prices it faster. Plain Python
scalars and the numpy of :func:`.cost.part_times`: it runs on every batch, on ``auto``'s winner only.

:func:`evened_winner` is what ``auto`` weighs of it: a step of at least :data:`EXPOSURE_MIN_GAIN`; ``auto``
keeps it (after its search on small groups, against the winner's search) only where the rounds the plan
would run, simulated forward and backward over consecutive layers (:func:`.simulation.simulated_time`, the fuller
model), do not price it slower (:func:`simulation_agrees`). The one-layer model charges a transfer to the part
that receives it; the simulation also makes the part that *sent* keys wait in the backward until their dK/dV
come back, and a part wait for KV its senders post late. Holders of a long document's middle rows both receive
and send much: the refinement unloads them by their received KV, and the simulation can find them waiting for
returns instead. (The simulation runs consecutive layers in steady state: one layer that every part started at
once would charge every lag between parts to every layer and refuse most of the steps on large NVLink groups.) The
check simulates the new plan first and the plan so far only if the new one's time is not below the old one's floor
(:func:`.simulation.simulated_floor`, from the segments alone): the same answer, and on the planning benchmark's row
one simulation of a 64-part plan fewer.
"""
from __future__ import annotations

import logging

import numpy as np

from .cost import CostModel, part_times
from .simulation import RoundOrderTimes, simulated, simulated_floor
from .layout import Layout
from .placement import Placement, _finish
from .refine import array_boundaries, refine_moves
from .transfers import Transfers

logger = logging.getLogger(__name__)

EXPOSURE_SPREAD = 1e-3  # skipped when the offsets differ by less than this share of the slowest part's time
EXPOSURE_MIN_GAIN = 0.005  # evened_winner weighs the step only when it gains at least this share


def refine_exposure(layout: Layout, pl: Placement, cost: CostModel, token_cap: float) -> tuple[float, Placement]:
    """``pl`` with its split documents' boundaries moved so that the parts' estimated step times (one
    full-attention layer, :func:`.cost.part_times`) are even, transfers included (module docstring).

    Deterministic (every rank finds the same plan): at most ``4 P`` moves, never a clock.

    Args:
        layout: the documents. pl: the placement (any: its boundaries between parts inside a document move).
        cost: the cost model it is priced with. token_cap: no slide takes a part above this many tokens.

    Returns:
        ``(time of the slowest part, placement)``: the refined placement (named as ``pl``) when it is faster
        by the cost model, else ``pl`` itself and its time. Every part keeps at least one row of every
        segment it held, so a part never ends empty.
    """
    t = part_times(layout, pl, None, cost)  # [P]
    wrk = pl.work_per_part(layout).astype(np.float64)
    tok = pl.tokens_per_part().astype(np.float64)
    extra = t - (wrk + cost.token_cost * tok)  # [P] exposed transfer (and masked pairs): each part's offset
    if float(extra.max() - extra.min()) <= EXPOSURE_SPREAD * float(t.max()):
        return float(t.max()), pl  # even offsets: the candidate's own refinement evened out the same loads
    order = np.argsort(pl.start, kind="stable")  # every document's segments consecutive and in order
    arrays = [x[order] for x in (pl.doc, pl.start, pl.end, pl.part)]
    bounds = array_boundaries(*arrays)
    doc, start, end, part = (x.tolist() for x in arrays)
    moves, _ = refine_moves(layout.cu_seqlens[:-1].tolist(), doc, start, end, part, wrk.tolist(), 4 * pl.n_parts,
                            tok.tolist(), cost.token_cost, token_cap, bounds=bounds, extra=extra.tolist())
    if not moves:
        return float(t.max()), pl
    moved = _finish(pl.name, pl.n_parts, doc, start, end, part)  # the refinement moved start / end in place
    t_moved = float(part_times(layout, moved, None, cost).max())
    return (t_moved, moved) if t_moved < float(t.max()) else (float(t.max()), pl)


def evened_winner(layout: Layout, pl: Placement, t_pl: float, cost: CostModel, token_cap: float,
                  min_tokens: int) -> tuple[float, Placement] | None:
    """:func:`refine_exposure` of ``auto``'s winner where it is worth weighing: at least
    :data:`EXPOSURE_MIN_GAIN` faster by :func:`.cost.part_times` and every part keeps ``min_tokens`` (what
    ``auto`` then asks of the simulation: :func:`simulation_agrees`).

    Args:
        layout: the documents. pl: the winner. t_pl: its slowest part's time (one full-attention layer).
        cost: the plan's cost model. token_cap: as :func:`refine_exposure`. min_tokens: the fewest tokens a
            part may hold.

    Returns:
        ``(time of the slowest part, placement)``, or None to keep the winner.
    """
    t, moved = refine_exposure(layout, pl, cost, token_cap)
    if moved is pl or moved.tokens_per_part().min() < min_tokens or t > t_pl * (1 - EXPOSURE_MIN_GAIN):
        return None
    return t, moved


FLOOR_ROUNDING = 1e-9  # simulation_agrees skips a simulation only below its floor by more than float sums' rounding
Simulations = dict  # simulation_agrees' memo: id(placement) -> (placement, transfers, simulated time, order times)


def simulation_agrees(layout: Layout, first: tuple[Placement, Transfers], second: tuple[Placement, Transfers],
                      cost: CostModel, budget: int | None, rounds: str, sims: Simulations | None = None) -> bool:
    """Whether the rounds the plan would run, simulated forward and backward (:func:`.simulation.simulated_time`),
    price ``second`` no slower than ``first`` (module docstring: the one-layer model alone does not decide a
    step taken for its exposed-transfer term).

    Args:
        layout: the documents. first, second: ``(placement, full-attention transfers)`` each. cost: the plan's
            cost model. budget, rounds: the plan's receive budget and ``rounds`` option.
        sims: the times simulated so far for this layout, cost model, budget and rounds (updated): ``auto``'s
            steps weigh the same plan against several others (None: none kept).

    Returns:
        True when ``second`` is no slower.
    """
    t_second = _simulated(layout, second, cost, budget, rounds, sims)
    if _memo(first, sims) is None and t_second < simulated_floor(layout, first[0], cost) * (1 - FLOOR_ROUNDING):
        return True  # below what first's simulation could give: first is not simulated (the same answer)
    t_first = _simulated(layout, first, cost, budget, rounds, sims)
    if t_second > t_first:
        logger.debug("auto: kept %r: %r is faster by the one-layer model but slower with the rounds simulated "
                     "(%.6g against %.6g)", first[0].name, second[0].name, t_second, t_first)
    return t_second <= t_first


def _simulated(layout: Layout, plan: tuple[Placement, Transfers], cost: CostModel, budget: int | None, rounds: str,
               sims: Simulations | None) -> float:
    """:func:`.simulation.simulated_time` of ``plan``, or the time ``sims`` holds for the same placement and
    transfers (the same objects)."""
    held = _memo(plan, sims)
    if held is not None:
        return held
    t, orders = simulated(layout, plan[0], plan[1], cost, budget, rounds)
    if sims is not None:
        sims[id(plan[0])] = (plan[0], plan[1], t, orders)  # (objects kept: their ids stay theirs)
    return t


def _memo(plan: tuple[Placement, Transfers], sims: Simulations | None) -> float | None:
    """The simulated time ``sims`` holds for ``plan`` (the same placement and transfers objects), else None."""
    held = None if sims is None else sims.get(id(plan[0]))
    return held[2] if held is not None and held[0] is plan[0] and held[1] is plan[1] else None


def simulated_orders(sims: Simulations, pl: Placement, tr: Transfers) -> RoundOrderTimes | None:
    """The round orders' times (:func:`.simulation.round_order_times`) that ``sims`` holds for this placement and
    full-attention transfers (the same objects: simulated by one of ``auto``'s steps), else None.

    Args:
        sims: ``auto``'s memo. pl, tr: the plan's placement and full-attention transfers.

    Returns:
        ``{order: (slowest part's time, pieces, every part's time)}``, or None.
    """
    held = sims.get(id(pl))
    return held[3] if held is not None and held[0] is pl and held[1] is tr else None
