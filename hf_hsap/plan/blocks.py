"""Bidirectional blocks inside causal documents: Gemma 3's image tokens see each other both ways.

The mask of such a layer is: same document AND (causal OR same block). A query of block ``[s, e)`` at position
``i`` sees what a causal query sees plus the block's later keys ``(i, e)``. That extra set is one causal kernel
call over the *reversed* blocks: with the rows of every block reversed (position ``e - 1`` first), a query at
reversed offset ``r`` needs the keys at reversed offsets ``< r``, which is bottom-right aligned causal attention
of ``n`` queries over the first ``n - 1`` reversed keys::

    block rows   s  s+1 s+2 s+3        reversed   q: e-1 e-2 e-3 e-4 (= s+3 s+2 s+1 s)
    later keys   of s: s+1..s+3                   k: e-1 e-2 e-3        query r sees keys 0..r-1

The call is one more work item against the part's own keys (:attr:`~.schedule.Schedule.extra_local`), merged by
log-sum-exp like every other partial result, forward and backward. So a block must lie whole inside one part:
:func:`keep_blocks_whole` moves every cut of the placement that falls inside a block to the block's nearer edge
and plans the transfers again over that placement (the causal needed-KV rule is then exact: the earlier keys a
block query needs are those of its first token's causal prefix, which the causal rule already fetches).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ..kernels.base import VarlenSpec
from .kinds import plan_kind
from .layout import Layout
from .placement import Placement
from .schedule import Schedule, WorkItem

__all__ = ["Blocks", "block_schedule", "blocks_from_mask", "keep_blocks_whole"]


@dataclass(frozen=True)
class Blocks:
    """Bidirectional blocks over the flattened ``B * L`` tokens (each inside one document, at least 2 tokens).

    Attributes:
        starts, ends: global ``[start, end)`` of every block, ascending (plain ints: hashable, picklable).
    """

    starts: tuple[int, ...]
    ends: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.starts)


def blocks_from_mask(in_block: np.ndarray | torch.Tensor, cu_seqlens: np.ndarray | torch.Tensor) -> Blocks:
    """The maximal runs of ``in_block`` tokens, cut at document starts; runs of one token are dropped (a token
    alone in its block sees nothing a causal token does not).

    Args:
        in_block: ``[B * L]`` bool, e.g. ``token_type_ids == 1`` (image tokens). cu_seqlens: ``[n + 1]`` documents.

    Returns:
        The :class:`Blocks`.
    """
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
    """``plan``, or a plan over the same documents whose placement keeps every block inside one part.

    Args:
        plan: a :class:`~.plan.Plan`. blocks: the layout's bidirectional blocks.

    Returns:
        ``plan`` itself when no cut falls inside a block, else a new :class:`~.plan.Plan` (same group, cost,
        receive budget, mask kinds and round option; transfers and rounds planned over the new placement).

    Raises:
        ValueError: a part left with fewer tokens than its ``U`` ranks.
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
    """``sched`` with the part's blocks as one more local work item (cached on the plan per part, mask kind and
    blocks).

    Args:
        plan: the plan ``sched`` is of; sched: the part's schedule of one mask kind; part: the part;
        blocks: the layout's bidirectional blocks; device: where the index tensors go.

    Returns:
        The extended :class:`~.schedule.Schedule`.
    """
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


def check_layout(layout: Layout, blocks: Blocks) -> None:
    """Refuse blocks that cross a document boundary (a block must lie inside one document)."""
    cu = layout.cu_seqlens
    for s, e in zip(blocks.starts, blocks.ends):
        d = int(np.searchsorted(cu, s, side="right")) - 1
        if e > cu[d + 1]:
            raise ValueError(f"bidirectional block [{s}, {e}) crosses the end of its document at {int(cu[d + 1])}")
