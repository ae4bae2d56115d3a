"""Which rank hands a document's recurrent state to which: the segments of a recurrent token mixer (gated delta rule,
Mamba scan, short convolution). Each document starts from a zero state; a run that does not start it continues from the
fixed-size state of the run before. Hand-off step ``s`` computes every document's ``s``-th run, then sends its state::

    rank 0 | d0 d0 d0 |                                        step 0: d0 (zero state) ─┐
    rank 1            | d0 d0 d0 | d1 d1 | d2 d2 |             step 1: d0 ◄─┘; step 0: d1, d2 ─┐
    rank 2                                       | d2 d2 d2 |  step 1: d2 ◄────────────────────┘
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["RECURRENT_LAYER_TYPES", "Chain", "Segment", "document_chain", "part_steps", "recurrent_layers",
           "state_chain"]

# `config.layer_types` entries with a recurrent token mixer (alone, or beside attention: "hybrid").
RECURRENT_LAYER_TYPES = frozenset({"linear_attention", "conv", "hybrid", "hybrid_sliding"})


def recurrent_layers(layer_types: Sequence[str] | None) -> int:
    """How many of ``layer_types`` (a model's ``config.layer_types``) hold a recurrent token mixer."""
    return sum(str(t) in RECURRENT_LAYER_TYPES for t in (layer_types or ()))


@dataclass(frozen=True)
class Segment:
    """One run of a document on one rank: consecutive global and local tokens."""

    start: int  # local token range [start, end) over the rank's flattened tokens
    end: int
    doc: int  # the document's index
    step: int  # the run's place in its document's chain (0: starts it, from the zero state)
    prev: int  # the rank holding the run before it (-1: none); never the segment's own rank
    next: int  # the rank holding the run after it (-1: none)


@dataclass(frozen=True)
class Chain:
    """The segments of one rank and the hand-off steps of its whole group."""

    rank: int
    segments: tuple[Segment, ...]  # the rank's runs in local order
    steps: int  # the group's hand-off steps (its longest chain)
    traffic: tuple[bool, ...]  # [steps] whether any rank sends a state after step s
    handoffs: int  # states sent between ranks over the group per mixer layer
    total: int  # the rank's local tokens

    @property
    def remote(self) -> bool:
        """Whether any rank of the group hands a state to another rank."""
        return any(self.traffic)


def _runs(index: np.ndarray, cu: np.ndarray) -> list[tuple[int, int, int, int]]:
    """``(local start, local end, doc, global start)`` of every maximal run of one document's tokens in ``index``."""
    if index.size == 0:
        return []
    doc = np.searchsorted(cu, index, side="right") - 1  # [n] document of every token
    cut = np.ones(index.size, dtype=bool)
    cut[1:] = (np.diff(index) != 1) | (np.diff(doc) != 0)
    starts = np.flatnonzero(cut)
    ends = np.append(starts[1:], index.size)
    return [(int(a), int(b), int(doc[a]), int(index[a])) for a, b in zip(starts, ends)]


def state_chain(cu_seqlens: Sequence[int] | np.ndarray, rank_tokens: Sequence[np.ndarray], rank: int) -> Chain:
    """The :class:`Chain` of ``rank`` in a group whose rank ``r`` holds the ascending global tokens ``rank_tokens[r]``
    (``Plan.local_token_indices(r)``) of the documents ``cu_seqlens`` (``[n_docs + 1]``)."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    runs = [(g, r, a, b, d) for r, idx in enumerate(rank_tokens)
            for a, b, d, g in _runs(np.asarray(idx, dtype=np.int64), cu)]
    runs.sort()  # global order: the chain of each document is its runs in order
    holder = [r for _, r, _, _, _ in runs]
    mine: list[Segment] = []
    step = 0
    steps = 1
    sends: dict[int, bool] = {}
    handoffs = 0
    for i, (_, r, a, b, d) in enumerate(runs):
        first = i == 0 or runs[i - 1][4] != d
        step = 0 if first else step + 1
        steps = max(steps, step + 1)
        prev = -1 if first else holder[i - 1]
        nxt = holder[i + 1] if i + 1 < len(runs) and runs[i + 1][4] == d else -1
        if nxt >= 0 and nxt != r:
            sends[step] = True
            handoffs += 1
        if r == rank:
            mine.append(Segment(a, b, d, step, prev, nxt))
    mine.sort(key=lambda s: s.start)
    total = int(np.asarray(rank_tokens[rank]).size)
    return Chain(rank, tuple(mine), steps, tuple(sends.get(s, False) for s in range(steps)), handoffs, total)


def document_chain(cu_seqlens: Sequence[int] | np.ndarray) -> Chain:
    """The chain of one rank holding every token of ``cu_seqlens`` (packed rows at SP 1): a segment per document."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    segs = tuple(Segment(int(a), int(b), i, 0, -1, -1) for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])))
    return Chain(0, segs, 1, (False,), 0, int(cu[-1]))


def part_steps(doc: np.ndarray, start: np.ndarray, part: np.ndarray, length: np.ndarray, n_parts: int) -> np.ndarray:
    """``[n_parts, steps]`` float64 tokens each part computes at each hand-off step (what the planner prices), of a
    placement's ``[n_segments]`` segments: their document, global start, part and tokens."""
    if doc.size == 0:
        return np.zeros((n_parts, 1))
    order = np.lexsort((start, doc))  # a document's segments in global order
    d, p, n = doc[order], part[order], length[order]
    new_run = np.concatenate([[True], (d[1:] != d[:-1]) | (p[1:] != p[:-1])])
    run = np.cumsum(new_run) - 1  # [n_segments] run of every segment
    run_doc = d[new_run]
    first = np.concatenate([[True], run_doc[1:] != run_doc[:-1]])
    idx = np.arange(run_doc.size)
    step = idx - np.maximum.accumulate(np.where(first, idx, 0))  # [n_runs] place in its document's chain
    out = np.zeros((n_parts, int(step.max()) + 1))
    np.add.at(out, (p, step[run]), n)
    return out

