"""The planner: layout + group description -> :class:`~hf_hsap.plan.plan.Plan` (placement, minimal
transfers, rounds).

Pure and device-free: numpy on the host, no ``torch.distributed``, no device queries, no process
groups. Every rank computes the same plan from the same layout; checking that the ranks of a group
really were given the same layout, and binding the plan to the group's process groups, is the runtime
side's job (:func:`hf_hsap.sp_plan.plan_sequence`, what ``hf_hsap.plan_sequence`` is).
"""
from __future__ import annotations

import functools
import logging
import math
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from .balanced import balanced, balanced_greedies
from .density import DensityFigures, density, density_figures, density_greedies
from .greedy import Greedy
from .cache import PlanCache
from .cutting import with_priced_cuts
from .exposure import Simulations, simulated_orders
from .cost import CostModel, contiguous_time_bound, step_time, zigzag_part_times, zigzag_time_bound
from .degree import fastest_degree, rank_step_time
from .group import GroupSpec, offline_link
from .layout import Layout, make_layout
from .placement import DEFAULT_TOKEN_SLACK, PLACEMENTS, Placement, contiguous, zigzag
from .kinds import plan_kind
from .plan import Plan
from .polishing import exposure_evened, polished, searched_from_others
from .rounds import ROUND_ORDERS
from .slicing import with_sliced_cuts
from .transfers import Transfers
from .windows import Window, mask_kinds, weighted_contiguous, window_transfers

__all__ = ["AUTO_TOKEN_SLACKS", "Plan", "choose_ulysses_size", "fastest_degree", "offline_link", "plan_layout",
           "plan_sequence", "rank_step_time"]

logger = logging.getLogger(__name__)

AUTO_TOKEN_SLACKS = (0.01, 0.03)  # the balanced candidates of placement="auto" (capped by token_slack)
DENSITY_VARIANTS = (("fit", 1.0), ("fit", 0.6), ("all", 1.0))  # (spread, work_share) of auto's density candidates
ZIGZAG_WINDOWED_SEGMENTS = 65536  # with windowed layers zigzag is priced by building it, up to this many segments
Candidate = tuple[float, Callable[[], Placement]]  # auto's: (lower bound of its time on one full layer, builder)
CUT_MIN_PARTS = 2  # auto weighs the priced contiguous cuts (.cutting) from this many parts: on every group, small
# ones included (the searches from other starts do not cover them: on the sweep the cuts make layouts of 2-8 parts
# faster by both models, none slower)
FLOOR_MARGIN = 1e-9  # a candidate is skipped when its lower bound exceeds the best time by this relative margin


def _place(layout: Layout, n_parts: int, name: str, token_slack: float, cost: CostModel | None,
           min_tokens: int = 1, layers: Mapping[Window, int] | None = None, budget: int | None = None,
           rounds: str = "auto", sims: Simulations | None = None) -> tuple[Placement, dict[Window, Transfers]]:
    """Build the named placement (``auto``: the cheapest candidate by :mod:`.cost`, weighing the layers of
    every mask kind; ``budget`` and ``rounds``, the plan's receive budget and rounds option, are what its
    simulated rounds run) and its transfers of every kind in ``layers`` (default: the full kind). A
    document-aware placement that would leave a part with fewer than ``min_tokens`` tokens (every rank must
    hold one) is replaced by ``contiguous``, which never does when ``T >= P``. ``sims``: ``auto``'s memo of the plans
    its checks simulated (:func:`.exposure.simulation_agrees`; updated), for the caller to read the final plan's."""
    layers = layers or {None: 1}

    def kinds_of(pl: Placement) -> dict[Window, Transfers]:
        return {w: window_transfers(pl, layout, w) for w in layers}

    if name == "contiguous":
        pl = contiguous(layout, n_parts)
    elif name == "zigzag":
        pl = zigzag(layout, n_parts)
    elif name == "balanced":
        pl = balanced(layout, n_parts, token_slack=token_slack)
    elif name == "density":
        pl = density(layout, n_parts, (cost or CostModel.default()).token_cost, token_slack)
    elif name == "auto":
        return _auto(layout, n_parts, token_slack, cost or CostModel.default(), min_tokens, layers, budget, rounds,
                     {} if sims is None else sims)
    else:
        raise ValueError(f"unknown placement {name!r}; choose one of {', '.join(PLACEMENTS)}")
    if pl.tokens_per_part().min() < min_tokens:
        logger.info("placement %r would leave a part with fewer than %d tokens (%d tokens, %d parts): "
                    "using 'contiguous'", name, min_tokens, layout.total_tokens, n_parts)
        pl = contiguous(layout, n_parts)
    return pl, kinds_of(pl)


def _auto(layout: Layout, n_parts: int, token_slack: float, cost: CostModel, min_tokens: int,
          layers: Mapping[Window, int], budget: int | None, rounds: str,
          sims: Simulations) -> tuple[Placement, dict[Window, Transfers]]:
    """``placement="auto"``: the cheapest candidate (:func:`_best_candidate`), polished (:mod:`.polishing`):
    searched when small (:func:`.polishing.polished`), and with its exposed transfers evened out first where
    that is worth it (:func:`.polishing.exposure_evened`), and searched from other starts as well
    (:func:`.polishing.searched_from_others`); on groups of at least :data:`CUT_MIN_PARTS` parts, that plan is
    replaced by contiguous cuts priced with their transfers where both cost models price them faster
    (:func:`.cutting.with_priced_cuts`), then by sliced cuts alike (:func:`.slicing.with_sliced_cuts`), so neither
    step makes a plan slower by either model. Returns the placement and its transfers of every kind."""
    pl, tr, best = _best_candidate(layout, n_parts, token_slack, cost, min_tokens, layers)
    plain = polished(layout, n_parts, cost, token_slack, min_tokens, layers, pl, tr, best)
    # sims: the steps weigh one plan against several others, each simulated once (the caller reads the final one's)
    current = exposure_evened(layout, n_parts, cost, token_slack, min_tokens, layers, pl, best, plain, budget, rounds,
                              sims)
    current = searched_from_others(layout, n_parts, cost, token_slack, min_tokens, layers, pl, current, budget, rounds,
                                   sims)
    if n_parts >= CUT_MIN_PARTS:
        current = with_priced_cuts(layout, n_parts, cost, token_slack, min_tokens, layers, *current, budget, rounds,
                                   sims)
        current = with_sliced_cuts(layout, n_parts, cost, token_slack, min_tokens, layers, *current, budget, rounds,
                                   sims)
    if cost.mixer_token_cost or cost.handoff_cost:  # a hybrid model: the polish weighs attention only, so its result
        # must also beat the cheapest candidate and contiguous cuts with the recurrent layers' hand-off steps priced
        cut = contiguous(layout, n_parts)
        options = [current[:2], (pl, tr), (cut, {w: window_transfers(cut, layout, w) for w in layers})]
        return min(options, key=lambda o: step_time(layout, o[0], o[1], layers, cost))
    return current[:2]


def _best_candidate(layout: Layout, n_parts: int, token_slack: float, cost: CostModel, min_tokens: int,
                    layers: Mapping[Window, int]) -> tuple[Placement, dict[Window, Transfers], float]:
    """Every placement the planner can build, priced by ``cost`` over the layers of every mask kind; the
    cheapest wins (the first of equals): ``(placement, transfers of every kind, step time)``.

    Candidates: ``balanced`` at token slacks 0.01, 0.03 (each at most ``token_slack``) and ``token_slack``,
    each token-neutral and priced (one greedy pass, shared while the slacks agree:
    :func:`.balanced.balanced_greedies`); ``density`` (:mod:`.density`: every document over as many parts as
    its pairs need, or 0.6 of a share, at the two largest slacks; its heaviest over all parts at
    ``token_slack``; the variants share their figures, :func:`.density.density_figures`); ``contiguous``;
    ``zigzag``; with windowed layers, contiguous cuts at equal estimated cost. Small slacks: tokens cost every
    linear layer, so near-equal token counts pay even when a few more documents must be split (BENCHMARKS.md).
    ``zigzag`` is priced in closed form on full attention (its transfers grow as documents x parts squared) and
    built only if it wins; with windowed layers it is built and priced up to :data:`ZIGZAG_WINDOWED_SEGMENTS`
    segments (beyond, it is not a candidate). A greedy pass bounds its candidates' time from below
    (:meth:`.greedy.Greedy.floor`), and so does a closed form ``contiguous``'s
    (:func:`.cost.contiguous_time_bound`): one that cannot beat the best so far is neither refined (built) nor
    priced (:func:`_cheapest`).
    """
    slacks = sorted({min(s, token_slack) for s in AUTO_TOKEN_SLACKS} | {token_slack})
    tc = cost.token_cost
    greedy = [(g, c) for g in balanced_greedies(layout, n_parts, slacks) for c in (tc, None)]
    fig = density_figures(layout, tc)  # shared by the variants
    dense = {(eps, spread, share): g for spread, share in DENSITY_VARIANTS
             for eps, g in zip(*_density_slacks(fig, n_parts, slacks, spread, share))}
    greedy += [(dense[eps, spread, share], tc)  # in the order the candidates were first listed (ties: the first)
               for eps in slacks[-2:] for spread, share in DENSITY_VARIANTS if spread == "fit" or eps == slacks[-1]]
    windowed = any(w is not None for w in layers)
    kv = 0.0 if windowed else cost.kv_token_cost  # (the bounds prune full layers only: _cheapest)
    cands: list[Candidate] = [(g.floor(tc, kv), functools.partial(g.placement, c)) for g, c in greedy]
    # contiguous's bound in closed form (on full layers: elsewhere every candidate is built anyway)
    cands.append((0.0 if windowed else contiguous_time_bound(layout, n_parts, cost),
                  functools.partial(contiguous, layout, n_parts)))
    if windowed:  # contiguous cuts at equal estimated cost, within the small slacks' cap
        eps = min(AUTO_TOKEN_SLACKS[-1], token_slack)
        cap = int(math.ceil(layout.total_tokens / n_parts * (1 + eps)))
        cands.append((0.0, functools.partial(weighted_contiguous, layout, n_parts, layers, tc, cap, min_tokens)))
    pl, tr, best = _cheapest(layout, cands, cost, min_tokens, layers)
    zz = _zigzag_if_cheaper(layout, n_parts, cost, layers, best, min_tokens)
    if zz is not None:
        pl, tr = zz
        best = step_time(layout, pl, tr, layers, cost)
    return pl, tr, best


def _density_slacks(fig: DensityFigures, n_parts: int, slacks: Sequence[float], spread: str,
                    share: float) -> tuple[list[float], list[Greedy]]:
    """The slacks ``auto`` builds one density variant at (the two largest for ``"fit"``, the largest for
    ``"all"``) and its greedy passes there (:func:`.density.density_greedies`, of ``fig``'s layout and token
    cost)."""
    eps = slacks[-2:] if spread == "fit" else slacks[-1:]
    return eps, density_greedies(fig.layout, n_parts, fig.token_cost, eps, spread=spread, work_share=share,
                                 figures=fig)


def _cheapest(layout: Layout, cands: Sequence[Candidate], cost: CostModel, min_tokens: int,
              layers: Mapping[Window, int]) -> tuple[Placement, dict[Window, Transfers], float]:
    """The cheapest candidate by :func:`.cost.step_time` (the first of equals), its transfers and time.

    Candidates are built and priced in the order of their bounds; on full-attention layers one whose bound
    is above the best time so far is never built (the margin covers the rounding of the bound). Full layers
    are priced without transfers (:func:`.cost.part_times` reads the received KV from the segments); only the
    winner's are built. A candidate that leaves a part with fewer than ``min_tokens`` tokens is dropped.

    Args:
        layout: the documents. cands: ``(bound, build)`` of every candidate. cost: the cost model.
        min_tokens: the fewest tokens a part may hold. layers: layers per mask kind.

    Returns:
        ``(placement, transfers of every kind, step time)``.
    """
    full = all(w is None for w in layers)
    n_full = sum(layers.values())
    best: tuple[float, int] = (math.inf, len(cands))
    out: tuple[Placement, dict[Window, Transfers | None]] | None = None
    built: list[Placement] = []
    for i in sorted(range(len(cands)), key=lambda j: cands[j][0]):
        bound, build = cands[i]
        if full and n_full * bound > best[0] * (1 + FLOOR_MARGIN):
            break  # so are the bounds of the rest
        pl = build()
        if any(pl is b for b in built):  # one pass refined alike at two caps: priced once, the first wins ties
            continue
        built.append(pl)
        if pl.tokens_per_part().min() < min_tokens:
            continue
        # full layers are priced from the segments (cost.part_recv); only the winner's transfers are built
        tr = {w: None if w is None else window_transfers(pl, layout, w) for w in layers}
        t = step_time(layout, pl, tr, layers, cost)
        if (t, i) < best:
            best, out = (t, i), (pl, tr)
    assert out is not None, "contiguous leaves every part a token when T >= P"
    pl, tr = out
    return pl, {w: window_transfers(pl, layout, w) if x is None else x for w, x in tr.items()}, best[0]


def _zigzag_if_cheaper(layout: Layout, n_parts: int, cost: CostModel, layers: Mapping[Window, int], best: float,
                       min_tokens: int) -> tuple[Placement, dict[Window, Transfers]] | None:
    """``zigzag`` and its transfers if its step time is below ``best``, else None; built only when it wins
    (full attention) or when it is small enough to price by building (windowed layers)."""
    # a lower bound of its time: the closed-form one on full layers, its tokens alone on windowed ones
    bound = sum(n * (zigzag_time_bound(layout, n_parts, cost) if w is None
                     else cost.token_cost * math.floor(layout.total_tokens / n_parts)) for w, n in layers.items())
    if bound >= best:
        return None
    if all(w is None for w in layers):
        if layers[None] * float(zigzag_part_times(layout, n_parts, cost).max()) >= best:
            return None
        pl = zigzag(layout, n_parts)
        tr = {None: window_transfers(pl, layout, None)}
    elif 2 * n_parts * layout.n_docs <= ZIGZAG_WINDOWED_SEGMENTS:
        pl = zigzag(layout, n_parts)
        tr = {w: window_transfers(pl, layout, w) for w in layers}
        if step_time(layout, pl, tr, layers, cost) >= best:
            return None
    else:
        return None
    return (pl, tr) if pl.tokens_per_part().min() >= min_tokens else None


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
                windows: Sequence[Window] | Mapping[Window, int] | None = None) -> Plan:
    """Plan one layout for one group (no cache, no validation of the options: :func:`plan_sequence`).

    Args:
        layout: the documents. group: the group. The other arguments as :func:`plan_sequence`.

    Returns:
        A new :class:`Plan`.
    """
    U = group.ulysses_size
    cost = (cost or CostModel.for_link(group.link)).for_ulysses(U)  # tokens also cross the all-to-all when U > 1
    kinds, layers = mask_kinds(windows, layout)
    sims: Simulations = {}  # what auto's checks simulated: the final plan's round orders, if among them
    pl, trs = _place(layout, group.n_parts, placement, token_slack, cost, min_tokens=U, layers=layers,
                     budget=recv_budget_tokens, rounds=rounds, sims=sims)
    per_kind = {w: plan_kind(layout, pl, w, cost, recv_budget_tokens, rounds, trs[w],
                             None if w is not None else simulated_orders(sims, pl, trs[w])) for w in kinds}
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
) -> Plan:
    """Plan document-masked attention of one packed batch over a group (pure; see the module docstring).

    Args:
        cu_seqlens: ``[n_docs + 1]`` document boundaries over the flattened batch (host or device
            tensor, numpy array or list; or a :class:`~hf_hsap.plan.layout.Layout`); ``0 < ... < T``.
        sp: a :class:`~hf_hsap.plan.group.GroupSpec`, or an int group size for offline planning
            (inspection, benchmarks). ``hf_hsap.plan_sequence`` also takes an SPGroup.
        placement: ``"contiguous"``, ``"zigzag"``, ``"balanced"``, ``"density"`` or ``"auto"``: the cheapest
            by ``cost`` of every placement the planner builds (:func:`_auto`), never worse than any of them.
        ulysses_size: U for an int ``sp`` (a GroupSpec carries its own).
        recv_budget_tokens: at most this many KV tokens in a receive buffer (and sent per round);
            more is moved in further rounds, and the backward fetches the KV again instead of keeping
            it. ``None``: no limit.
        rounds: how transfers are grouped in time (:mod:`hf_hsap.plan.rounds`): ``"batched"`` (one
            round with every peer), ``"by_peer"`` (one ring distance per round: later peers' KV
            arrives while this peer's remote items run) or ``"auto"``: ``by_peer`` when ``cost``
            predicts it at least 1% faster for the slowest part (forward + backward, simulated with
            the runtime's own steps, :mod:`hf_hsap.plan.pipeline`), else ``batched``.
        token_slack: epsilon of the ``balanced`` token cap ``ceil(T/P) * (1 + eps)``; for ``auto``, the
            largest slack its candidates may use.
        total_tokens: if given, must equal ``cu_seqlens[-1]``.
        cost: the cost model ``auto`` minimises. Default: ``CostModel.for_link(group.link)``
            (offline: ``"nvlink"`` when ``size`` divides ``gpus_per_node``, else ``"network"``).
        gpus_per_node: for an int ``sp``, the ranks per node.
        cache: plan cache (equal layouts and options return the same object); none by default.
        bind: applied to the new plan before it is cached (the runtime binds plans to its process
            groups this way).
        windows: the attention mask of every layer of the model (:mod:`hf_hsap.plan.windows`): a per-layer
            sequence of sliding windows (Transformers' ``sliding_window``; ``None`` = full attention) or a
            mapping window -> layer count; ``hf_hsap.attention_windows(model.config)`` reads it from a
            config. The plan gets one set of transfers and rounds per distinct kind over one placement, and
            ``auto`` weighs the kinds by their layers. Default: full attention only. Other kinds are planned
            on demand (exact, but not weighed).

    Returns:
        The :class:`Plan`.

    Raises:
        ValueError: bad ``cu_seqlens``, unknown placement or round order, fewer tokens than ranks, a
            non-positive budget.
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
    key = (layout.digest, group, placement, recv_budget_tokens, rounds, token_slack, cost, bind is not None,
           tuple(sorted(layers.items(), key=lambda kv: -1 if kv[0] is None else kv[0])))

    def build() -> Plan:
        plan = plan_layout(layout, group, placement, recv_budget_tokens=recv_budget_tokens, rounds=rounds,
                           token_slack=token_slack, cost=cost, windows=layers)
        return plan if bind is None else bind(plan)

    return build() if cache is None else cache.get_or_build(key, build)


def choose_ulysses_size(cu_seqlens: torch.Tensor | np.ndarray | list[int] | Layout, sp_size: int, *, num_heads: int,
                        gpus_per_node: int | None = None, cost: CostModel | None = None, placement: str = "auto",
                        windows: Sequence[Window] | Mapping[Window, int] | None = None, num_kv_heads: int | None = None,
                        memory_cap: bool = True) -> tuple[int, dict[int, float]]:
    """The Ulysses degree ``U`` whose plan of this layout the cost model prices fastest (pure, offline), among
    those whose activation memory stays within the highest degree's (:func:`.degree.fastest_degree`).

    Every ``U`` that divides ``sp_size`` and ``num_heads`` and keeps the all-to-all inside a node (divides
    ``gpus_per_node`` when it is given) is planned, up to ``U = sp_size`` (DeepSpeed Ulysses: one part, no
    SAP). A rank's time is its part's step time divided by ``U`` (:func:`.cost.step_time`, with the
    all-to-all's share of every token, :meth:`.cost.CostModel.for_ulysses`). What a per-batch choice of the
    hierarchy would gain; the runtime's groups have one ``U`` (``init_sequence_parallel(ulysses_size=...)``).

    Args:
        cu_seqlens: the layout. sp_size: P. num_heads: query heads of the model.
        gpus_per_node: ranks per node (None: unknown, no node limit; SAP's KV priced for the network unless
            the group fits in one node). cost: the cost model (default: ``CostModel.for_link`` of the group).
        placement, windows: as :func:`plan_sequence`.
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
