"""``placement="auto"``'s polish of its winner: what runs after the cheapest candidate is known.

Three steps, each kept only when it makes the plan faster (the name becomes ``"<start>+polish"``):

* :func:`polished`: a bounded local search (:func:`.oracle.polish`) on groups small enough to search within
  the planning budget;
* :func:`exposure_evened`: the winner's exposed transfers evened out first (:mod:`.exposure`), then searched
  alike; kept against :func:`polished`'s result only where the one-layer model prices it faster *and* the
  plan's rounds, simulated forward and backward, do not price it slower;
* :func:`searched_from_others`: the same search from :data:`OTHER_STARTS` (``density``, ``contiguous``) on the
  same small groups, each result kept under the same two conditions against the plan so far.

Full attention only (a windowed plan is priced per kind; no step runs).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Mapping

import numpy as np

from .cost import CostModel, balance_bound
from .density import density
from .exposure import Simulations, evened_winner, simulation_agrees
from .layout import Layout
from .oracle import polish
from .placement import Placement, contiguous, token_cap
from .transfers import Transfers
from .windows import Window, window_transfers

__all__ = ["OTHER_STARTS", "POLISH_MAX_PARTS", "POLISH_MAX_SEGMENTS", "exposure_evened", "polished",
           "searched_from_others"]

logger = logging.getLogger(__name__)

POLISH_MAX_PARTS = 16  # auto searches (oracle.polish) on groups of at most this many parts
POLISH_MAX_SEGMENTS = 512  # ... from a placement of at most this many segments (the search reads each part's)
FASTER_MARGIN = 1e-9  # a polished placement replaces the one it came from only when faster by more than this share
# searched_from_others' starts, in order: on the sweep's network rows of at most 8 parts these two brought auto
# within 2 % of the offline optimiser on 95.0 % of them (92.5 % without); adding balanced reached 95.2 % at
# 1.8x the search time (BENCHMARKS.md, the placement sweep)
OTHER_STARTS = ("density", "contiguous")
OTHER_STARTS_MIN_GAP = 0.01  # ... searched only when the plan is above the compute bound by more than this share


def polished(layout: Layout, n_parts: int, cost: CostModel, token_slack: float, min_tokens: int,
              layers: Mapping[Window, int], pl: Placement, tr: dict[Window, Transfers],
              best: float) -> tuple[Placement, dict[Window, Transfers], float]:
    """``auto``'s winner after a bounded local search (:func:`.oracle.polish`: the offline optimiser's moves,
    deterministic) when it is small enough to search within the planning budget: full attention only, at most
    :data:`POLISH_MAX_PARTS` parts and :data:`POLISH_MAX_SEGMENTS` segments. Kept only when the cost model
    prices it faster (name ``"<winner>+polish"``); never slower than the winner, so never slower than any
    candidate. The searches from ``contiguous`` and ``density`` (:func:`searched_from_others`) are kept only where
    the rounds simulated agree: on every sweep layout they reached the oracle, but partly by trading work balance
    for KV that the fuller model (forward and backward rounds simulated, :func:`.simulation.simulated_time`) prices up
    to 20 % slower, so far from the candidates the one-layer objective alone is not trusted. Returns
    ``(placement, transfers of every kind, step time)``."""
    if any(w is not None for w in layers) or n_parts > POLISH_MAX_PARTS or pl.doc.size > POLISH_MAX_SEGMENTS:
        return pl, tr, best
    t, moved = polish(layout, n_parts, cost, pl, token_slack)
    t *= sum(layers.values())
    if t >= best * (1 - FASTER_MARGIN) or moved.tokens_per_part().min() < min_tokens:
        return pl, tr, best
    moved = dataclasses.replace(moved, name=pl.name if pl.name.endswith("+polish") else f"{pl.name}+polish")
    logger.debug("auto: polished %r from %.6g to %.6g (estimated step time)", pl.name, best, t)
    return moved, {None: window_transfers(moved, layout, None)}, t


def exposure_evened(layout: Layout, n_parts: int, cost: CostModel, token_slack: float, min_tokens: int,
                    layers: Mapping[Window, int], pl: Placement, best: float,
                    plain: tuple[Placement, dict[Window, Transfers], float], budget: int | None,
                    rounds: str, sims: Simulations | None = None) -> tuple[Placement, dict[Window, Transfers], float]:
    """``plain`` (the winner ``pl`` as :func:`polished` left it), or the winner with its exposed transfers evened
    out first (:func:`.exposure.evened_winner`, within the ``token_slack`` cap, named ``"<winner>+polish"``) and
    then polished alike, when that ends faster by the one-layer model and the plan's rounds simulated
    (:func:`.exposure.simulation_agrees`) do not price it slower: never slower than ``plain`` by either. Full
    attention only.

    Args:
        layout, n_parts, cost, token_slack, min_tokens, layers: as ``planner._auto``. pl: the winner. best: its
            step time. plain: ``(placement, transfers, step time)`` of the winner polished. budget, rounds: the
            plan's receive budget and rounds option. sims: the simulated times so far (``auto``'s memo, updated;
            :func:`.exposure.simulation_agrees`).

    Returns:
        ``(placement, transfers of every kind, step time)``.
    """
    if any(w is not None for w in layers):
        return plain
    n = sum(layers.values())
    found = evened_winner(layout, pl, best / n, cost, token_cap(layout.total_tokens, n_parts, token_slack), min_tokens)
    if found is None:
        return plain
    t, moved = found
    moved = dataclasses.replace(moved, name=f"{pl.name}+polish")
    evened = polished(layout, n_parts, cost, token_slack, min_tokens, layers, moved,
                      {None: window_transfers(moved, layout, None)}, n * t)
    if not _replaces(layout, plain, evened, cost, budget, rounds, sims):
        return plain
    logger.debug("auto: evened out %r's exposed transfers: %.6g against %.6g (estimated step time)", pl.name,
                 evened[2], plain[2])
    return evened


def searched_from_others(layout: Layout, n_parts: int, cost: CostModel, token_slack: float, min_tokens: int,
                         layers: Mapping[Window, int], winner: Placement,
                         current: tuple[Placement, dict[Window, Transfers], float], budget: int | None,
                         rounds: str, sims: Simulations | None = None
                         ) -> tuple[Placement, dict[Window, Transfers], float]:
    """``current`` (the plan so far), or the bounded search (:func:`.oracle.polish`) from another start of
    :data:`OTHER_STARTS` when that ends faster by the one-layer model and the plan's rounds simulated
    (:func:`.exposure.simulation_agrees`) do not price it slower; the starts in turn, each against the plan so
    far: never slower than ``current`` by either model. The search from the winner alone stops in the winner's
    basin; on small groups the offline optimiser's better optima come from these starts (module docstring).
    The same bounds as :func:`polished`: full attention, at most :data:`POLISH_MAX_PARTS` parts, a start of at
    most :data:`POLISH_MAX_SEGMENTS` segments; a start equal to the winner is not searched again, and none is
    searched where the plan is within :data:`OTHER_STARTS_MIN_GAP` of the compute bound
    (:func:`.cost.balance_bound`: no placement is faster than it).

    Args:
        layout, n_parts, cost, token_slack, min_tokens, layers: as ``planner._auto``. winner: the cheapest
            candidate before any polish. current: ``(placement, transfers of every kind, step time)`` so far.
        budget, rounds: the plan's receive budget and rounds option. sims: as :func:`exposure_evened`.

    Returns:
        ``(placement, transfers of every kind, step time)``; a start's result is named ``"<start>+polish"``.
    """
    if any(w is not None for w in layers) or n_parts > POLISH_MAX_PARTS or layout.n_docs > POLISH_MAX_SEGMENTS:
        return current  # every placement holds a segment of every document: no start is small enough to build
    n = sum(layers.values())
    if current[2] <= n * balance_bound(layout, n_parts, cost) * (1 + OTHER_STARTS_MIN_GAP):
        return current  # no placement is that much faster
    for name in OTHER_STARTS:
        start = (density(layout, n_parts, cost.token_cost, token_slack) if name == "density"
                 else contiguous(layout, n_parts))
        if start.doc.size > POLISH_MAX_SEGMENTS or _same_segments(start, winner):
            continue
        t, moved = polish(layout, n_parts, cost, start, token_slack)
        if moved.tokens_per_part().min() < min_tokens:
            continue
        moved = dataclasses.replace(moved, name=f"{name}+polish")
        found = (moved, {None: window_transfers(moved, layout, None)}, n * t)
        if _replaces(layout, current, found, cost, budget, rounds, sims):
            logger.debug("auto: searched from %r: %.6g against %.6g (estimated step time)", name, n * t, current[2])
            current = found
    return current


def _replaces(layout: Layout, current: tuple[Placement, dict[Window, Transfers], float],
              found: tuple[Placement, dict[Window, Transfers], float], cost: CostModel, budget: int | None,
              rounds: str, sims: Simulations | None = None) -> bool:
    """The one rule by which a searched plan replaces the plan so far (:func:`exposure_evened`,
    :func:`searched_from_others`): faster by the one-layer model (step times, by more than :data:`FASTER_MARGIN`)
    and no slower with the plan's rounds simulated (:func:`.exposure.simulation_agrees`, run only when the first
    holds). ``current``, ``found``: ``(placement, transfers of every kind, step time)`` of full-attention plans;
    ``sims``: the simulated times so far (updated)."""
    return found[2] < current[2] * (1 - FASTER_MARGIN) and simulation_agrees(
        layout, (current[0], current[1][None]), (found[0], found[1][None]), cost, budget, rounds, sims)


def _same_segments(a: Placement, b: Placement) -> bool:
    """Whether two placements hold the same segments on the same parts (in the same order)."""
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("doc", "start", "end", "part"))
