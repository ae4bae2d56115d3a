"""PlanStats: the exact figures of what a plan's runtime executes, as a typed record. Lists are per SP rank (``[P]``)
unless said otherwise; with ``U > 1`` a rank computes its part's pairs for ``1 / U`` of the heads, so its work is the
part's over ``U``. With a window, only the pairs it keeps and the keys it sees count."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


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
