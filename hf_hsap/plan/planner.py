"""The planner: layout + SP group -> :class:`Plan` (placement, minimal transfers, compiled schedule).

Pure and device-free: numpy on the host. Every rank computes the same plan from the same layout.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .balanced import balanced, balanced_variants
from .cache import PlanCache
from .cost import CostModel, choose_placement, local_work_per_part, part_times, round_order_times
from .pipeline import ROUND_ORDERS, piece_remote_work, round_tables
from .layout import Layout, make_layout
from .placement import DEFAULT_TOKEN_SLACK, PLACEMENTS, Placement, contiguous, zigzag
from .schedule import Schedule, compile_schedule, ranges_to_index, split_rounds
from .transfers import Transfers, compute_transfers


AUTO_TOKEN_SLACKS = (0.01, 0.03)  # the balanced candidates of placement="auto" (capped by token_slack)


class Plan:
    """For one layout and one SP group: the placement, the KV each rank needs from each peer, and the
    compiled per-part schedules. Tokens of a rank are in *plan order* (sorted by global position).

    With ``U > 1`` the placement is made at group granularity (``R`` parts of ``U`` ranks); inside a
    part, the part's tokens are cut into ``U`` consecutive pieces, piece ``u`` on intra rank ``u``.
    """

    def __init__(self, layout: Layout, placement: Placement, transfers: Transfers, size: int,
                 ulysses_size: int, rank: int | None, sp: Any, recv_budget_tokens: int | None,
                 round_order: str = "batched", pieces: dict[str, np.ndarray] | None = None,
                 cost: CostModel | None = None) -> None:
        self.layout = layout
        self.placement = placement
        self.transfers = transfers
        self.size = size
        self.ulysses_size = ulysses_size
        self.rank = rank
        self.sp = sp
        self.recv_budget_tokens = recv_budget_tokens
        self.round_order = round_order
        self.cost = cost  # the cost model the plan was made with (None: unknown)
        self._pieces = pieces if pieces is not None else split_rounds(transfers, placement.n_parts,
                                                                      recv_budget_tokens, round_order)
        self._schedules: dict[int, Schedule] = {}
        self._device_schedules: dict[tuple[int, str], Schedule] = {}
        self._part_tokens: dict[int, np.ndarray] = {}

    # ----------------------------------------------------------------------------- tokens
    @property
    def total_tokens(self) -> int:
        return self.layout.total_tokens

    @property
    def n_parts(self) -> int:
        """R: parts of the placement (SP size / Ulysses size)."""
        return self.placement.n_parts

    @property
    def placement_name(self) -> str:
        return self.placement.name

    def _resolve(self, rank: int | None) -> int:
        r = self.rank if rank is None else rank
        if r is None:
            raise ValueError("this plan was made offline (int group size): pass rank=...")
        if not 0 <= r < self.size:
            raise ValueError(f"rank {r} out of range for SP size {self.size}")
        return r

    def part_token_indices(self, part: int) -> np.ndarray:
        """Global positions held by a part, in plan order. Shape ``[n_part_tokens]``."""
        if part not in self._part_tokens:
            lo, hi = self.placement.part_ptr[part], self.placement.part_ptr[part + 1]
            pl = self.placement
            self._part_tokens[part] = ranges_to_index(pl.start[lo:hi], pl.end[lo:hi] - pl.start[lo:hi])
        return self._part_tokens[part]

    def _piece_bounds(self, part: int) -> np.ndarray:
        n = self.part_token_indices(part).shape[0]
        U = self.ulysses_size
        return (np.arange(U + 1, dtype=np.int64) * n) // U  # [U + 1]

    def local_token_indices(self, rank: int | None = None) -> torch.Tensor:
        """Global positions held by ``rank`` (default: this rank), in local order. ``[T_local]`` int64."""
        r = self._resolve(rank)
        part, u = divmod(r, self.ulysses_size)
        b = self._piece_bounds(part)
        return torch.from_numpy(self.part_token_indices(part)[b[u]:b[u + 1]])

    def num_local_tokens(self, rank: int | None = None) -> int:
        r = self._resolve(rank)
        part, u = divmod(r, self.ulysses_size)
        b = self._piece_bounds(part)
        return int(b[u + 1] - b[u])

    def shard(self, x: torch.Tensor, dim: int = 0, rank: int | None = None) -> torch.Tensor:
        """This rank's tokens of a global tensor. Shapes: ``[..., T, ...] -> [..., T_local, ...]``."""
        if x.shape[dim] != self.total_tokens:
            raise ValueError(f"shard: dim {dim} has {x.shape[dim]} tokens but the plan covers "
                             f"{self.total_tokens}; pass the global (flattened) batch")
        idx = self.local_token_indices(rank).to(x.device)
        return x.index_select(dim, idx)

    def unshard(self, pieces: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
        """Inverse of :meth:`shard` given every rank's piece (in SP rank order)."""
        if len(pieces) != self.size:
            raise ValueError(f"unshard needs {self.size} pieces, got {len(pieces)}")
        cat = torch.cat(pieces, dim=dim)
        order = torch.cat([self.local_token_indices(r) for r in range(self.size)]).to(cat.device)
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.shape[0], device=order.device)
        return cat.index_select(dim, inv)

    def gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """All ranks' pieces back in global order (collective over the SP group; differentiable only
        as a value, not through other ranks). Shapes: ``[..., T_local, ...] -> [..., T, ...]``."""
        if self.size == 1:
            return self.unshard([x], dim)
        if self.sp is None or getattr(self.sp, "group", None) is None:
            raise ValueError("gather needs a plan made with an SPGroup; offline plans use unshard()")
        import torch.distributed as dist

        x = x.movedim(dim, 0).contiguous()
        n_max = max(self.num_local_tokens(r) for r in range(self.size))
        padded = torch.zeros((n_max, *x.shape[1:]), dtype=x.dtype, device=x.device)
        padded[: x.shape[0]] = x
        bufs = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(bufs, padded, group=self.sp.group)
        pieces = [b[: self.num_local_tokens(r)] for r, b in enumerate(bufs)]
        return self.unshard(pieces, 0).movedim(0, dim)

    # ----------------------------------------------------------------------------- schedule
    def schedule(self, part: int | None = None, device: torch.device | str | None = None) -> Schedule:
        """The compiled schedule of a part (default: this rank's), built once and cached; with
        ``device``, a copy whose index tensors live there (cached too: one host-to-device copy per plan)."""
        if part is None:
            part = self._resolve(None) // self.ulysses_size
        if part not in self._schedules:
            self._schedules[part] = compile_schedule(self.layout, self.placement, self._pieces, part,
                                                     keep_recv=self.recv_budget_tokens is None)
        sched = self._schedules[part]
        if device is None or torch.device(device).type == "cpu":
            return sched
        key = (part, str(torch.device(device)))
        if key not in self._device_schedules:
            self._device_schedules[key] = sched.to(torch.device(device))
        return self._device_schedules[key]

    # ----------------------------------------------------------------------------- stats
    def stats(self) -> dict[str, Any]:
        """Exact per-rank figures of what the runtime executes (lists indexed by SP rank).

        Returns:
            dict with ``tokens`` (tokens held), ``attn_work`` ((query, key) pairs computed; with
            ``U > 1`` a rank computes its group's pairs for 1/U of the heads, counted as pairs / U),
            ``local_attn_work`` (the part of ``attn_work`` against the rank's own keys, which runs while
            KV is in flight), ``recv_kv_tokens`` (KV tokens received per layer in the forward pass, inter-group for
            ``U > 1``), ``send_kv_tokens``, ``a2a_tokens`` (tokens of q, k, v and out each rank moves
            through the intra all-to-all per layer forward: 0 for ``U == 1``), ``rounds``,
            ``send_kv_pairs`` (``[R][R]`` matrix of KV tokens part i sends to part j), ``placement``,
            ``round_order``, and per part and round (``[R][rounds]``): ``round_recv_kv`` (KV tokens),
            ``round_remote_work`` (pairs against them), ``round_transfers`` (``[rounds]`` lists of
            ``(dst, src, KV tokens)`` between parts in the round); with a cost model, ``est_time``: each
            rank's estimated step time in attention pairs (``token_cost * tokens + max(local work,
            kv_token_cost * recv) + remote work`` of its part, divided by ``U``; round latency and the
            ``by_peer`` overlap left out): ``placement="auto"`` keeps the candidate whose largest
            estimate is the smallest.
        """
        pl, U = self.placement, self.ulysses_size
        work = pl.work_per_part(self.layout)
        local = local_work_per_part(self.layout, pl)
        ptok = pl.tokens_per_part()
        lengths = self.transfers.lengths
        recv = np.bincount(self.transfers.dst, weights=lengths, minlength=pl.n_parts).astype(np.int64)
        send = np.bincount(self.transfers.src, weights=lengths, minlength=pl.n_parts).astype(np.int64)
        ranks = range(self.size)
        n_rounds = int(self._pieces["round"].max()) + 1 if self._pieces["round"].shape[0] else 0
        return {
            "placement": pl.name,
            "tokens": [self.num_local_tokens(r) for r in ranks],
            "attn_work": [int(work[r // U]) / U if U > 1 else int(work[r]) for r in ranks],
            "local_attn_work": [int(local[r // U]) / U if U > 1 else int(local[r]) for r in ranks],
            "recv_kv_tokens": [int(recv[r // U]) for r in ranks],
            "send_kv_tokens": [int(send[r // U]) for r in ranks],
            "a2a_tokens": [int(ptok[r // U] - self.num_local_tokens(r)) if U > 1 else 0 for r in ranks],
            "rounds": n_rounds,
            "send_kv_pairs": self.transfers.pair_matrix(pl.n_parts).tolist(),
            "round_order": self.round_order,
            **self._round_stats(),
            **({} if self.cost is None else {"est_time": self._est_time()}),
        }

    def _est_time(self) -> list[float]:
        """``[P]`` the cost model's step time of every rank (see :meth:`stats`)."""
        per_part = part_times(self.layout, self.placement, self.transfers, self.cost)  # [R]
        return [float(t) / self.ulysses_size for t in np.repeat(per_part, self.ulysses_size)]

    def _round_stats(self) -> dict[str, Any]:
        pc, R = self._pieces, self.placement.n_parts
        recv, rwork, _ = round_tables(pc, piece_remote_work(self.layout, self.placement, pc), R)
        n = recv.shape[1]
        mat = np.zeros((n, R, R), dtype=np.int64)  # [round, dst, src] KV tokens
        np.add.at(mat, (pc["round"], pc["dst"], pc["src"]), pc["end"] - pc["start"])
        return {"round_recv_kv": recv.astype(np.int64).tolist(), "round_remote_work": rwork.tolist(),
                "round_transfers": [[[int(d), int(s_), int(m[d, s_])] for d, s_ in np.argwhere(m)] for m in mat]}


def offline_link(size: int, gpus_per_node: int | None) -> str:
    """The link SAP's KV crosses for an offline group of ``size`` ranks: ``"nvlink"`` when the group fits
    in one node of ``gpus_per_node`` ranks, else (or unknown) ``"network"``."""
    return "nvlink" if gpus_per_node and gpus_per_node % size == 0 else "network"


def _place(layout: Layout, n_parts: int, name: str, token_slack: float,
           cost: CostModel | None, min_tokens: int = 1) -> tuple[Placement, Transfers]:
    """Build the named placement (``auto``: the cheapest candidate by :mod:`.cost`) and its transfers.
    A document-aware placement that would leave a part with fewer than ``min_tokens`` tokens (every
    rank must hold one) is replaced by ``contiguous``, which never does when ``T >= P``."""
    if name == "contiguous":
        pl = contiguous(layout, n_parts)
    elif name == "zigzag":
        pl = zigzag(layout, n_parts)
    elif name == "balanced":
        pl = balanced(layout, n_parts, token_slack=token_slack)
    elif name == "auto":
        # zigzag is not a candidate: balanced matches its balance with far less traffic (and equals it
        # for one long document), and its transfers are costly to enumerate for many short documents
        # small slacks: tokens cost every linear layer, so near-equal token counts pay even when a few
        # more documents must be split (BENCHMARKS.md); ``token_slack`` stays the cap
        slacks = sorted({min(AUTO_TOKEN_SLACKS[0], token_slack), min(AUTO_TOKEN_SLACKS[1], token_slack)})
        # priced refinement: trade a little token balance for work balance where the cost model says so;
        # the token-neutral one stays a candidate (its slides add no KV where parts wait for it)
        token_cost = (cost or CostModel.default()).token_cost
        cands = [c for eps in slacks for c in balanced_variants(layout, n_parts, (token_cost, None), eps)]
        cands.append(contiguous(layout, n_parts))
        cands = [c for c in cands if c.tokens_per_part().min() >= min_tokens]
        trs = [compute_transfers(c) for c in cands]
        best = choose_placement(layout, cands, trs, cost)
        return cands[best], trs[best]
    else:
        raise ValueError(f"unknown placement {name!r}; choose one of {', '.join(PLACEMENTS)}")
    if pl.tokens_per_part().min() < min_tokens:
        pl = contiguous(layout, n_parts)
    return pl, compute_transfers(pl)


def plan_sequence(
    cu_seqlens: torch.Tensor | np.ndarray | list[int],
    sp: Any,
    placement: str = "auto",
    *,
    ulysses_size: int = 1,
    recv_budget_tokens: int | None = None,
    rounds: str = "auto",
    token_slack: float = DEFAULT_TOKEN_SLACK,
    total_tokens: int | None = None,
    cost: CostModel | None = None,
    gpus_per_node: int | None = None,
    verify: bool = True,
    cache: PlanCache | None = None,
) -> Plan:
    """Plan document-masked attention of one packed batch over an SP group.

    Args:
        cu_seqlens: ``[n_docs + 1]`` document boundaries over the flattened batch (host or device
            tensor, numpy array or list); ``0 < ... < T``.
        sp: an :class:`~hf_hsap.topology.SPGroup`, or an int group size for offline planning
            (inspection, benchmarks; no process group needed).
        ulysses_size: U for offline planning (an SPGroup carries its own).
        placement: ``"contiguous"``, ``"zigzag"``, ``"balanced"`` or ``"auto"``: the cheapest by ``cost``
            of ``balanced`` with token slack 0.01 and 0.03 (at most ``token_slack``), and ``contiguous``.
        recv_budget_tokens: at most this many KV tokens in a receive buffer (and sent per round);
            more is moved in further rounds, and the backward fetches the KV again instead of keeping
            it. ``None``: no limit.
        rounds: how transfers are grouped in time (:mod:`hf_hsap.plan.pipeline`): ``"batched"`` (one
            round with every peer), ``"by_peer"`` (one ring distance per round: later peers' KV
            arrives while this peer's remote items run) or ``"auto"``: ``by_peer`` when ``cost``
            predicts it at least 1% faster for the slowest part (forward + backward), else
            ``batched`` (fewer, larger kernel calls).
        token_slack: epsilon of the ``balanced`` token cap ``ceil(T/P) * (1 + eps)``; for ``auto``, the
            largest slack its candidates may use.
        total_tokens: if given, must equal ``cu_seqlens[-1]``.
        cost: the cost model ``auto`` minimises. Default: the SPGroup's ``cost_model`` if set, else
            ``CostModel.for_link(link)``, with ``link``
            ``"nvlink"`` when the whole SP group is inside one node (``sp.sap_link``; offline: ``size``
            divides ``gpus_per_node``), else ``"network"``.
        gpus_per_node: for offline planning, the ranks per node (an SPGroup carries its own).
        verify: with an SPGroup, compare the layout hash across the group (one tiny all-gather) and
            raise on every rank if they differ.
        cache: plan cache (default: the SPGroup's own; offline planning caches only when given one).

    Returns:
        The :class:`Plan` (cached: equal layouts and options return the same object).

    Raises:
        ValueError: bad ``cu_seqlens``, unknown placement, fewer tokens than parts, ranks with
            different layouts, a non-positive budget.
    """
    from ..topology import SPGroup

    layout = make_layout(cu_seqlens, total_tokens)
    if isinstance(sp, SPGroup):
        size, U, rank = sp.size, sp.ulysses_size, sp.rank
        cache = cache or sp.plan_cache
        link = sp.sap_link
        cost = cost or sp.cost_model
    elif isinstance(sp, (int, np.integer)) and not isinstance(sp, bool):
        size, U, rank = int(sp), int(ulysses_size), None
        if size < 1 or U < 1 or size % U != 0:
            raise ValueError(f"the SP size ({size}) must be a positive multiple of ulysses_size ({U})")
        link = offline_link(size, gpus_per_node)
    else:
        raise ValueError(f"sp must be an SPGroup (from hf_hsap.init_sequence_parallel) or an int, got {type(sp)}")
    if recv_budget_tokens is not None and recv_budget_tokens < 1:
        raise ValueError("recv_budget_tokens must be a positive number of tokens (or None for no limit)")
    if rounds not in ROUND_ORDERS:
        raise ValueError(f"unknown rounds {rounds!r}; choose one of {', '.join(ROUND_ORDERS)}")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; choose one of {', '.join(PLACEMENTS)}")
    if layout.total_tokens < size:  # every rank (and every intra piece) must hold a token
        raise ValueError(f"the batch has {layout.total_tokens} tokens but the SP group has {size} ranks; "
                         "every rank needs at least one token: pack longer rows or use a smaller sp_size")
    if isinstance(sp, SPGroup) and verify and size > 1:
        check_same_layout(layout, sp)
    cost = cost or CostModel.for_link(link)
    key = (layout.digest, size, U, placement, recv_budget_tokens, rounds, token_slack, cost, rank)

    def build() -> Plan:
        ucost = cost.for_ulysses(U)  # tokens also cross the all-to-all when U > 1
        pl, tr = _place(layout, size // U, placement, token_slack, ucost, min_tokens=U)
        order, pieces = rounds, None
        if rounds == "auto":
            times = round_order_times(layout, pl, tr, ucost, recv_budget_tokens)
            order = "by_peer" if times["by_peer"][0] < 0.99 * times["batched"][0] else "batched"
            pieces = times[order][1]
        return Plan(layout, pl, tr, size, U, rank, sp if isinstance(sp, SPGroup) else None, recv_budget_tokens,
                    order, pieces, ucost)

    return build() if cache is None else cache.get_or_build(key, build)


def check_same_layout(layout: Layout, sp: Any) -> None:
    """All-gather the layout hash over the SP group; raise ``ValueError`` on every rank if they differ."""
    import torch.distributed as dist

    mine = torch.tensor([layout.hash64, layout.total_tokens], dtype=torch.int64)
    if dist.get_backend(sp.group) == "nccl":
        mine = mine.cuda()
    everyone = [torch.empty_like(mine) for _ in range(sp.size)]
    try:
        dist.all_gather(everyone, mine, group=sp.group)
    except RuntimeError as err:
        from ..comm.p2p import raise_comm_error

        raise_comm_error(err, "layout check (all-gather of the layout hash)", sp.global_ranks, sp.timeout_s)
    hashes = [tuple(t.tolist()) for t in everyone]
    if len(set(hashes)) > 1:
        bad = [r for r, h in enumerate(hashes) if h != hashes[0]]
        raise ValueError(
            f"the ranks of the SP group were given different packed batches (layout hash differs on SP "
            f"ranks {bad}, tokens {[h[1] for h in hashes]}); every rank of an SP group must see the same "
            "global batch: use hf_hsap's SP data-loader adapter or the same seed/sampler on the group"
        )
