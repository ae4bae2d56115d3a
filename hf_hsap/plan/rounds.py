"""Rounds: how a plan's KV transfers are grouped in time (``plan_sequence(..., rounds=...)``; running them is
:mod:`.pipeline`).

* ``"batched"``: every transfer in one round: fewest calls and latencies; a part's remote work waits for all its KV.
* ``"by_peer"``: round ``t`` carries what each part receives from the part ``t + 1`` places before it on the ring
  (``src = (dst - t - 1) mod R``), unused rounds dropped: each round is a permutation (no incast), and its remote
  items run while later rounds are on the wire, a KV ring carrying only the tokens the documents need.

A receive budget cuts every round further (:func:`split_rounds`). The result is :class:`RoundPieces`; a *piece* is
one contiguous run of KV tokens that one part sends another in one round.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layout import Layout
from .placement import Placement
from .transfers import Transfers
from .windows import piece_work

ROUND_ORDERS = ("auto", "batched", "by_peer")


@dataclass(frozen=True, eq=False)
class RoundPieces:
    """The transfers of a plan cut into rounds: ``[n_pieces]`` int64 arrays, sorted by (round, dst, src, start)."""

    round: np.ndarray  # numbered densely from 0
    src: np.ndarray  # sending part
    dst: np.ndarray  # receiving part
    start: np.ndarray  # the global token range [start, end) moved
    end: np.ndarray
    src_local: np.ndarray  # the piece's first row in the sender's local (plan-order) tokens

    def __len__(self) -> int:
        return int(self.start.shape[0])

    @property
    def n_rounds(self) -> int:
        """Number of rounds (0 when nothing moves)."""
        return int(self.round.max()) + 1 if len(self) else 0

    @property
    def lengths(self) -> np.ndarray:
        """``[n_pieces]`` KV tokens of each piece."""
        return self.end - self.start


def split_rounds(tr: Transfers, n_parts: int, budget: int | None, order: str = "batched") -> RoundPieces:
    """Cut the transfers into rounds of ``order`` (``"batched"`` or ``"by_peer"``); with ``budget``, no part
    receives or sends more than ``budget`` rows in one round, which bounds every buffer of a round (KV received and
    sent, dK/dV coming back). Greedy: each transfer goes, piece by piece, to the earliest round (within its base
    round's group) with room at both ends. ``n_parts``: R."""
    if order not in ("batched", "by_peer"):
        raise ValueError(f"unknown round order {order!r}; use 'batched' or 'by_peer'")
    n = tr.src.shape[0]
    base = np.zeros(n, dtype=np.int64) if order == "batched" else (tr.dst - tr.src) % max(n_parts, 1) - 1
    if budget is None or n == 0:  # one round per base round, renumbered densely
        rnd = np.unique(base, return_inverse=True)[1].reshape(-1) if n else base
        o = np.lexsort((tr.start, tr.src, tr.dst, rnd))
        return RoundPieces(round=rnd[o], dst=tr.dst[o], src=tr.src[o], start=tr.start[o], end=tr.end[o],
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
    arr = np.array(sorted(rows), dtype=np.int64).reshape(-1, 6)  # [n_pieces, 6]
    return RoundPieces(round=arr[:, 0], dst=arr[:, 1], src=arr[:, 2], start=arr[:, 3], end=arr[:, 4],
                       src_local=arr[:, 5])


def piece_remote_work(layout: Layout, pl: Placement, pieces: RoundPieces, window: int | None = None) -> np.ndarray:
    """``[n_pieces]`` (query, key) pairs the receiver computes against each piece: a piece ``[s, e)`` of document
    ``d`` is seen in full by every receiver segment of ``d`` at or after ``e``, so ``(e - s) * (tokens of d the
    receiver holds at >= e)``; with a window, the pairs it keeps (:func:`.windows.piece_work`)."""
    if len(pieces) == 0:
        return np.zeros(0, dtype=np.float64)
    if window is not None:
        return piece_work(layout, pl, pieces.dst, pieces.start, pieces.end, window)
    span = layout.total_tokens + 1
    comp = (pl.part * (layout.n_docs + 1) + pl.doc) * span + pl.start  # [n_seg] (part, doc, start)
    o = np.argsort(comp, kind="stable")
    comp = comp[o]
    suffix = np.concatenate([np.cumsum((pl.end - pl.start)[o][::-1])[::-1], [0]]).astype(np.float64)  # [n_seg + 1]
    group = pieces.dst * (layout.n_docs + 1) + layout.doc_of(pieces.start)
    j = np.searchsorted(comp, group * span + pieces.end, side="left")  # first segment at/after the piece
    hi = np.searchsorted(comp, (group + 1) * span, side="left")  # end of the (part, doc) group
    return pieces.lengths.astype(np.float64) * (suffix[j] - suffix[hi])


@dataclass(frozen=True, eq=False)
class RoundTables:
    """Per-round tables of a set of pieces."""

    recv: np.ndarray  # [n_parts, n_rounds] KV rows each part receives in each round
    sent: np.ndarray  # [n_parts, n_rounds] KV rows each part sends (and gets back as dK/dV)
    remote_work: np.ndarray  # [n_parts, n_rounds] pairs against the received rows
    peers: np.ndarray  # [n_rounds, n_parts, n_parts] bool: peers[t, dst, src] when src sends dst in round t


def round_tables(pieces: RoundPieces, work: np.ndarray, n_parts: int) -> RoundTables:
    """Per-round tables of ``pieces``; ``work``: ``[n_pieces]`` pairs against each (:func:`piece_remote_work`)."""
    n_rounds = pieces.n_rounds
    recv = np.zeros((n_parts, n_rounds))
    sent = np.zeros((n_parts, n_rounds))
    rwork = np.zeros((n_parts, n_rounds))
    peers = np.zeros((n_rounds, n_parts, n_parts), dtype=bool)
    if n_rounds:
        np.add.at(recv, (pieces.dst, pieces.round), pieces.lengths)
        np.add.at(sent, (pieces.src, pieces.round), pieces.lengths)
        np.add.at(rwork, (pieces.dst, pieces.round), work)
        peers[pieces.round, pieces.dst, pieces.src] = True
    return RoundTables(recv, sent, rwork, peers)
