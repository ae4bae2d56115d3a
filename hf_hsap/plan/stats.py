"""A plan's report: the exact per-rank figures of what its runtime executes, as typed records, from the pieces
:meth:`Plan.stats <hf_hsap.plan.plan.Plan.stats>` passes (this module imports no Plan), for ``hsap-plan``, logs and
benchmarks; nothing here plans. Lists are per SP rank (``[P]``) unless said otherwise; with ``U > 1`` a rank computes
its part's pairs for ``1 / U`` of the heads, so its work is the part's over ``U``. With a window, only the pairs it
keeps and the keys it sees count."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .cost import CostModel, part_times
from .kinds import KindPlan
from .layout import Layout
from .placement import Placement
from .rounds import piece_remote_work, round_tables
from .windows import Window, local_work_per_part, work_per_part

__all__ = ["KindStats", "PlanStats", "kind_name", "plan_stats"]


@dataclass(frozen=True)
class PlanStats:
    """Per-rank figures of one plan (:meth:`hf_hsap.Plan.stats`), for one mask kind."""

    placement: str  # the placement's name
    round_order: str  # "batched" or "by_peer"
    tokens: list[int]  # [P] tokens held
    attn_work: list[float]  # [P] (query, key) pairs computed
    local_attn_work: list[float]  # [P] those against the rank's own keys
    recv_kv_tokens: list[int]  # [P] KV tokens received per layer forward (between parts)
    send_kv_tokens: list[int]  # [P] KV tokens sent per layer forward
    a2a_tokens: list[int]  # [P] tokens of q, k, v and out through the all-to-all per layer forward (0 at U = 1)
    rounds: int  # communication rounds
    send_kv_pairs: list[list[int]]  # [R][R] KV tokens part i sends to part j
    round_recv_kv: list[list[int]]  # [R][rounds] KV tokens received
    round_remote_work: list[list[float]]  # [R][rounds] pairs against them
    round_transfers: list[list[list[int]]]  # [rounds] lists of (dst, src, KV tokens) between parts
    est_time: list[float]  # [P] the cost model's step time in pairs (cost.part_times of the part, over U)
    kinds: dict[str, "KindStats"] = dataclasses.field(default_factory=dict)  # every mask kind's, by kind_name()

    def to_dict(self) -> dict[str, Any]:
        """The figures as a plain (JSON-ready) dict keyed by attribute name."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class KindStats:
    """Per-rank figures of the layers of one mask kind; fields as in :class:`PlanStats`."""

    window: int | None  # the sliding window (None: full attention)
    layers: int  # the model's layers of this kind
    tokens: list[int]
    attn_work: list[float]
    local_attn_work: list[float]
    recv_kv_tokens: list[int]
    send_kv_tokens: list[int]
    rounds: int
    round_order: str


def kind_name(window: int | None) -> str:
    """The key of a mask kind in :attr:`PlanStats.kinds`: ``"full"`` or ``"window=<W>"``."""
    return "full" if window is None else f"window={window}"


def plan_stats(layout: Layout, pl: Placement, kind: KindPlan, kinds: Sequence[KindPlan], *, cost: CostModel,
               ulysses_size: int, local_tokens: Sequence[int], layer_counts: Mapping[Window, int]) -> PlanStats:
    """Exact per-rank figures of what a plan's runtime executes (what :meth:`hf_hsap.plan.plan.Plan.stats` returns).

    Args:
        layout: the plan's documents. pl: its placement (``R`` parts).
        kind: the mask kind of the top-level figures. kinds: every mask kind planned for (:attr:`PlanStats.kinds`).
        cost: the plan's cost model. ulysses_size: ``U``. local_tokens: ``[P]`` tokens each SP rank holds.
        layer_counts: the model's layers per mask kind.

    Returns:
        The figures, top level for ``kind``.
    """
    U = ulysses_size
    ranks = range(len(local_tokens))
    tr, pc, R = kind.transfers, kind.pieces, pl.n_parts
    ptok = pl.tokens_per_part()
    tab = round_tables(pc, piece_remote_work(layout, pl, pc, kind.window), R)
    mat = np.zeros((pc.n_rounds, R, R), dtype=np.int64)  # [round, dst, src] KV tokens
    np.add.at(mat, (pc.round, pc.dst, pc.src), pc.lengths)
    per_part = part_times(layout, pl, tr, cost, kind.window)  # [R]
    per_kind = {kind_name(k.window): kind_stats(layout, pl, k, ulysses_size=U, local_tokens=local_tokens,
                                                layers=int(layer_counts.get(k.window, 0))) for k in kinds}
    top = per_kind.get(kind_name(kind.window)) or kind_stats(
        layout, pl, kind, ulysses_size=U, local_tokens=local_tokens, layers=int(layer_counts.get(kind.window, 0)))
    return PlanStats(
        placement=pl.name, round_order=kind.round_order, tokens=top.tokens, attn_work=top.attn_work,
        local_attn_work=top.local_attn_work, recv_kv_tokens=top.recv_kv_tokens,
        send_kv_tokens=top.send_kv_tokens,
        a2a_tokens=[int(ptok[r // U] - local_tokens[r]) if U > 1 else 0 for r in ranks],
        rounds=pc.n_rounds, send_kv_pairs=tr.pair_matrix(R).tolist(),
        round_recv_kv=tab.recv.astype(np.int64).tolist(), round_remote_work=tab.remote_work.tolist(),
        round_transfers=[[[int(d), int(s_), int(m[d, s_])] for d, s_ in np.argwhere(m)] for m in mat],
        est_time=[float(t) / U for t in np.repeat(per_part, U)], kinds=per_kind)


def kind_stats(layout: Layout, pl: Placement, kind: KindPlan, *, ulysses_size: int, local_tokens: Sequence[int],
               layers: int) -> KindStats:
    """The per-rank figures of one mask kind (arguments as :func:`plan_stats`'s; ``layers``: the model's layers of
    this kind)."""
    U, w = ulysses_size, kind.window
    work = work_per_part(layout, pl, w)
    local = local_work_per_part(layout, pl, w)
    lengths = kind.transfers.lengths
    recv = np.bincount(kind.transfers.dst, weights=lengths, minlength=pl.n_parts).astype(np.int64)
    send = np.bincount(kind.transfers.src, weights=lengths, minlength=pl.n_parts).astype(np.int64)
    ranks = range(len(local_tokens))

    def per_rank(x: np.ndarray) -> list:
        return [float(x[r // U]) / U if U > 1 else int(x[r]) for r in ranks]

    return KindStats(window=w, layers=layers, tokens=list(local_tokens), attn_work=per_rank(work),
                     local_attn_work=per_rank(local), recv_kv_tokens=[int(recv[r // U]) for r in ranks],
                     send_kv_tokens=[int(send[r // U]) for r in ranks], rounds=kind.pieces.n_rounds,
                     round_order=kind.round_order)
