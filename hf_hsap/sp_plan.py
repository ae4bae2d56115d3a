"""Plans bound to an SP group: the runtime side of planning.

The planner (:mod:`hf_hsap.plan`) is pure. This module does what needs the group's process groups:
it checks that every rank of the group was given the same layout (one tiny all-gather), plans with the
group's description (:attr:`~hf_hsap.topology.SPGroup.spec`) and cost model, and binds the plan to the
group (:class:`SPPlan`), whose :meth:`SPPlan.gather` is a collective. ``hf_hsap.plan_sequence`` is
:func:`plan_sequence` here.
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .collector import collector_paused
from .comm.p2p import raise_comm_error
from .plan.cache import PlanCache
from .plan.cost import CostModel
from .plan.group import GroupSpec
from .plan.layout import Layout, make_layout
from .plan.plan import Plan
from .plan.windows import mask_kinds
from .plan import planner
from .topology import SPGroup

__all__ = ["SPPlan", "check_same_layout", "plan_per_batch", "plan_sequence"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class SPPlan(Plan):
    """A :class:`~hf_hsap.plan.plan.Plan` bound to the :class:`~hf_hsap.topology.SPGroup` it was made
    for (``sp``): what :func:`hf_hsap.hsap_attn_func` runs, and what can :meth:`gather`."""

    sp: SPGroup | None = None

    @staticmethod
    def bind(plan: Plan, sp: SPGroup) -> "SPPlan":
        """``plan`` bound to ``sp``, sharing its data and caches.

        Args:
            plan: a plan made for ``sp.spec``. sp: the group.

        Returns:
            The :class:`SPPlan`.
        """
        fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(Plan) if f.init}
        bound = SPPlan(**fields, sp=sp)
        bound._schedules, bound._device_schedules, bound._part_tokens, bound._kinds, bound._chunks = (
            plan._schedules, plan._device_schedules, plan._part_tokens, plan._kinds, plan._chunks)
        return bound

    def gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """All ranks' shards back in global order (collective over the SP group; differentiable only
        as a value, not through other ranks).

        Args:
            x: this rank's shard. dim: the token dimension.

        Returns:
            The global tensor. Shapes: ``[..., T_local, ...] -> [..., T, ...]``.
        """
        if self.size == 1:
            return super().gather(x, dim)
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
        placement: as :func:`hf_hsap.plan.planner.plan_sequence`.
        total_tokens: as :func:`hf_hsap.plan.planner.plan_sequence`.
        **options: as :func:`hf_hsap.plan.planner.plan_sequence` (``recv_budget_tokens``, ``rounds``,
            ``token_slack``; ``ulysses_size`` and ``gpus_per_node`` for an int ``sp``); an unknown option raises
            ``TypeError``.

    Returns:
        The plan (cached: equal layouts and options return the same object).

    Raises:
        ValueError: bad ``cu_seqlens`` or options, fewer tokens than ranks, ranks with different layouts.
    """
    with collector_paused():  # the planner's passes allocate many young lists the collector would walk
        return _plan_sequence(cu_seqlens, sp, placement, total_tokens=total_tokens, cost=cost, verify=verify,
                              cache=cache, options=options)


def _plan_sequence(cu_seqlens: Any, sp: Any, placement: str, *, total_tokens: int | None, cost: CostModel | None,
                   verify: bool, cache: PlanCache | None, options: dict[str, Any]) -> Plan:
    """:func:`plan_sequence`'s body (the collector paused)."""
    unknown = set(options) - _OPTIONS
    if unknown:
        raise TypeError(f"plan_sequence() got unexpected keyword argument(s) {', '.join(sorted(unknown))}; "
                        f"options: {', '.join(sorted(_OPTIONS))}")
    opts = dict(placement=placement, **options)
    if not isinstance(sp, SPGroup):
        return planner.plan_sequence(cu_seqlens, sp, cost=cost, cache=cache, total_tokens=total_tokens, **opts)
    if not (verify and sp.size > 1):
        layout = make_layout(cu_seqlens, total_tokens)
    else:  # the check runs before anything that may raise on one rank only, a bad cu_seqlens included
        try:
            layout = make_layout(cu_seqlens, total_tokens)
        except ValueError:
            _exchange_layout_keys((-1, -1), sp)  # the peers learn that this rank has no layout
            raise
        check_same_layout(layout, sp)
    cache = cache if cache is not None else sp.plan_cache
    if len(sp.degrees) > 1:
        return plan_per_batch(layout, sp, cost or sp.cost_model, cache, opts)
    return planner.plan_sequence(layout, sp.spec, cost=cost or sp.cost_model, cache=cache,
                                 bind=lambda p: SPPlan.bind(p, sp), **opts)


def plan_per_batch(layout: Layout, sp: SPGroup, cost: CostModel | None, cache: PlanCache,
                   options: dict[str, Any]) -> SPPlan:
    """The plan of ``layout`` at the Ulysses degree the cost model prices fastest, bound to that degree's group
    (``ulysses_size="per_batch"``: ``sp.degrees``).

    Every degree's plan is made (and cached) as for a group of that degree; :func:`~hf_hsap.plan.degree.fastest_degree`
    picks one (a rank's step time, ties to the smaller degree; with ``per_batch_memory_cap``, the default, among
    the degrees whose modelled activation memory is at most the highest degree's, weighed with ``sp.heads``), the
    same on every rank since it depends only on the layout and the options. The choice is cached too, so a
    repeated layout costs one lookup.

    Args:
        layout: the checked layout. sp: a group with ``degrees``. cost: the cost model (``None``: each degree's
            link default). cache: where plans and the choice are kept. options: the planner's options.

    Returns:
        The :class:`SPPlan`, bound to ``sp.degrees[U]``.
    """
    kinds, layers = mask_kinds(options.get("windows"), layout)  # the windows as the planner keys them
    rest = tuple(sorted((k, v) for k, v in options.items() if k != "windows"))
    heads = sp.heads if sp.config.per_batch_memory_cap else None
    key = ("per_batch", layout.digest, cost, rest, tuple((w, layers[w]) for w in kinds), heads)

    def choose() -> SPPlan:
        plans = {u: planner.plan_sequence(layout, g.spec, cost=cost, cache=cache,
                                          bind=lambda p, g=g: SPPlan.bind(p, g), **options)
                 for u, g in sorted(sp.degrees.items())}
        best, times = planner.fastest_degree(plans, heads)
        logger.debug("per-batch Ulysses degree %d for %d tokens, %d documents (estimated step time per degree: %s)",
                     best, layout.total_tokens, layout.n_docs,
                     ", ".join(f"U={u}: {t:.4g}" for u, t in sorted(times.items())))
        return plans[best]

    return cache.get_or_build(key, choose)


# the planner's own options (its keyword-only parameters but the ones this function sets itself)
_OPTIONS = frozenset(name for name, p in inspect.signature(planner.plan_sequence).parameters.items()
                     if p.kind is p.KEYWORD_ONLY) - {"total_tokens", "cost", "cache", "bind"}


def _exchange_layout_keys(mine: tuple[int, int], sp: SPGroup) -> list[tuple[int, int]]:
    """All-gather ``(layout hash, tokens)`` over the SP group (``(-1, -1)``: no valid layout on that rank).

    Args:
        mine: this rank's key. sp: the group.

    Returns:
        Every SP rank's key, in SP rank order.
    """
    t = torch.tensor(mine, dtype=torch.int64)
    if dist.get_backend(sp.group) == "nccl":
        t = t.cuda()
    everyone = [torch.empty_like(t) for _ in range(sp.size)]
    try:
        dist.all_gather(everyone, t, group=sp.group)
    except RuntimeError as err:
        raise_comm_error(err, "layout check (all-gather of the layout hash)", sp.global_ranks, sp.timeout_s)
    return [tuple(int(v) for v in x.tolist()) for x in everyone]


def check_same_layout(layout: Layout, sp: SPGroup) -> None:
    """All-gather the layout hash over the SP group; raise ``ValueError`` on every rank if they differ
    (also when a rank had no valid layout: it raises its own error, the others this one).

    Args:
        layout: this rank's layout. sp: the group.

    Raises:
        ValueError: the ranks were given different packed batches.
    """
    hashes = _exchange_layout_keys((layout.hash64, layout.total_tokens), sp)
    if len(set(hashes)) > 1:
        bad = [r for r, h in enumerate(hashes) if h != hashes[0]]
        raise ValueError(
            f"the ranks of the SP group were given different packed batches (layout hash differs on SP "
            f"ranks {bad}, tokens {[h[1] for h in hashes]}); every rank of an SP group must see the same "
            "global batch: use hf_hsap's SP data-loader adapter or the same seed/sampler on the group"
        )
