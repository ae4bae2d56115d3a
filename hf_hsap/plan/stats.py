"""PlanStats: the exact figures of what a plan's runtime executes, as a typed record.

Lists are indexed by SP rank (``[P]``) unless said otherwise; with ``U > 1`` a rank computes its
part's pairs for ``1 / U`` of the heads, so its work is counted as the part's pairs divided by ``U``.
``benchmarks/``, ``hsap-plan`` and the tests read the attributes; :meth:`PlanStats.to_dict` gives the
JSON form.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PlanStats:
    """Per-rank figures of one plan (:meth:`hf_hsap.Plan.stats`).

    Attributes:
        placement: the placement's name. round_order: ``"batched"`` or ``"by_peer"``.
        tokens: ``[P]`` tokens held.
        attn_work: ``[P]`` (query, key) pairs computed.
        local_attn_work: ``[P]`` the part of ``attn_work`` against the rank's own keys (runs while KV
            is in flight).
        recv_kv_tokens / send_kv_tokens: ``[P]`` KV tokens received / sent per layer in the forward
            (between parts for ``U > 1``).
        a2a_tokens: ``[P]`` tokens of q, k, v and out each rank moves through the intra all-to-all per
            layer forward (0 for ``U == 1``).
        rounds: number of communication rounds.
        send_kv_pairs: ``[R][R]`` KV tokens part i sends to part j.
        round_recv_kv / round_remote_work: ``[R][rounds]`` KV tokens received and pairs against them,
            per part and round.
        round_transfers: ``[rounds]`` lists of ``(dst, src, KV tokens)`` between parts in the round.
        est_time: ``[P]`` the cost model's step time of each rank in attention pairs
            (``token_cost * tokens + max(local work, kv_token_cost * recv) + remote work`` of its part,
            divided by ``U``; round latency and the ``by_peer`` overlap left out): ``placement="auto"``
            keeps the candidate whose estimate, summed over the model's layers of each kind, is the smallest.
        kinds: :class:`KindStats` of every mask kind the plan was made for, keyed by :func:`kind_name`
            (``"full"``, ``"window=1024"``); the figures above are of one of them (``Plan.stats(window=...)``).

    With a sliding window, work counts only the pairs the window keeps and the KV only the keys it sees.
    """

    placement: str
    round_order: str
    tokens: list[int]
    attn_work: list[float]
    local_attn_work: list[float]
    recv_kv_tokens: list[int]
    send_kv_tokens: list[int]
    a2a_tokens: list[int]
    rounds: int
    send_kv_pairs: list[list[int]]
    round_recv_kv: list[list[int]]
    round_remote_work: list[list[float]]
    round_transfers: list[list[list[int]]]
    est_time: list[float]
    kinds: dict[str, "KindStats"] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The figures as a plain (JSON-ready) dict keyed by attribute name."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class KindStats:
    """Per-rank figures of the layers of one mask kind (lists indexed by SP rank, as :class:`PlanStats`).

    Attributes:
        window: the kind's sliding window (``None``: full attention). layers: the model's layers of it.
        tokens: ``[P]`` tokens held (every kind shares the placement, so the same for all kinds).
        attn_work / local_attn_work: ``[P]`` pairs a layer computes, and those against the rank's own keys.
        recv_kv_tokens / send_kv_tokens: ``[P]`` KV tokens received / sent per layer (forward).
        rounds: communication rounds of a layer. round_order: ``"batched"`` or ``"by_peer"``.
    """

    window: int | None
    layers: int
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
