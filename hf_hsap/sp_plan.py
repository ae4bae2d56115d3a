"""Plans bound to an SP group: the runtime side of planning.

The planner (:mod:`hf_hsap.plan`) is pure. This module does what needs the group's process groups:
it checks that every rank of the group was given the same layout (one tiny all-gather), plans with the
group's description (:attr:`~hf_hsap.topology.SPGroup.spec`) and cost model, and binds the plan to the
group (:class:`SPPlan`), whose :meth:`SPPlan.gather` is a collective. ``hf_hsap.plan_sequence`` is
:func:`plan_sequence` here.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .comm.p2p import raise_comm_error
from .plan.cache import PlanCache
from .plan.cost import CostModel
from .plan.group import GroupSpec
from .plan.layout import Layout, make_layout
from .plan.plan import Plan
from .plan import planner
from .topology import SPGroup

__all__ = ["SPPlan", "check_same_layout", "plan_sequence"]


@dataclasses.dataclass(eq=False)
class SPPlan(Plan):
    """A :class:`~hf_hsap.plan.plan.Plan` bound to the :class:`~hf_hsap.topology.SPGroup` it was made
    for (``sp``): what :func:`hf_hsap.hsap_attn_func` runs, and what can :meth:`gather`."""

    sp: Any = None

    @staticmethod
    def bind(plan: Plan, sp: SPGroup) -> "SPPlan":
        """``plan`` bound to ``sp`` (sharing its data and caches)."""
        fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan) if f.init}
        bound = SPPlan(**fields, sp=sp)
        bound._schedules, bound._device_schedules, bound._part_tokens = (
            plan._schedules, plan._device_schedules, plan._part_tokens)
        return bound

    def gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """All ranks' shards back in global order (collective over the SP group; differentiable only
        as a value, not through other ranks). Shapes: ``[..., T_local, ...] -> [..., T, ...]``."""
        if self.size == 1:
            return self.unshard([x], dim)
        x = x.movedim(dim, 0).contiguous()
        n_max = max(self.num_local_tokens(r) for r in range(self.size))
        padded = torch.zeros((n_max, *x.shape[1:]), dtype=x.dtype, device=x.device)  # [n_max, ...]
        padded[: x.shape[0]] = x
        bufs = [torch.empty_like(padded) for _ in range(self.size)]
        try:
            dist.all_gather(bufs, padded, group=self.sp.group)
        except RuntimeError as err:
            raise_comm_error(err, "plan gather (all-gather of the shards)", self.sp.global_ranks, self.sp.timeout_s)
        shards = [b[: self.num_local_tokens(r)] for r, b in enumerate(bufs)]
        return self.unshard(shards, 0).movedim(0, dim)


def plan_sequence(
    cu_seqlens: torch.Tensor | np.ndarray | list[int] | Layout,
    sp: SPGroup | GroupSpec | int,
    placement: str = "auto",
    *,
    total_tokens: int | None = None,
    cost: CostModel | None = None,
    verify: bool = True,
    cache: PlanCache | None = None,
    **options: Any,
) -> Plan:
    """Plan document-masked attention of one packed batch over an SP group.

    Args:
        cu_seqlens: ``[n_docs + 1]`` document boundaries over the flattened batch, ``0 < ... < T``
            (or a :class:`~hf_hsap.plan.layout.Layout`).
        sp: an :class:`~hf_hsap.topology.SPGroup` (the plan is bound to it: :class:`SPPlan`), or a
            :class:`~hf_hsap.plan.group.GroupSpec` / an int group size for offline planning
            (inspection, benchmarks; a plain :class:`~hf_hsap.plan.plan.Plan`).
        verify: with an SPGroup, compare the layout hash across the group (one tiny all-gather) and
            raise on every rank if they differ.
        cache: plan cache (default: the SPGroup's own; offline planning caches only when given one).
        cost: the cost model ``auto`` minimises (default: the SPGroup's ``cost_model`` if set, else
            ``CostModel.for_link(sp.sap_link)``).
        placement, total_tokens, options: as :func:`hf_hsap.plan.planner.plan_sequence`
            (``recv_budget_tokens``, ``rounds``, ``token_slack``; ``ulysses_size`` and ``gpus_per_node``
            for an int ``sp``); an unknown option raises ``TypeError``.

    Returns:
        The plan (cached: equal layouts and options return the same object).

    Raises:
        ValueError: bad ``cu_seqlens`` or options, fewer tokens than ranks, ranks with different layouts.
    """
    unknown = set(options) - _OPTIONS
    if unknown:
        raise TypeError(f"plan_sequence() got unexpected keyword argument(s) {', '.join(sorted(unknown))}; "
                        f"options: {', '.join(sorted(_OPTIONS))}")
    opts = dict(placement=placement, **options)
    if not isinstance(sp, SPGroup):
        return planner.plan_sequence(cu_seqlens, sp, cost=cost, cache=cache, total_tokens=total_tokens, **opts)
    layout = cu_seqlens if isinstance(cu_seqlens, Layout) and total_tokens is None else make_layout(cu_seqlens, total_tokens)
    if verify and sp.size > 1:  # before anything that may raise on one rank only
        check_same_layout(layout, sp)
    return planner.plan_sequence(layout, sp.spec, cost=cost or sp.cost_model,
                                 cache=cache if cache is not None else sp.plan_cache,
                                 bind=lambda p: SPPlan.bind(p, sp), **opts)


_OPTIONS = {"ulysses_size", "recv_budget_tokens", "rounds", "token_slack", "gpus_per_node"}


def check_same_layout(layout: Layout, sp: SPGroup) -> None:
    """All-gather the layout hash over the SP group; raise ``ValueError`` on every rank if they differ."""
    mine = torch.tensor([layout.hash64, layout.total_tokens], dtype=torch.int64)
    if dist.get_backend(sp.group) == "nccl":
        mine = mine.cuda()
    everyone = [torch.empty_like(mine) for _ in range(sp.size)]
    try:
        dist.all_gather(everyone, mine, group=sp.group)
    except RuntimeError as err:
        raise_comm_error(err, "layout check (all-gather of the layout hash)", sp.global_ranks, sp.timeout_s)
    hashes = [tuple(t.tolist()) for t in everyone]
    if len(set(hashes)) > 1:
        bad = [r for r, h in enumerate(hashes) if h != hashes[0]]
        raise ValueError(
            f"the ranks of the SP group were given different packed batches (layout hash differs on SP "
            f"ranks {bad}, tokens {[h[1] for h in hashes]}); every rank of an SP group must see the same "
            "global batch: use hf_hsap's SP data-loader adapter or the same seed/sampler on the group"
        )
