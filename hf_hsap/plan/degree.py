"""The one rule of the per-batch Ulysses degree: the fastest plan whose activation memory stays within the highest
degree's (pure, offline; :func:`hf_hsap.plan.planner.choose_ulysses_size` and ``ulysses_size="per_batch"`` groups,
:func:`hf_hsap.sp_plan.plan_per_batch`, use it).

Time alone is not enough: flat SAP keeps every received ``K|V`` buffer for the backward, so a plan that the cost model
prices 2 % faster can hold 1.6x the activations of the all-to-all's head shards (a long-tail row with as many
key/value heads as query heads; activation memory is what bounds the sequence). The highest degree holds the fewest
received keys (none at ``U = P``, DeepSpeed Ulysses' layout), so it is the cap; with few key/value heads it repeats
them, and then a lower degree is also the lighter one.
"""
from __future__ import annotations

import logging
from typing import Mapping

from .cost import step_time
from .memory import plan_memory
from .plan import Plan

logger = logging.getLogger("hf_hsap")


def rank_step_time(plan: Plan) -> float:
    """Estimated step time of a rank under ``plan``, in pairs: its slowest part's step time over every mask kind
    (:func:`.cost.step_time`, with the all-to-all's share of every token when ``U > 1``) divided by ``U`` (a rank
    computes ``1 / U`` of its part's heads). What compares plans of one layout at different Ulysses degrees."""
    trs = {w: plan.kind(w).transfers for w in plan.windows}
    return step_time(plan.layout, plan.placement, trs, plan.layer_counts, plan.cost) / plan.ulysses_size


def fastest_degree(plans: Mapping[int, Plan], heads: tuple[int, int] | None = None) -> tuple[int, dict[int, float]]:
    """The Ulysses degree whose plan :func:`rank_step_time` prices fastest, among the degrees whose modelled
    activation memory (:func:`.memory.plan_memory`) is at most the highest degree's when ``heads`` is given.

    Args:
        plans: one plan of the same layout per degree ``U``.
        heads: ``(query heads, key/value heads)`` of the model: cap the memory; ``None``: time alone.

    Returns:
        ``(best U, {U: estimated step time})``; ties go to the smaller U.
    """
    times = {U: rank_step_time(p) for U, p in plans.items()}
    allowed = list(plans)
    if heads is not None:
        mem = {U: plan_memory(p, *heads) for U, p in plans.items()}
        cap = mem[max(plans)]
        allowed = [U for U in plans if mem[U] <= cap]
        fastest = min(times, key=lambda u: (times[u], u))
        if fastest not in allowed:
            logger.debug("per-batch Ulysses degree: U=%d is priced fastest but holds %.3g token-heads of activations "
                         "against %.3g at U=%d; a lighter degree runs", fastest, mem[fastest], cap, max(plans))
    return min(allowed, key=lambda u: (times[u], u)), times
