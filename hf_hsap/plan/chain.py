"""Which rank hands a document's recurrent state to which: the segments of a recurrent token mixer.

A recurrent token mixer (the gated delta rule, Mamba's scans, a short convolution) runs every document from a
zero state. Under SP a rank holds runs of documents; a run that does not start its document continues from the
state its predecessor run ends with, held by the same rank or another one. That state has a fixed size per layer
(``heads x d_k x d_v`` for the delta rule, ``channels x (kernel - 1)`` inputs for a convolution), whatever the
run's length, so a split document costs one state per hand-off.

The runs of one document form a chain. Hand-off step ``s`` computes every run that is the ``s``-th of its
document (step 0: document starts, from the zero state), then sends the states the step ended with to the next
holders. Steps run in order on every rank; all runs of one step run at the same time::

    global row   | d0 d0 d0 d0 d0 d0 | d1 d1 | d2 d2 d2 d2 d2 |
    rank 0       | d0 d0 d0          |                          step 0: d0 (zero state) ─┐
    rank 1                 | d0 d0 d0 | d1 d1 | d2 d2          step 1: d0 (rank 0's) ◄─┘, d1, d2 step 0 ─┐
    rank 2                                         | d2 d2 d2 |  step 1: d2 (rank 1's) ◄─────────────────┘

Pure: numpy only, no process groups or devices.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["RECURRENT_LAYER_TYPES", "Chain", "Segment", "document_chain", "part_steps", "recurrent_layers",
           "state_chain"]

# `config.layer_types` entries of recurrent token mixers (alone, or beside attention in one layer: "hybrid").
RECURRENT_LAYER_TYPES = frozenset({"linear_attention", "conv", "hybrid", "hybrid_sliding"})


def recurrent_layers(layer_types: Sequence[str] | None) -> int:
    """Layers of a model whose ``config.layer_types`` are ``layer_types`` that hold a recurrent token mixer."""
    return sum(str(t) in RECURRENT_LAYER_TYPES for t in (layer_types or ()))


@dataclass(frozen=True)
class Segment:
    """One run of a document on one rank: consecutive global tokens, consecutive local tokens.

    Attributes:
        start, end: local token offsets ``[start, end)`` (over the flattened ``B * L`` tokens at one rank).
        doc: the document's index in the layout.
        step: the run's place in its document's chain (0: it starts the document, zero state).
        prev: the rank holding the run before it (``-1``: none, the run starts its document).
        next: the rank holding the run after it (``-1``: none, the run ends its document).
        ``prev`` and ``next`` are never the segment's own rank: a rank's consecutive runs are one segment.
    """

    start: int
    end: int
    doc: int
    step: int
    prev: int
    next: int


@dataclass(frozen=True)
class Chain:
    """The segments of one rank and the hand-off steps of its whole group.

    Attributes:
        rank: the rank these segments are of.
        segments: its runs in local order.
        steps: hand-off steps of the group (the longest chain; 1 when no document is split).
        traffic: ``[steps]`` whether any rank sends a state after step ``s`` (the steps with an exchange).
        handoffs: states sent between ranks over the whole group per mixer layer (split documents' cuts that
            fall between two ranks).
        total: local tokens covered.
    """

    rank: int
    segments: tuple[Segment, ...]
    steps: int
    traffic: tuple[bool, ...]
    handoffs: int
    total: int

    @property
    def remote(self) -> bool:
        """Whether any rank of the group hands a state to another rank."""
        return any(self.traffic)


def _runs(index: np.ndarray, cu: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Maximal runs of consecutive global tokens inside one document: ``(local start, local end, doc, global
    start)`` each. ``index`` is ascending (a rank's tokens in plan order)."""
    if index.size == 0:
        return []
    doc = np.searchsorted(cu, index, side="right") - 1  # [n] document of every token
    cut = np.ones(index.size, dtype=bool)
    cut[1:] = (np.diff(index) != 1) | (np.diff(doc) != 0)
    starts = np.flatnonzero(cut)
    ends = np.append(starts[1:], index.size)
    return [(int(a), int(b), int(doc[a]), int(index[a])) for a, b in zip(starts, ends)]


def state_chain(cu_seqlens: Sequence[int] | np.ndarray, rank_tokens: Sequence[np.ndarray], rank: int) -> Chain:
    """The hand-off chain of a group whose rank ``r`` holds the global tokens ``rank_tokens[r]``.

    Args:
        cu_seqlens: ``[n_docs + 1]`` document boundaries over the flattened tokens.
        rank_tokens: every rank's global token indices, ascending (``Plan.local_token_indices(r)``).
        rank: the rank to return the segments of.

    Returns:
        The :class:`Chain` (the same ``steps``, ``traffic`` and ``handoffs`` on every rank).
    """
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
    """One rank holding every token: each document one segment from the zero state (packed rows at SP 1).

    Args:
        cu_seqlens: ``[n_docs + 1]`` document boundaries over the flattened tokens (row starts included).
    """
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    segs = tuple(Segment(int(a), int(b), i, 0, -1, -1) for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])))
    return Chain(0, segs, 1, (False,), 0, int(cu[-1]))


def part_steps(doc: np.ndarray, start: np.ndarray, part: np.ndarray, length: np.ndarray, n_parts: int) -> np.ndarray:
    """Tokens each part computes at each hand-off step, for a placement's segments (what the planner prices).

    Args:
        doc, start, part, length: ``[n_segments]`` each segment's document, global start, part and tokens
            (a :class:`~hf_hsap.plan.placement.Placement`'s segments; each lies inside one document).
        n_parts: parts of the placement.

    Returns:
        ``[n_parts, steps]`` float64: step ``s`` holds the runs that are the ``s``-th of their document
        (a part's consecutive segments of one document are one run).
    """
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

