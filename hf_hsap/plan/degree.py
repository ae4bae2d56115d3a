"""The one rule of the per-batch Ulysses degree: the fastest plan whose activation memory stays within the highest
degree's (flat SAP keeps every received ``K|V`` for the backward; the highest degree receives the fewest keys)."""
from __future__ import annotations

import logging
from typing import Mapping

from .cost import step_time
from .memory import plan_memory
from .plan import Plan

logger = logging.getLogger("hf_hsap")


def rank_step_time(plan: Plan) -> float:
    """A rank's estimated step time under ``plan``, in pairs: :func:`.cost.step_time` over ``U`` (a rank computes
    ``1 / U`` of its part's heads), comparable across Ulysses degrees."""
    trs = {w: plan.kind(w).transfers for w in plan.windows}
    return step_time(plan.layout, plan.placement, trs, plan.layer_counts, plan.cost) / plan.ulysses_size


def fastest_degree(plans: Mapping[int, Plan], heads: tuple[int, int] | None = None) -> tuple[int, dict[int, float]]:
    """``(best U, {U: rank_step_time})`` over ``plans`` (a plan per degree): the fastest (ties: smaller U) of those
    whose :func:`.memory.plan_memory` under ``heads`` (query, key/value; None: time alone) is within the highest's."""
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
