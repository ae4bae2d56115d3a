"""hf_hsap's plans as :class:`~benchmarks.analytic.schemes.SchemeStats`: per-GPU counts, communication phases
and the SAP rounds (:class:`~benchmarks.analytic.schemes.RoundSchedule`) that the cost model simulates."""
from __future__ import annotations

import numpy as np

from typing import Any, Mapping

from hf_hsap.model_shape import ModelShape
from hf_hsap.plan.stats import PlanStats

from .distributions import useful_pairs
from .schemes import (LLAMA3_8B_SHAPE, CommPhase, RoundSchedule, SchemeStats, _heads_ok, _kv_share,
                      _split, _ulysses_phases)


def _field(stats: PlanStats | Mapping[str, Any], name: str) -> Any:
    """A figure of ``stats``: the attribute of a :class:`~hf_hsap.plan.stats.PlanStats`, or the entry of a
    hand-made mapping (None when absent)."""
    return getattr(stats, name, None) if isinstance(stats, PlanStats) else stats.get(name)


def hsap_stats_from_plan(stats: PlanStats | Mapping[str, Any], shape: ModelShape = LLAMA3_8B_SHAPE, gpus_per_node: int = 8, U: int = 1,
                         lengths: np.ndarray | None = None, bwd_refetch_kv: bool = False,
                         name: str = "hsap") -> SchemeStats:
    """Adapt ``hf_hsap.Plan.stats()`` to :class:`SchemeStats`.

    The plan is over ``R`` parts; with ``U > 1`` part ``i`` is the Ulysses group of GPUs
    ``i*U .. i*U+U-1`` (each holds ``1/U`` of the part's tokens and heads) and the SAP transfer from
    part ``i`` to part ``j`` runs between GPUs of equal index ``u`` in the two groups.

    Args:
        stats: ``Plan.stats()`` (a :class:`~hf_hsap.plan.stats.PlanStats`), or a mapping with the same
            names (hand-made, e.g. by part): lists ``tokens``, ``attn_work``, ``recv_kv_tokens`` either by SP rank (length ``P``,
            work already divided by ``U``, as ``Plan.stats()`` returns) or by part (length ``R``), and
            ``send_kv_pairs`` (``R × R``: KV tokens part ``i`` sends part ``j`` in the forward pass);
            optional ``local_attn_work`` (work needing no remote KV; hides the transfers), else
            ``remote_attn_work``; without either, nothing is hidden.
        shape: head shape; gpus_per_node: GPUs per node; U: Ulysses degree inside each part.
        lengths: the layout, for exact ``T`` / ``useful_pairs`` (default: from the stats).
        bwd_refetch_kv: whether backward fetches the remote KV again (default: kept from forward);
            backward always returns the dK/dV partials to their owners (the transposed matrix).
        name: scheme name.

    Returns:
        Counts over ``P = R U`` GPUs.
    """
    send = np.asarray(_field(stats, "send_kv_pairs"), dtype=np.float64)  # [R, R] src -> dst
    R = send.shape[0]
    P = R * U
    get = lambda k: np.asarray(_field(stats, k), dtype=np.float64)  # noqa: E731
    work = get("attn_work")
    hide = get("local_attn_work") if _field(stats, "local_attn_work") is not None else (
        work - get("remote_attn_work") if _field(stats, "remote_attn_work") is not None else np.zeros_like(work))
    g = np.arange(P)
    n_tok = len(_field(stats, "tokens"))
    per_rank = n_tok == P and U > 1  # lists by SP rank (work already / U) or by part
    if not per_rank and n_tok != R:
        raise ValueError(f"stats of {n_tok} entries fit neither R={R} parts nor P={P} ranks")
    sel = g if per_rank else g // U
    tok = get("tokens").astype(np.int64) if per_rank else _split(get("tokens"), U)
    work, hide = work[sel] / (1 if per_rank else U), hide[sel] / (1 if per_rank else U)
    part, u = g // U, g % U
    node = g // gpus_per_node
    share = _kv_share(U, shape)
    kvb = shape.kv_token_bytes * share
    remote = ((np.arange(R)[:, None] * U + u[None, :]) // gpus_per_node) != node[None, :]  # [R(peer part), P]
    fwd = send[:, part]  # [R, P] KV tokens GPU g receives from each part
    back = send[part, :].T  # [R, P] dK/dV partials coming back from the parts g's part fed
    fwd_intra, fwd_inter = (fwd * ~remote).sum(0) * kvb, (fwd * remote).sum(0) * kvb
    b_intra, b_inter = (back * ~remote).sum(0) * kvb, (back * remote).sum(0) * kvb
    phases = [CommPhase("p2p_kv", False, "local", fwd_intra, fwd_inter, 1),
              CommPhase("p2p_dkv", True, "local", b_intra + bwd_refetch_kv * fwd_intra,
                        b_inter + bwd_refetch_kv * fwd_inter, 1 + int(bwd_refetch_kv))]
    recv = get("recv_kv_tokens")[sel] * share
    if U > 1:
        a2a, recv_u = _ulysses_phases(tok, U, shape, gpus_per_node)
        phases += a2a
        recv = recv + recv_u
    T = int(np.sum(lengths)) if lengths is not None else int(tok.sum())
    pairs = useful_pairs(lengths) if lengths is not None else int(round(work.sum()))
    return SchemeStats(name, P, T, pairs, tok, work, recv,
                       sum((p.bytes_intra for p in phases), np.zeros(P)),
                       sum((p.bytes_inter for p in phases), np.zeros(P)), True, _heads_ok(U, shape),
                       "from hf_hsap plan stats", phases, None, hide, shape, gpus_per_node,
                       _round_schedule(stats, R, U, kvb, gpus_per_node, bwd_refetch_kv))


def _round_schedule(stats: PlanStats | Mapping[str, Any], R: int, U: int, kvb: float, gpn: int,
                    refetch: bool) -> RoundSchedule | None:
    """The plan's rounds (``PlanStats.round_*``) as :class:`RoundSchedule`; None without them."""
    transfers = _field(stats, "round_transfers")
    if transfers is None:
        return None
    n = len(transfers)
    z = lambda: np.zeros((R, n))  # noqa: E731
    recv_i, recv_x, ret_i, ret_x = z(), z(), z(), z()
    peers = np.zeros((n, R, R), dtype=bool)
    for t, trs in enumerate(transfers):
        for dst, src, tokens in trs:
            inter = (dst * U) // gpn != (src * U) // gpn  # GPUs u of both parts: nodes differ alike
            (recv_x if inter else recv_i)[dst, t] += tokens * kvb
            (ret_x if inter else ret_i)[src, t] += tokens * kvb
            peers[t, dst, src] = True
    work = np.asarray(_field(stats, "round_remote_work"), dtype=np.float64).reshape(R, n) / U
    return RoundSchedule(np.arange(R * U) // U, recv_i, recv_x, ret_i, ret_x, work, peers, refetch)
