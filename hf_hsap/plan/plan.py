"""Plan: what the planner decided for one layout and one group, as data.

A :class:`Plan` holds the inputs and decisions (layout, group, placement, transfers, round pieces, cost model);
schedules and token indices are derived on first use and cached. It knows no process group: binding one (and
collectives such as ``gather``) is :class:`hf_hsap.sp_plan.SPPlan`. Vocabulary: a *part* is one of the
``R = P / U`` units of the placement (``U`` ranks); its tokens are cut into ``U`` consecutive *intra slices*, slice
``u`` on intra rank ``u``; a *piece* is a run of KV tokens sent in one round; a *shard* is one rank's tokens.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from ..log import log_once
from .cost import CostModel
from .group import GroupSpec
from .kinds import KindPlan, plan_kind
from .layout import Layout
from .pipeline import PipelineShape, pipeline_shape
from .placement import Placement
from .rounds import RoundPieces
from .schedule import Schedule, compile_schedule, ranges_to_index
from .stats import PlanStats, plan_stats
from .transfers import Transfers
from .window_schedule import compile_window_schedule
from .windows import Window, kind_of

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Plan:
    """For one layout and one SP group: the placement, the KV each part needs from each peer, and the compiled
    per-part schedules. A rank's tokens are in *plan order* (sorted by global position). All mask kinds share the
    placement; each has its own transfers, rounds, schedules and statistics (:meth:`kind`)."""

    layout: Layout
    group: GroupSpec
    placement: Placement
    transfers: Transfers  # the KV each part receives (of windows[0], as pieces and round_order)
    pieces: RoundPieces  # the transfers cut into rounds
    round_order: str  # "batched" or "by_peer"
    recv_budget_tokens: int | None  # None: no receive budget
    cost: CostModel
    windows: tuple[Window, ...] = (None,)  # the mask kinds: None (full attention) first, then ascending windows
    layer_counts: dict = field(default_factory=lambda: {None: 1})  # layers per kind
    rounds_option: str = "auto"  # the rounds option the kinds' round orders are chosen with
    _kinds: dict = field(default_factory=dict, init=False, repr=False)
    _schedules: dict = field(default_factory=dict, init=False, repr=False)
    _device_schedules: dict = field(default_factory=dict, init=False, repr=False)
    _part_tokens: dict = field(default_factory=dict, init=False, repr=False)
    _chunks: dict = field(default_factory=dict, init=False, repr=False)  # chunked layers' plans (.chunks.chunked_plan)

    def __post_init__(self) -> None:
        self._kinds.setdefault(self.windows[0], KindPlan(self.windows[0], self.transfers, self.pieces,
                                                         self.round_order))

    def kind(self, window: Window) -> KindPlan:
        """The transfers and rounds of the layers with ``window`` (``None``: full attention; a window at least the
        longest document is the full kind). A kind not planned for is planned now, exactly, and cached."""
        w = kind_of(window, self.layout)
        if w not in self._kinds:
            log_once(logger, logging.INFO, ("kind on demand", w, self.windows),
                     "hsap plan: mask %s was not planned for (the plan's kinds: %s); planning its transfers now "
                     "(exact; pass windows=hf_hsap.attention_windows(config) to plan for every kind)",
                     "full" if w is None else f"window {w}", list(self.windows))
            self._kinds[w] = plan_kind(self.layout, self.placement, w, self.cost, self.recv_budget_tokens,
                                       self.rounds_option)
        return self._kinds[w]

    def transfers_for(self, window: Window) -> Transfers:
        """The minimal KV transfers of the layers with ``window`` (:meth:`kind`)."""
        return self.kind(window).transfers

    def pieces_for(self, window: Window) -> RoundPieces:
        """The round pieces of the layers with ``window`` (:meth:`kind`)."""
        return self.kind(window).pieces

    @property
    def size(self) -> int:
        """P: ranks of the group."""
        return self.group.size

    @property
    def ulysses_size(self) -> int:
        """U: ranks of an intra (all-to-all) group."""
        return self.group.ulysses_size

    @property
    def sp(self) -> None:
        """The process groups: none here (an :class:`~hf_hsap.sp_plan.SPPlan` carries its SPGroup)."""
        return None

    @property
    def rank(self) -> int | None:
        """The planning rank (None for an offline plan)."""
        return self.group.rank

    @property
    def n_parts(self) -> int:
        """R: parts of the placement (P / U)."""
        return self.placement.n_parts

    @property
    def total_tokens(self) -> int:
        """T: tokens of the layout."""
        return self.layout.total_tokens

    @property
    def placement_name(self) -> str:
        """The placement's name (``"balanced"``, ...)."""
        return self.placement.name

    @property
    def shape(self) -> PipelineShape:
        """How the runtime runs this plan's rounds (:func:`~.pipeline.pipeline_shape`)."""
        return pipeline_shape(self.pieces.n_rounds, self.recv_budget_tokens is not None)

    def _resolve(self, rank: int | None) -> int:
        r = self.rank if rank is None else rank
        if r is None:
            raise ValueError("this plan was made offline (int group size): pass rank=...")
        if not 0 <= r < self.size:
            raise ValueError(f"rank {r} out of range for SP size {self.size}")
        return r

    def part_token_indices(self, part: int) -> np.ndarray:
        """``[n_part_tokens]`` global positions held by a part, in plan order."""
        if part not in self._part_tokens:
            lo, hi = self.placement.part_ptr[part], self.placement.part_ptr[part + 1]
            pl = self.placement
            self._part_tokens[part] = ranges_to_index(pl.start[lo:hi], pl.end[lo:hi] - pl.start[lo:hi])
        return self._part_tokens[part]

    def intra_bounds(self, part: int) -> np.ndarray:
        """``[U + 1]`` offsets of a part's intra slices: slice ``u`` is ``part_token_indices(part)[b[u]:b[u + 1]]``."""
        n = self.part_token_indices(part).shape[0]
        U = self.ulysses_size
        return (np.arange(U + 1, dtype=np.int64) * n) // U  # [U + 1]

    def intra_sizes(self, part: int) -> tuple[int, ...]:
        """``[U]`` tokens of each intra slice of a part (what the intra all-to-all exchanges)."""
        b = self.intra_bounds(part)
        return tuple(int(x) for x in (b[1:] - b[:-1]))

    def local_token_indices(self, rank: int | None = None) -> torch.Tensor:
        """``[T_local]`` int64 global positions held by ``rank`` (default: this rank), in local order."""
        part, u = divmod(self._resolve(rank), self.ulysses_size)
        b = self.intra_bounds(part)
        return torch.from_numpy(self.part_token_indices(part)[b[u]:b[u + 1]])

    def num_local_tokens(self, rank: int | None = None) -> int:
        """Tokens held by ``rank`` (default: this rank)."""
        part, u = divmod(self._resolve(rank), self.ulysses_size)
        b = self.intra_bounds(part)
        return int(b[u + 1] - b[u])

    def shard(self, x: torch.Tensor, dim: int = 0, rank: int | None = None) -> torch.Tensor:
        """This rank's tokens of a global tensor. Shapes: ``[..., T, ...] -> [..., T_local, ...]``."""
        if x.shape[dim] != self.total_tokens:
            raise ValueError(f"shard: dim {dim} has {x.shape[dim]} tokens but the plan covers "
                             f"{self.total_tokens}; pass the global (flattened) batch")
        idx = self.local_token_indices(rank).to(x.device)
        return x.index_select(dim, idx)

    def unshard(self, shards: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
        """Inverse of :meth:`shard` given every rank's shard in SP rank order.
        Shapes: ``P x [..., T_local(r), ...] -> [..., T, ...]``."""
        if len(shards) != self.size:
            raise ValueError(f"unshard needs {self.size} shards (one per SP rank), got {len(shards)}")
        cat = torch.cat(shards, dim=dim)
        order = torch.cat([self.local_token_indices(r) for r in range(self.size)]).to(cat.device)
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.shape[0], device=order.device)
        return cat.index_select(dim, inv)

    def gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """All ranks' shards in global order: only for one rank here; larger groups gather through
        :class:`hf_hsap.sp_plan.SPPlan` (what ``hf_hsap.plan_sequence(cu_seqlens, sp)`` returns)."""
        if self.size == 1:
            return self.unshard([x], dim)
        raise ValueError("gather needs a plan made with an SPGroup; offline plans use unshard()")

    def schedule(self, part: int | None = None, device: torch.device | str | None = None, *,
                 window: Window | str = "first") -> Schedule:
        """The compiled schedule of ``part`` (default: this rank's) for the layers with ``window`` (default the first
        kind), built once and cached; with ``device``, a cached copy whose index tensors live there."""
        if part is None:
            part = self._resolve(None) // self.ulysses_size
        kind = self.kind(self.windows[0] if window == "first" else window)
        skey = (part, kind.window)
        if skey not in self._schedules:
            keep = self.recv_budget_tokens is None
            self._schedules[skey] = (
                compile_schedule(self.layout, self.placement, kind.pieces, part, keep_recv=keep)
                if kind.window is None else
                compile_window_schedule(self.layout, self.placement, kind.pieces, part, keep, kind.window))
        sched = self._schedules[skey]
        if device is None or torch.device(device).type == "cpu":
            return sched
        key = (part, kind.window, str(torch.device(device)))
        if key not in self._device_schedules:
            self._device_schedules[key] = sched.to(torch.device(device))
        return self._device_schedules[key]

    def stats(self, window: Window | str = "first") -> PlanStats:
        """Exact per-rank figures of what the runtime executes (:func:`.stats.plan_stats`): top level for the layers
        with ``window`` (default the first kind), :attr:`~.stats.PlanStats.kinds` for every kind planned for."""
        kind = self.kind(self.windows[0] if window == "first" else window)
        return plan_stats(self.layout, self.placement, kind, [self.kind(w) for w in self.windows], cost=self.cost,
                          ulysses_size=self.ulysses_size,
                          local_tokens=[self.num_local_tokens(r) for r in range(self.size)],
                          layer_counts=self.layer_counts)
