"""Bidirectional blocks inside causal documents: Gemma 3's image tokens see each other both ways.

The mask is: same document AND (causal OR same block). A query at ``i`` in block ``[s, e)`` sees what a causal
query sees plus the block's later keys ``(i, e)``. With every block's rows reversed (``e - 1`` first), a query at
reversed offset ``r`` needs the keys at reversed offsets ``< r``: one bottom-right aligned causal call of ``n``
queries over the first ``n - 1`` reversed keys::

    block rows   s  s+1 s+2 s+3        reversed   q: e-1 e-2 e-3 e-4 (= s+3 s+2 s+1 s)
    later keys   of s: s+1..s+3                   k: e-1 e-2 e-3        query r sees keys 0..r-1

That call is one more item against the part's own keys (:attr:`~.schedule.Schedule.extra_local`), merged by
log-sum-exp, so a block must lie whole in one part: :func:`keep_blocks_whole` snaps the cuts inside blocks to
their nearer edge and plans the transfers again (the causal rule already fetches the keys a block needs).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ..kernels.base import VarlenSpec
from .kinds import plan_kind
from .placement import Placement
from .schedule import Schedule, WorkItem

__all__ = ["Blocks", "block_schedule", "blocks_from_mask", "keep_blocks_whole"]


@dataclass(frozen=True)
class Blocks:
    """Bidirectional blocks over the flattened ``B * L`` tokens (each inside one document, at least 2 tokens)."""

    starts: tuple[int, ...]  # global [start, end) of every block, ascending (plain ints: hashable, picklable)
    ends: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.starts)


def blocks_from_mask(in_block: np.ndarray | torch.Tensor, cu_seqlens: np.ndarray | torch.Tensor) -> Blocks:
    """The maximal runs of ``in_block`` tokens, cut at document starts; runs of one token are dropped (they see
    nothing a causal token does not). Shapes: in_block ``[B * L]`` bool (e.g. ``token_type_ids == 1``), cu_seqlens
    ``[n + 1]``."""
    flag = np.asarray(torch.as_tensor(in_block).detach().to("cpu").reshape(-1), dtype=bool)
    cu = np.asarray(torch.as_tensor(cu_seqlens).detach().to("cpu"), dtype=np.int64)
    doc_start = np.zeros(flag.shape[0], dtype=bool)
    doc_start[cu[:-1]] = True
    prev = np.concatenate([[False], flag[:-1]])
    starts = np.flatnonzero(flag & (~prev | doc_start))
    nxt = np.concatenate([flag[1:], [False]])
    next_start = np.concatenate([doc_start[1:], [True]])
    ends = np.flatnonzero(flag & (~nxt | next_start)) + 1
    keep = ends - starts >= 2
    return Blocks(tuple(starts[keep].tolist()), tuple(ends[keep].tolist()))


def _snap(cuts: np.ndarray, blocks: Blocks) -> np.ndarray:
    """Every cut strictly inside a block moved to that block's nearer edge (ties: the start)."""
    if not len(blocks):
        return cuts
    s, e = np.asarray(blocks.starts), np.asarray(blocks.ends)
    b = np.searchsorted(s, cuts, side="right") - 1  # the last block starting at or before each cut
    inside = (b >= 0) & (cuts > s[np.maximum(b, 0)]) & (cuts < e[np.maximum(b, 0)])
    bs, be = s[np.maximum(b, 0)], e[np.maximum(b, 0)]
    snapped = np.where(cuts - bs <= be - cuts, bs, be)
    return np.where(inside, snapped, cuts)


def _snapped_placement(pl: Placement, blocks: Blocks) -> Placement | None:
    """``pl`` with no segment boundary inside a block (``None`` when it already has none)."""
    order = np.lexsort((pl.start, pl.doc))  # segments in document order
    start, end = pl.start[order], pl.end[order]
    new_start, new_end = _snap(start, blocks), _snap(end, blocks)
    if np.array_equal(new_start, start) and np.array_equal(new_end, end):
        return None
    keep = new_end > new_start  # a segment inside one block vanishes into its neighbour
    doc, part = pl.doc[order][keep], pl.part[order][keep]
    new_start, new_end = new_start[keep], new_end[keep]
    by_part = np.lexsort((new_start, part))
    doc, part, new_start, new_end = doc[by_part], part[by_part], new_start[by_part], new_end[by_part]
    part_ptr = np.searchsorted(part, np.arange(pl.n_parts + 1)).astype(np.int64)
    lengths = new_end - new_start
    local_start = np.zeros_like(lengths)
    for p in range(pl.n_parts):  # offsets restart at every part
        lo, hi = part_ptr[p], part_ptr[p + 1]
        local_start[lo:hi] = np.concatenate([[0], np.cumsum(lengths[lo:hi])[:-1]]) if hi > lo else lengths[lo:hi]
    return Placement(f"{pl.name}+whole_blocks", pl.n_parts, doc, new_start, new_end, part, part_ptr, local_start)


def keep_blocks_whole(plan, blocks: Blocks):
    """``plan`` (a :class:`~.plan.Plan`) if no cut falls inside a block, else the same plan over a placement that
    keeps every block in one part, its transfers and rounds planned again.

    Raises:
        ValueError: a part is left with fewer tokens than its ``U`` ranks.
    """
    from .plan import Plan

    pl = _snapped_placement(plan.placement, blocks)
    if pl is None:
        return plan
    U = plan.ulysses_size
    short = np.flatnonzero(pl.tokens_per_part() < U)
    if short.size:
        raise ValueError(f"keeping the image blocks whole leaves part {int(short[0])} with fewer than its {U} ranks' "
                         "tokens; pack longer rows (max_length) or use a smaller SP size")
    kinds = {w: plan_kind(plan.layout, pl, w, plan.cost, plan.recv_budget_tokens, plan.rounds_option)
             for w in plan.windows}
    first = kinds[plan.windows[0]]
    new = Plan(plan.layout, plan.group, pl, first.transfers, first.pieces, first.round_order, plan.recv_budget_tokens,
               plan.cost, windows=plan.windows, layer_counts=plan.layer_counts, rounds_option=plan.rounds_option)
    new._kinds.update(kinds)
    return new


def _block_item(part_tokens: np.ndarray, blocks: Blocks, part: int) -> WorkItem | None:
    """The reversed-block work item of the blocks held by a part (``None``: it holds none)."""
    q_rows, k_rows, n_q, n_k = [], [], [0], [0]
    for s, e in zip(blocks.starts, blocks.ends):
        lo = int(np.searchsorted(part_tokens, s))
        held = int(np.searchsorted(part_tokens, e)) - lo
        if held == 0:
            continue
        if held != e - s or part_tokens[lo] != s:
            raise ValueError(f"bidirectional block [{s}, {e}) is split across parts (part {part} holds {held} of "
                             "its tokens); plan with keep_blocks_whole")
        rows = np.arange(lo + e - s - 1, lo - 1, -1, dtype=np.int64)  # the block's local rows, last first
        q_rows.append(rows)
        k_rows.append(rows[:-1])
        n_q.append(n_q[-1] + rows.size)
        n_k.append(n_k[-1] + rows.size - 1)
    if not q_rows:
        return None
    spec = VarlenSpec(tuple(n_q), tuple(n_k), causal=True)
    return WorkItem(spec, "local", torch.from_numpy(np.concatenate(q_rows)), torch.from_numpy(np.concatenate(k_rows)))


def block_schedule(plan, sched: Schedule, part: int, blocks: Blocks, device: torch.device | None = None) -> Schedule:
    """``sched`` (``part``'s schedule of one mask kind in ``plan``) with the part's blocks as one more local work
    item, its index tensors on ``device``; cached on the plan per part, mask kind and blocks."""
    key = ("blocks", part, sched.window, blocks, None if device is None else str(device))
    cached = plan._schedules.get(key)
    if cached is None:
        item = _block_item(plan.part_token_indices(part), blocks, part)
        if item is not None and device is not None:
            item = item.to(device)
        extra = sched.extra_local + ((item,) if item is not None else ())
        cached = dataclasses.replace(sched, extra_local=extra)
        plan._schedules[key] = cached
    return cached
