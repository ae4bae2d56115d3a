"""Compiling a plan into a per-part schedule (the paper's "JIT" step): flat data, built once per layout, cached
on the plan and reused by every layer, forward and backward; no Python planning happens per layer.

A :class:`Schedule` holds, per round, the local rows to send to each peer, how the receive buffer is cut by peer,
and the work items (one varlen kernel call each). Items of part ``r``: the *local* item, ``r``'s queries against
its own keys, causal per document (local tokens are in global order, so local causal is global causal); per
round, *remote* items, queries against received keys, non-causal: a query segment ``[a, b)`` of document ``d``
sees the received keys of ``d`` that end at or before ``a``. A document with several query segments on ``r``
needs overlapping key sets, so its k-th segment goes to the k-th remote item ("slot").
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..kernels.base import Segment, VarlenSpec
from .layout import Layout
from .pipeline import PipelineShape, pipeline_shape
from .placement import Placement
from .rounds import RoundPieces


def ranges_to_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(s, s + n)`` for every (s, n). Shapes: ``[m], [m] -> [sum(n)]``."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offs = np.cumsum(lengths) - lengths
    return np.repeat(starts - offs, lengths) + np.arange(total, dtype=np.int64)


MAX_RUNS = 64  # beyond this many runs of consecutive rows, one index_select beats slicing

Runs = tuple[tuple[int, int], ...]  # (start, stop) of consecutive rows


def index_runs(idx: np.ndarray) -> Runs | None:
    """``idx`` as runs of consecutive rows, or None beyond :data:`MAX_RUNS` runs (the runtime then uses
    ``index_select``; slicing a few runs is cheaper)."""
    if idx.shape[0] == 0:
        return ()
    br = np.nonzero(np.diff(idx) != 1)[0] + 1  # [n_runs - 1] positions where a run starts
    if br.shape[0] + 1 > MAX_RUNS:
        return None
    first = np.concatenate([[0], br])
    last = np.concatenate([br, [idx.shape[0]]]) - 1
    return tuple(zip(idx[first].tolist(), (idx[last] + 1).tolist()))


def _index_or_none(idx: np.ndarray, full_len: int) -> torch.Tensor | None:
    """``None`` when ``idx`` is ``arange(full_len)`` (no gather needed), else a LongTensor."""
    if idx.shape[0] == full_len and (full_len == 0 or (idx[0] == 0 and np.all(np.diff(idx) == 1))):
        return None
    return torch.from_numpy(np.ascontiguousarray(idx))


def _move(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if t is None else t.to(device, non_blocking=True)


@dataclass(frozen=True)
class WorkItem:
    """One kernel call. ``segments``: the same attention on the un-gathered local q and KV source
    (:data:`~hf_hsap.kernels.base.Segment`, for in-place kernels; one per key run), None beyond :data:`MAX_RUNS`."""

    spec: VarlenSpec
    kv_source: str  # "local" or "recv" (this round's buffer)
    q_index: torch.Tensor | None  # rows of the local q (None: all, in order)
    kv_index: torch.Tensor | None  # rows of the KV source (None: all, in order)
    q_runs: Runs | None = None  # the same rows as runs (index_runs; None: too many, or no index)
    kv_runs: Runs | None = None
    segments: tuple[Segment, ...] | None = None

    def to(self, device: torch.device) -> "WorkItem":
        return WorkItem(self.spec, self.kv_source, _move(self.q_index, device), _move(self.kv_index, device),
                        self.q_runs, self.kv_runs, self.segments)


@dataclass(frozen=True)
class Round:
    """One communication round of a part."""

    send_index: torch.Tensor  # [n_send] local rows to send, grouped by peer
    send_splits: tuple[tuple[int, int, int], ...]  # (peer_part, offset, count) into the send buffer
    recv_splits: tuple[tuple[int, int, int], ...]  # the same into the receive buffer of recv_total rows
    recv_total: int
    items: tuple[WorkItem, ...]  # remote work items reading this round's receive buffer
    send_runs: Runs | None = None  # send_index as runs (index_runs; None: too many)

    def to(self, device: torch.device) -> "Round":
        return Round(_move(self.send_index, device), self.send_splits, self.recv_splits, self.recv_total,
                     tuple(i.to(device) for i in self.items), self.send_runs)


@dataclass(frozen=True)
class Schedule:
    """Everything one part executes per layer."""

    part: int
    n_local: int  # the part's tokens
    local_item: WorkItem | None  # covers every local query row
    rounds: tuple[Round, ...]
    meta: dict = field(default_factory=dict, compare=False)
    keep_recv: bool = True  # no receive budget: the received KV is kept for the backward (see shape)
    extra_local: tuple[WorkItem, ...] = ()  # more items against the part's own keys (window_schedule, blocks)
    window: int | None = None  # the mask kind

    def to(self, device: torch.device) -> "Schedule":
        """A copy whose index tensors live on ``device``."""
        return Schedule(self.part, self.n_local, None if self.local_item is None else self.local_item.to(device),
                        tuple(r.to(device) for r in self.rounds), self.meta, self.keep_recv,
                        tuple(i.to(device) for i in self.extra_local), self.window)

    @property
    def shape(self) -> PipelineShape:
        """How the runtime runs these rounds (:func:`~.pipeline.pipeline_shape`)."""
        return pipeline_shape(len(self.rounds), bounded=not self.keep_recv)

    @property
    def recv_tokens(self) -> int:
        return sum(r.recv_total for r in self.rounds)

    @property
    def send_tokens(self) -> int:
        return sum(int(r.send_index.shape[0]) for r in self.rounds)


def _splits(peers: np.ndarray, lengths: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    out, off = [], 0
    for p in np.unique(peers).tolist():
        n = int(lengths[peers == p].sum())
        out.append((p, off, n))
        off += n
    return tuple(out)


def _item_segments(entries: list[tuple[int, int, np.ndarray]]) -> tuple[Segment, ...] | None:
    """Segments of a remote item: per entry (first query row, query count, key rows), one per key run."""
    out: list[Segment] = []
    for q0, n, rows in entries:
        runs = index_runs(rows)
        if runs is None:
            return None
        out.extend((q0, q0 + n, a, b) for a, b in runs)
    return tuple(out) if len(out) <= MAX_RUNS else None


def _remote_items(layout: Layout, q_doc, q_start, q_end, q_local, *, k_start, k_end, k_off) -> tuple[WorkItem, ...]:
    """Remote items of one round (module docstring). ``q_*``: the part's segments; ``k_*``: received pieces and
    their offsets in the receive buffer."""
    if k_start.shape[0] == 0:
        return ()
    recv_total = int((k_end - k_start).sum())
    k_doc = layout.doc_of(k_start)
    slots: dict[int, list[tuple[int, int, np.ndarray]]] = {}
    for d in np.unique(k_doc).tolist():
        km = k_doc == d
        ks, ke, ko = k_start[km], k_end[km], k_off[km]
        qm = np.nonzero(q_doc == d)[0]
        slot = 0
        for qi in qm[np.argsort(q_start[qm])].tolist():
            sel = ke <= q_start[qi]
            if not sel.any():
                continue
            rows = ranges_to_index(ko[sel], ke[sel] - ks[sel])
            slots.setdefault(slot, []).append((int(q_local[qi]), int(q_end[qi] - q_start[qi]), rows))
            slot += 1
    items = []
    for slot in sorted(slots):
        entries = slots[slot]
        q_idx = ranges_to_index(np.array([e[0] for e in entries]), np.array([e[1] for e in entries]))
        kv_idx = np.concatenate([e[2] for e in entries])
        spec = VarlenSpec.from_lengths([e[1] for e in entries], [len(e[2]) for e in entries], causal=False)
        kv_index = _index_or_none(kv_idx, recv_total)
        items.append(WorkItem(spec, "recv", torch.from_numpy(q_idx), kv_index, index_runs(q_idx),
                              None if kv_index is None else index_runs(kv_idx), _item_segments(entries)))
    return tuple(items)


@dataclass(frozen=True)
class RoundIO:
    """What one part receives and sends in one round, before its work items are known (fields as :class:`Round`)."""

    k_start: np.ndarray  # [n] global ranges of the received pieces
    k_end: np.ndarray
    k_off: np.ndarray  # [n] their first rows in the receive buffer
    send_index: np.ndarray
    send_splits: tuple[tuple[int, int, int], ...]
    recv_splits: tuple[tuple[int, int, int], ...]
    recv_total: int

    def round(self, items: tuple[WorkItem, ...]) -> Round:
        """The :class:`Round` with these work items."""
        return Round(torch.from_numpy(self.send_index), self.send_splits, self.recv_splits, self.recv_total, items,
                     index_runs(self.send_index))


def round_io(pieces: RoundPieces, part: int, t: int) -> RoundIO:
    """The receives and sends of ``part`` in round ``t``; the receive buffer follows the pieces' order."""
    in_t = pieces.round == t
    rm = in_t & (pieces.dst == part)
    sm = in_t & (pieces.src == part)
    r_len = pieces.end[rm] - pieces.start[rm]
    s_len = pieces.end[sm] - pieces.start[sm]
    return RoundIO(pieces.start[rm], pieces.end[rm], np.cumsum(r_len) - r_len,
                   ranges_to_index(pieces.src_local[sm], s_len), _splits(pieces.dst[sm], s_len),
                   _splits(pieces.src[rm], r_len), int(r_len.sum()))


def compile_schedule(layout: Layout, pl: Placement, pieces: RoundPieces, part: int,
                     keep_recv: bool = True) -> Schedule:
    """The full-attention schedule of ``part`` (a window: :func:`~.window_schedule.compile_window_schedule`)."""
    lo, hi = int(pl.part_ptr[part]), int(pl.part_ptr[part + 1])
    q_doc, q_start, q_end, q_local = pl.doc[lo:hi], pl.start[lo:hi], pl.end[lo:hi], pl.local_start[lo:hi]
    n_local = int((q_end - q_start).sum())
    local_item = None
    if n_local:
        change = np.concatenate([[True], q_doc[1:] != q_doc[:-1]])
        doc_first_local = q_local[change]
        cu = tuple(np.concatenate([doc_first_local, [n_local]]).tolist())
        spec = VarlenSpec(cu, cu, True)
        local_item = WorkItem(spec, "local", None, None, segments=tuple(spec.segments()))
    rounds = []
    for t in range(pieces.n_rounds):
        io = round_io(pieces, part, t)
        items = _remote_items(layout, q_doc, q_start, q_end, q_local, k_start=io.k_start, k_end=io.k_end,
                              k_off=io.k_off)
        rounds.append(io.round(items))
    return Schedule(part, n_local, local_item, tuple(rounds), keep_recv=keep_recv)
