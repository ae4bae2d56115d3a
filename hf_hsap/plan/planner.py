"""The planner: layout + group description -> :class:`~hf_hsap.plan.plan.Plan` (placement, minimal transfers,
rounds). Pure and device-free: every rank computes the same plan from the same layout; checking that the ranks were
given the same layout and binding the plan to process groups is the runtime's job (:func:`hf_hsap.sp_plan.plan_sequence`,
what ``hf_hsap.plan_sequence`` is).
"""
from __future__ import annotations

import logging
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from .balanced import balanced
from .cache import PlanCache
from .cost import CostModel
from .degree import fastest_degree, rank_step_time
from .density import density
from .group import GroupSpec, offline_link
from .items import ItemWork
from .kinds import plan_kind
from .layout import Layout, make_layout
from .placement import DEFAULT_TOKEN_SLACK, PLACEMENTS, Placement, contiguous, zigzag
from .plan import Plan
from .rounds import ROUND_ORDERS
from .auto import auto
from .search import Search
from .transfers import Transfers
from .windows import Window, mask_kinds, window_transfers

__all__ = ["Plan", "choose_ulysses_size", "fastest_degree", "offline_link", "plan_layout", "plan_sequence",
           "rank_step_time"]

logger = logging.getLogger(__name__)


def _place(s: Search, name: str) -> tuple[Placement, dict[Window, Transfers]]:
    """Build the named placement for the search's layout and group (``auto``: :func:`.auto.auto`) and its
    transfers of every kind in ``s.layers``. A document-aware placement that would leave a part with fewer than
    ``s.min_tokens`` tokens (every rank must hold one) is replaced by ``contiguous``, which never does when
    ``T >= P``."""
    layout, n_parts = s.layout, s.n_parts
    if name == "auto":
        return auto(s)[:2]
    if name == "contiguous":
        pl = contiguous(layout, n_parts)
    elif name == "zigzag":
        pl = zigzag(layout, n_parts)
    elif name == "balanced":
        pl = balanced(layout, n_parts, token_slack=s.token_slack)
    elif name == "density":
        pl = density(layout, n_parts, s.cost.token_cost, s.token_slack)
    else:
        raise ValueError(f"unknown placement {name!r}; choose one of {', '.join(PLACEMENTS)}")
    if pl.tokens_per_part().min() < s.min_tokens:
        logger.info("placement %r would leave a part with fewer than %d tokens (%d tokens, %d parts): "
                    "using 'contiguous'", name, s.min_tokens, layout.total_tokens, n_parts)
        pl = contiguous(layout, n_parts)
    return pl, {w: window_transfers(pl, layout, w) for w in s.layers}


def _checked_items(items: ItemWork | None, layout: Layout) -> ItemWork | None:
    """``items`` if any weighs (None for none or no work: the text-only plan), checked against the layout."""
    if items is None or items.n_items == 0 or not items.work.any():
        return None
    if items.positions.size and (items.positions.min() < 0 or items.positions.max() >= layout.total_tokens):
        raise ValueError(f"items: placeholder positions outside the batch's {layout.total_tokens} tokens")
    return items


def _group(sp: int | GroupSpec, ulysses_size: int, gpus_per_node: int | None) -> GroupSpec:
    """The group to plan for: a :class:`GroupSpec` as given, or an offline one of ``sp`` ranks."""
    if isinstance(sp, GroupSpec):
        return sp
    if isinstance(sp, (int, np.integer)) and not isinstance(sp, bool):
        return GroupSpec.offline(int(sp), int(ulysses_size), gpus_per_node)
    if hasattr(sp, "spec") and hasattr(sp, "plan_cache"):
        raise ValueError("the pure planner takes a GroupSpec or an int; an SPGroup (process groups) is planned "
                         "by hf_hsap.plan_sequence(cu_seqlens, sp), which checks and binds the plan to it")
    raise ValueError(f"sp must be an SPGroup (from hf_hsap.init_sequence_parallel) or an int, got {type(sp)}")


def plan_layout(layout: Layout, group: GroupSpec, placement: str = "auto", *, recv_budget_tokens: int | None = None,
                rounds: str = "auto", token_slack: float = DEFAULT_TOKEN_SLACK, cost: CostModel | None = None,
                windows: Sequence[Window] | Mapping[Window, int] | None = None, items: ItemWork | None = None) -> Plan:
    """Plan one layout for one group: a new :class:`Plan` (no cache, no validation: :func:`plan_sequence`)."""
    U = group.ulysses_size
    base = cost or CostModel.for_link(group.link)
    cost = base.for_ulysses(U)  # tokens also cross the all-to-all when U > 1
    kinds, layers = mask_kinds(windows, layout)
    search = Search(layout, group.n_parts, cost, token_slack, U, layers, recv_budget_tokens, rounds,
                    items=_checked_items(items, layout), item_cost=base.token_cost)
    pl, trs = _place(search, placement)
    per_kind = {w: plan_kind(layout, pl, w, cost, recv_budget_tokens, rounds, transfers=trs[w],
                             order_times=None if w is not None else search.orders(pl, trs[w])) for w in kinds}
    for w, k in per_kind.items():
        logger.debug("planned %d tokens, %d documents over %d ranks (U=%d), mask %s (%d layers): placement %r, "
                     "rounds %r (%d), %d KV tokens moved", layout.total_tokens, layout.n_docs, group.size, U,
                     "full" if w is None else f"window {w}", layers[w], pl.name, k.round_order, k.pieces.n_rounds,
                     int(k.transfers.lengths.sum()))
    first = per_kind[kinds[0]]
    plan = Plan(layout, group, pl, first.transfers, first.pieces, first.round_order, recv_budget_tokens, cost,
                windows=kinds, layer_counts=layers, rounds_option=rounds)
    plan._kinds.update(per_kind)
    return plan


def plan_sequence(
    cu_seqlens: torch.Tensor | np.ndarray | list[int] | Layout,
    sp: int | GroupSpec,
    placement: str = "auto",
    *,
    ulysses_size: int = 1,
    recv_budget_tokens: int | None = None,
    rounds: str = "auto",
    token_slack: float = DEFAULT_TOKEN_SLACK,
    total_tokens: int | None = None,
    cost: CostModel | None = None,
    gpus_per_node: int | None = None,
    cache: PlanCache | None = None,
    bind: Callable[[Plan], Plan] | None = None,
    windows: Sequence[Window] | Mapping[Window, int] | None = None,
    items: ItemWork | None = None,
) -> Plan:
    """Plan document-masked attention of one packed batch over a group (pure; see the module docstring).

    Args:
        cu_seqlens: ``[n_docs + 1]`` document boundaries over the flattened batch (tensor, array, list or
            :class:`~hf_hsap.plan.layout.Layout`); ``0 < ... < T``.
        sp: a :class:`~hf_hsap.plan.group.GroupSpec`, or an int group size for offline planning.
        placement: ``"contiguous"``, ``"zigzag"``, ``"balanced"``, ``"density"`` or ``"auto"`` (:mod:`.auto`: the
            cheapest by ``cost`` of every placement the planner builds, refined; never worse than any).
        ulysses_size: U for an int ``sp``. gpus_per_node: the ranks per node for an int ``sp``.
        recv_budget_tokens: at most this many KV tokens in a receive buffer (and sent per round); more moves in
            further rounds and the backward fetches the KV again. ``None``: no limit.
        rounds: ``"batched"`` (one round with every peer), ``"by_peer"`` (one ring distance per round) or ``"auto"``
            (``by_peer`` where the simulated step, :mod:`.pipeline`, is at least 1 % faster).
        token_slack: epsilon of the token cap ``ceil(T/P) * (1 + eps)``. total_tokens: if given, ``cu_seqlens[-1]``.
        cost: the cost model ``auto`` minimises (default: ``CostModel.for_link(group.link)``).
        cache: equal layouts and options return the same plan. bind: applied to a new plan before it is cached.
        windows: every layer's attention mask (:mod:`.windows`): a per-layer sequence of sliding windows (``None`` =
            full) or a mapping window -> layer count (``hf_hsap.attention_windows(config)``); one set of transfers
            and rounds per kind over one placement, weighed by layers. Other kinds are planned on demand.
        items: a vision-language batch's items and their encoder work (:class:`~hf_hsap.plan.items.ItemWork`,
            what ``shard_batch`` gives): ``auto`` balances every part's encoder plus decoder work
            (:mod:`hf_hsap.plan.items`). None (text): no encoder work, the plan as without it.

    Returns:
        The :class:`Plan`.

    Raises:
        ValueError: bad ``cu_seqlens``, unknown placement or round order, fewer tokens than ranks, a non-positive
            budget.
    """
    layout = make_layout(cu_seqlens, total_tokens)
    group = _group(sp, ulysses_size, gpus_per_node)
    if recv_budget_tokens is not None and recv_budget_tokens < 1:
        raise ValueError("recv_budget_tokens must be a positive number of tokens (or None for no limit)")
    if rounds not in ROUND_ORDERS:
        raise ValueError(f"unknown rounds {rounds!r}; choose one of {', '.join(ROUND_ORDERS)}")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; choose one of {', '.join(PLACEMENTS)}")
    if layout.total_tokens < group.size:  # every rank (and every intra slice) must hold a token
        raise ValueError(f"the batch has {layout.total_tokens} tokens but the SP group has {group.size} ranks; "
                         "every rank needs at least one token: pack longer rows or use a smaller sp_size")
    cost = cost or CostModel.for_link(group.link)
    _, layers = mask_kinds(windows, layout)
    items = _checked_items(items, layout)
    key = (layout.digest, group, placement, recv_budget_tokens, rounds, token_slack, cost, bind is not None,
           tuple(sorted(layers.items(), key=lambda kv: -1 if kv[0] is None else kv[0])))
    if items is not None:
        key += (items.key,)

    def build() -> Plan:
        plan = plan_layout(layout, group, placement, recv_budget_tokens=recv_budget_tokens, rounds=rounds,
                           token_slack=token_slack, cost=cost, windows=layers, items=items)
        return plan if bind is None else bind(plan)

    return build() if cache is None else cache.get_or_build(key, build)


def choose_ulysses_size(cu_seqlens: torch.Tensor | np.ndarray | list[int] | Layout, sp_size: int, *, num_heads: int,
                        gpus_per_node: int | None = None, cost: CostModel | None = None, placement: str = "auto",
                        windows: Sequence[Window] | Mapping[Window, int] | None = None, num_kv_heads: int | None = None,
                        memory_cap: bool = True) -> tuple[int, dict[int, float]]:
    """The Ulysses degree ``U`` whose plan of this layout the cost model prices fastest (offline; what a
    ``"per_batch"`` group decides per batch), among those whose activation memory stays within the highest degree's
    (:func:`.degree.fastest_degree`). Every ``U`` dividing ``sp_size``, ``num_heads`` and the node is planned, up to
    ``U = sp_size`` (Ulysses itself); a rank's time is its part's step time divided by ``U``.

    Args:
        cu_seqlens: the layout. sp_size: P. num_heads: query heads of the model.
        gpus_per_node: ranks per node (None: unknown, no node limit; SAP's KV priced for the network unless
            the group fits in one node). cost: the cost model (default: ``CostModel.for_link`` of the group).
        placement: as :func:`plan_sequence`.
        windows: as :func:`plan_sequence`.
        num_kv_heads: key/value heads of the model (default ``num_heads``: no grouped-query sharing, the most KV
            memory a received key can cost). memory_cap: ``False``: time alone.

    Returns:
        ``(best U, {U: estimated step time of the slowest rank, in pairs})``; ties go to the smaller U.
    """
    layout = make_layout(cu_seqlens)
    plans = {}
    for U in range(1, sp_size + 1):
        if sp_size % U or num_heads % U or (gpus_per_node and gpus_per_node % U) or layout.total_tokens < sp_size:
            continue
        group = GroupSpec.offline(sp_size, U, gpus_per_node)
        plans[U] = plan_layout(layout, group, placement, cost=cost or CostModel.for_link(group.link), windows=windows)
    if not plans:
        raise ValueError(f"no Ulysses degree divides sp_size={sp_size} and num_heads={num_heads} (and fits a node of "
                         f"{gpus_per_node} ranks) for {layout.total_tokens} tokens")
    return fastest_degree(plans, (num_heads, num_kv_heads or num_heads) if memory_cap else None)
