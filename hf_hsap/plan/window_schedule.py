"""The :class:`~.schedule.Schedule` of a part for a sliding-window mask kind: a *local* item (segments on their own
rows, causal with the window), ``extra_local`` items (against earlier, non-adjacent segments of the document on the
part) and per round remote items, in :func:`~.windows.band_blocks` grouped so an item's query rows are distinct."""
from __future__ import annotations

import numpy as np
import torch

from ..kernels.base import VarlenSpec, window_left
from .layout import Layout
from .placement import Placement
from .rounds import RoundPieces
from .schedule import Schedule, WorkItem, _index_or_none, index_runs, ranges_to_index, round_io
from .windows import BLOCK_MASKS, band_blocks

Block = tuple[str, int, int, int, int]  # (mask, first query row, query rows, first key row, key rows)


def _slots(blocks: list[Block]) -> list[list[Block]]:
    """Blocks of one mask in the fewest groups whose blocks share no query row (greedy interval colouring)."""
    groups: list[list[Block]] = []
    ends: list[int] = []
    for b in sorted(blocks, key=lambda b: (b[1], b[3])):
        for g, end in enumerate(ends):
            if end <= b[1]:
                groups[g].append(b)
                ends[g] = b[1] + b[2]
                break
        else:
            groups.append([b])
            ends.append(b[1] + b[2])
    return groups


def _items(blocks: list[Block], kv_source: str, kv_total: int) -> tuple[WorkItem, ...]:
    """Work items of blocks on rows of the local q and of a KV source of ``kv_total`` rows."""
    items = []
    for mask in BLOCK_MASKS:
        causal, window_left = BLOCK_MASKS[mask]
        for group in _slots([b for b in blocks if b[0] == mask]):
            q_idx = ranges_to_index(np.array([b[1] for b in group]), np.array([b[2] for b in group]))
            kv_idx = ranges_to_index(np.array([b[3] for b in group]), np.array([b[4] for b in group]))
            spec = VarlenSpec.from_lengths([b[2] for b in group], [b[4] for b in group], causal,
                                           window_left=window_left)
            kv_index = _index_or_none(kv_idx, kv_total)
            segments = tuple((b[1], b[1] + b[2], b[3], b[3] + b[4]) for b in group)
            items.append(WorkItem(spec, kv_source, torch.from_numpy(q_idx), kv_index, index_runs(q_idx),
                                  None if kv_index is None else index_runs(kv_idx), segments))
    return tuple(items)


def _blocks(qa: int, qb: int, q_row: int, ka: int, kb: int, k_row: int, *, window: int) -> list[Block]:
    """:func:`~.windows.band_blocks` of queries ``[qa, qb)``, keys ``[ka, kb)``, as rows from ``q_row``, ``k_row``."""
    return [(m, q_row + a - qa, b - a, k_row + c - ka, d - c) for m, a, b, c, d in band_blocks(qa, qb, ka, kb, window)]


def compile_window_schedule(layout: Layout, pl: Placement, pieces: RoundPieces, part: int, keep_recv: bool,
                            window: int) -> Schedule:
    """The schedule of ``part`` for the layers with a sliding ``window`` (Transformers' convention) over the kind's
    round ``pieces``; ``keep_recv``: keep the receive buffers for the backward."""
    lo, hi = int(pl.part_ptr[part]), int(pl.part_ptr[part + 1])
    q_doc, q_start, q_end, q_local = pl.doc[lo:hi], pl.start[lo:hi], pl.end[lo:hi], pl.local_start[lo:hi]
    n_local = int((q_end - q_start).sum())
    local_item = None
    extra: list[Block] = []
    if n_local:
        cu = tuple(np.concatenate([q_local, [n_local]]).tolist())
        spec = VarlenSpec(cu, cu, True, window_left=window_left(window))
        local_item = WorkItem(spec, "local", None, None, segments=tuple(spec.segments()))
        for s in range(q_doc.shape[0]):  # earlier segments of the same document on this part, nearest first
            g = s - 1  # a document's segments are consecutive here (sorted by start, documents contiguous)
            while g >= 0 and q_doc[g] == q_doc[s] and q_end[g] + window - 1 > q_start[s]:
                extra += _blocks(int(q_start[s]), int(q_end[s]), int(q_local[s]), int(q_start[g]),
                                 int(q_end[g]), int(q_local[g]), window=window)
                g -= 1
    rounds = []
    for t in range(pieces.n_rounds):
        io = round_io(pieces, part, t)
        k_doc = layout.doc_of(io.k_start) if io.k_start.shape[0] else io.k_start
        blocks: list[Block] = []
        for ks, ke, ko, d in zip(io.k_start.tolist(), io.k_end.tolist(), io.k_off.tolist(), k_doc.tolist()):
            for s in np.nonzero((q_doc == d) & (q_start >= ke) & (q_start < ke + window - 1))[0].tolist():
                blocks += _blocks(int(q_start[s]), int(q_end[s]), int(q_local[s]), ks, ke, ko, window=window)
        rounds.append(io.round(_items(blocks, "recv", io.recv_total)))
    return Schedule(part, n_local, local_item, tuple(rounds), keep_recv=keep_recv,
                    extra_local=_items(extra, "local", n_local), window=window)
