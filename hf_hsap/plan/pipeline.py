"""Rounds: how a plan's KV transfers are grouped in time, and what that costs.

Two orders (``plan_sequence(..., rounds=...)``):

* ``"batched"``: every transfer in one round. Fewest kernel calls and latencies; the remote work of
  a part waits for *all* its KV (``max(local, transfer) + remote``).
* ``"by_peer"``: round ``t`` carries what every part receives from the part ``t + 1`` places before it
  on the ring of parts (``src = (dst - t - 1) mod R``), rounds nobody uses dropped. Each round is a
  permutation (one sender and one receiver per part, no incast); the remote items of a round run as
  soon as that round has landed while later rounds are still on the wire, as in a KV ring, but
  carrying only the tokens the documents need.

A receive budget then cuts every round further (:func:`split_rounds`). :func:`simulate_forward` /
:func:`simulate_backward` time a set of rounds by dataflow, in the runtime's order: without a budget
every round is posted at once and consumed in order; with one, rounds are double-buffered. ``auto``
picks the cheaper order with them, and ``benchmarks/cost_model.py`` predicts hf_hsap's attention
time with the same functions.
"""
from __future__ import annotations

import numpy as np

from .layout import Layout
from .placement import Placement
from .transfers import Transfers

ROUND_ORDERS = ("auto", "batched", "by_peer")


def split_rounds(tr: Transfers, n_parts: int, budget: int | None, order: str = "batched") -> dict[str, np.ndarray]:
    """Cut the transfers into rounds (``order``, module docstring); with ``budget``, no part receives,
    nor sends, more than ``budget`` rows in one round.

    Bounding both sides bounds every buffer of a round: the forward KV receive buffer, the send
    buffer, and in the backward the dK/dV rows that come back (as many as were sent). Greedy: each
    transfer row goes, piece by piece, to the earliest round (of its base round's group) with room
    at both its ends.

    Returns arrays ``[n_pieces]``: ``round``, ``src``, ``dst``, ``start``, ``end``, ``src_local``,
    sorted by (round, dst, src, start).
    """
    if order not in ("batched", "by_peer"):
        raise ValueError(f"unknown round order {order!r}; use 'batched' or 'by_peer'")
    n = tr.src.shape[0]
    base = np.zeros(n, dtype=np.int64) if order == "batched" else (tr.dst - tr.src) % max(n_parts, 1) - 1
    if budget is None or n == 0:  # one round per base round, renumbered densely
        rnd = np.unique(base, return_inverse=True)[1].reshape(-1) if n else base
        o = np.lexsort((tr.start, tr.src, tr.dst, rnd))
        return dict(round=rnd[o], dst=tr.dst[o], src=tr.src[o], start=tr.start[o], end=tr.end[o],
                    src_local=tr.src_local[o])
    rows: list[tuple[int, int, int, int, int, int]] = []
    offset = 0
    for b in np.unique(base).tolist():
        sel = np.nonzero(base == b)[0]
        used = 0
        recv_used: list[list[int]] = [[] for _ in range(n_parts)]  # [part][round] rows
        send_used: list[list[int]] = [[] for _ in range(n_parts)]
        for i in sel.tolist():
            src, dst, start, end = int(tr.src[i]), int(tr.dst[i]), int(tr.start[i]), int(tr.end[i])
            loc = int(tr.src_local[i])
            pos, t = start, 0
            while pos < end:
                for u in (recv_used[dst], send_used[src]):
                    while len(u) <= t:
                        u.append(0)
                room = min(budget - recv_used[dst][t], budget - send_used[src][t])
                if room <= 0:
                    t += 1
                    continue
                take = min(room, end - pos)
                rows.append((offset + t, dst, src, pos, pos + take, loc + pos - start))
                recv_used[dst][t] += take
                send_used[src][t] += take
                used = max(used, t + 1)
                pos += take
        offset += used
    arr = np.array(sorted(rows), dtype=np.int64).reshape(-1, 6)
    return dict(round=arr[:, 0], dst=arr[:, 1], src=arr[:, 2], start=arr[:, 3], end=arr[:, 4], src_local=arr[:, 5])


def piece_remote_work(layout: Layout, pl: Placement, pieces: dict[str, np.ndarray]) -> np.ndarray:
    """``[n_pieces]`` (query, key) pairs the receiving part computes against each piece.

    A piece ``[s, e)`` of document ``d`` lies between the receiver's segments of ``d``, so it is seen
    in full by every receiver segment that starts at or after ``e``: pairs = ``(e - s) · (tokens of
    d the receiver holds at positions >= e)``.
    """
    if pieces["start"].shape[0] == 0:
        return np.zeros(0, dtype=np.float64)
    span = layout.total_tokens + 1
    comp = (pl.part * (layout.n_docs + 1) + pl.doc) * span + pl.start  # [n_seg] (part, doc, start)
    o = np.argsort(comp, kind="stable")
    comp = comp[o]
    suffix = np.concatenate([np.cumsum((pl.end - pl.start)[o][::-1])[::-1], [0]]).astype(np.float64)  # [n_seg + 1]
    group = pieces["dst"] * (layout.n_docs + 1) + layout.doc_of(pieces["start"])
    j = np.searchsorted(comp, group * span + pieces["end"], side="left")  # first segment at/after the piece
    hi = np.searchsorted(comp, (group + 1) * span, side="left")  # end of the (part, doc) group
    return (pieces["end"] - pieces["start"]).astype(np.float64) * (suffix[j] - suffix[hi])


def round_tables(pieces: dict[str, np.ndarray], work: np.ndarray, n_parts: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-round tables of a set of pieces.

    Returns:
        recv ``[n_parts, n_rounds]`` KV rows received, remote work ``[n_parts, n_rounds]`` pairs,
        peers ``[n_rounds, n_parts, n_parts]`` bool: ``peers[t, dst, src]`` when src sends dst in round t.
    """
    n_rounds = int(pieces["round"].max()) + 1 if pieces["round"].shape[0] else 0
    recv = np.zeros((n_parts, n_rounds))
    rwork = np.zeros((n_parts, n_rounds))
    peers = np.zeros((n_rounds, n_parts, n_parts), dtype=bool)
    if n_rounds:
        np.add.at(recv, (pieces["dst"], pieces["round"]), pieces["end"] - pieces["start"])
        np.add.at(rwork, (pieces["dst"], pieces["round"]), work)
        peers[pieces["round"], pieces["dst"], pieces["src"]] = True
    return recv, rwork, peers


def _arrival(launch: np.ndarray, peers_t: np.ndarray, xfer_t: np.ndarray) -> np.ndarray:
    """``[R]`` arrival of one round at every receiver: both ends launched, then the transfer."""
    senders = np.where(peers_t, launch[None, :], -np.inf).max(axis=1)  # [R] latest sender launch
    return np.where(xfer_t > 0, np.maximum(launch, senders) + xfer_t, -np.inf)


def simulate_forward(local: np.ndarray, xfer: np.ndarray, work: np.ndarray, peers: np.ndarray,
                     eager: bool = True) -> np.ndarray:
    """``[R]`` finish time of every part's forward, in the runtime's order.

    The local item runs first; then, per round, wait for its KV and run its remote items. ``eager``
    (no receive budget): every round is posted at time 0 and the link serves them in order, round t
    of a part starting once its round t - 1 and its sender's round t - 1 are done. Otherwise (double
    buffering) round t + 1 is posted when round t has landed, and a transfer starts when both ends
    posted it.

    Args:
        local: ``[R]`` local item time. xfer: ``[R, n]`` transfer time of each round into each part
            (0: nothing received). work: ``[R, n]`` remote item time. peers: ``[n, R, R]`` (dst, src).
        eager: post every round at once.
    """
    R, n = xfer.shape
    clock = local.astype(np.float64).copy()
    launch = np.zeros(R)  # double buffering: when each part posted the current round
    link = np.zeros(R)  # eager: when each part's link finished its previous round
    for t in range(n):
        if eager:
            senders = np.where(peers[t], link[None, :], 0.0).max(axis=1)  # [R] sender's link free
            link = np.where(xfer[:, t] > 0, np.maximum(link, senders) + xfer[:, t], link)
            arrive = np.where(xfer[:, t] > 0, link, -np.inf)
        else:
            arrive = _arrival(launch, peers[t], xfer[:, t])
        start = np.maximum(clock, arrive)
        launch = start  # the next round is posted once this one has landed
        clock = start + work[:, t]
    return clock


def simulate_backward(local: np.ndarray, xfer: np.ndarray, work: np.ndarray, peers: np.ndarray,
                      ret: np.ndarray, refetch: bool) -> np.ndarray:
    """``[R]`` finish time of every part's backward, in the runtime's order.

    Per round: (refetch: wait for its KV, launch the next fetch) run the remote items' backward and
    send their dK/dV back to the owners; the local item's backward runs after round 0's return is
    launched. Without refetch (no budget) every return is awaited at the end; with refetch (a
    budget) the previous round's return is awaited before the next is sent.

    Args:
        local, xfer, work, peers: as :func:`simulate_forward` (backward times). ret: ``[R, n]`` time
            of the dK/dV returning to each part (its own rows) in round t. refetch: KV fetched again.
    """
    R, n = xfer.shape
    if n == 0:
        return local.astype(np.float64).copy()
    clock = np.zeros(R)
    launch = np.zeros(R)
    last = np.full(R, -np.inf)  # latest return arrival already awaited or pending
    prev = np.full(R, -np.inf)
    for t in range(n):
        if refetch:
            arrive = _arrival(launch, peers[t], xfer[:, t])
            clock = np.maximum(clock, arrive)
            launch = clock
        clock = clock + work[:, t]
        if refetch:
            clock = np.maximum(clock, prev)  # the previous round's gradients must have landed
        ret_launch = clock
        # returns travel src <- dst: part p receives from the parts it fed in round t
        senders = np.where(peers[t].T, ret_launch[None, :], -np.inf).max(axis=1)
        prev = np.where(ret[:, t] > 0, np.maximum(ret_launch, senders) + ret[:, t], -np.inf)
        last = np.maximum(last, prev)
        if t == 0:
            clock = clock + local
    return np.maximum(clock, last)
