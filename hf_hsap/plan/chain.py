"""Which runs of a split document a recurrent token mixer (gated delta rule, Mamba scan, short convolution) folds into
which: each document starts from a zero state; a run that does not start it continues from the fixed-size state the
runs before it end with. Every rank runs all its runs at once from the zero state, summarises each run that a later
run continues (its final state from zero and its transition), and sends that summary to every later holder of the
document, all in one exchange; each continued run folds the summaries of the runs before it into its true initial
state (:mod:`hf_hsap.mixers.handoff`)::

    rank 0 | d0 d0 d0 |                                         d0 run 0: summary -> ranks 1, 2 ─┐
    rank 1            | d0 d0 d0 | d1 d1 | d2 d2 |              d0 run 1 folds run 0's ◄─────────┤ one exchange
    rank 2                                       | d2 d2 d0 |   d0 run 2 folds runs 0, 1; d2 run 1 folds d2 run 0
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["RECURRENT_LAYER_TYPES", "Chain", "Segment", "document_chain", "part_mixer_tokens", "recurrent_layers",
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
    run: int  # the run's place in its document (0: starts it, from the zero state)
    earlier: tuple[int, ...]  # the rank holding each earlier run of the document, in order
    later: tuple[int, ...]  # the rank holding each later run of the document, in order

    @property
    def continued(self) -> bool:
        """Whether the run continues an earlier run (its initial state is not zero)."""
        return self.run > 0


@dataclass(frozen=True)
class Chain:
    """The segments of one rank and the summary exchange of its whole group.

    Attributes:
        rank: this rank. segments: its runs in local order. remote: whether any rank of the group continues a run
        held by another rank (then every recurrent layer exchanges summaries). summaries: the summaries sent
        between ranks over the group per recurrent layer (a run sends one to each other rank holding a later run
        of its document). total: the rank's local tokens.
    """

    rank: int
    segments: tuple[Segment, ...]
    remote: bool
    summaries: int
    total: int

    def sends(self) -> list[tuple[int, int, int]]:
        """``(peer, doc, run)`` of every summary this rank sends, sorted."""
        return sorted({(p, s.doc, s.run) for s in self.segments for p in s.later if p != self.rank})

    def receives(self) -> list[tuple[int, int, int]]:
        """``(peer, doc, run)`` of every summary this rank receives (an earlier run held elsewhere), sorted."""
        return sorted({(p, s.doc, i) for s in self.segments for i, p in enumerate(s.earlier) if p != self.rank})


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
    runs = sorted((g, d, r, a, b) for r, idx in enumerate(rank_tokens)
                  for a, b, d, g in _runs(np.asarray(idx, dtype=np.int64), cu))
    holders: dict[int, list[int]] = {}  # doc -> the holder of each run, in order
    for _, d, r, _, _ in runs:
        holders.setdefault(d, []).append(r)
    mine: list[Segment] = []
    summaries = 0
    remote = False
    seen: dict[int, int] = {}
    for _, d, r, a, b in runs:
        j = seen.get(d, 0)
        seen[d] = j + 1
        hs = holders[d]
        summaries += len(set(hs[j + 1:]) - {r})
        remote |= any(p != r for p in hs[:j])
        if r == rank:
            mine.append(Segment(a, b, d, j, tuple(hs[:j]), tuple(hs[j + 1:])))
    mine.sort(key=lambda s: s.start)
    total = int(np.asarray(rank_tokens[rank]).size)
    return Chain(rank, tuple(mine), remote, summaries, total)


def document_chain(cu_seqlens: Sequence[int] | np.ndarray) -> Chain:
    """The chain of one rank holding every token of ``cu_seqlens`` (packed rows at SP 1): a segment per document."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    segs = tuple(Segment(int(a), int(b), i, 0, (), ()) for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])))
    return Chain(0, segs, False, 0, int(cu[-1]))


def part_mixer_tokens(doc: np.ndarray, start: np.ndarray, part: np.ndarray, length: np.ndarray,
                      n_parts: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """What the planner prices of a placement's recurrent layers (the runtime's :func:`state_chain` seen from
    the placement's ``[n_segments]`` segments: their document, global start, part and tokens).

    Returns:
        ``(tokens [n_parts], continued [n_parts], remote)``: the tokens each part runs, those of them in runs that
        continue an earlier run (which take the summarising call), and whether any run continues one held by
        another part (the layer then waits for one summary exchange).
    """
    tokens = np.zeros(n_parts)
    continued = np.zeros(n_parts)
    if doc.size == 0:
        return tokens, continued, False
    order = np.lexsort((start, doc))  # a document's segments in global order
    d, p, n, s = doc[order], part[order], length[order], start[order]
    np.add.at(tokens, p, n)
    same_doc = np.concatenate([[False], d[1:] == d[:-1]])
    # a new run: another document, another part, or a gap (a part's segments are one run when consecutive)
    new_run = ~same_doc | np.concatenate([[True], (p[1:] != p[:-1]) | (s[1:] != s[:-1] + n[:-1])])
    run_id = np.cumsum(new_run)
    first = run_id == np.maximum.accumulate(np.where(same_doc, 0, run_id))  # in its document's first run
    np.add.at(continued, p[~first], n[~first])
    remote = bool(np.any(same_doc & np.concatenate([[False], p[1:] != p[:-1]])))
    return tokens, continued, remote
