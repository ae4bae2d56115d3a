"""What a greedy placement (:mod:`.balanced`, :mod:`.density`) hands over before its refinement.

Keeping the state between a pass and :mod:`.refine` lets ``auto`` refine one pass several ways
(:meth:`Greedy.placement`: evening out work alone, or work and tokens).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from .placement import Placement, _finish
from .refine import Sides, boundaries, boundary_sides, refine_moves
from .segments import Segments


@dataclass(frozen=True)
class Greedy:
    """The segments and per-part figures of one greedy pass (lists; never changed: refinements work on copies).

    Attributes:
        name: the placement's name. n_parts: P. cu: the document boundaries (``cu_seqlens``).
        segments: the segments of the split documents, each document's consecutive and in order (what the
            refinement moves, on copies).
        whole_doc, whole_part: the documents kept whole and their parts (-1: among the segments after all).
        tok, wrk: tokens and (query, key) pairs of every part.
        cap_t: the token cap no slide exceeds. max_moves: the refinement's most moves.
        whole_doc_ids, cu_list: ``whole_doc`` as int64 and ``cu`` as a list, when at hand (conversions are slow).
    """

    name: str
    n_parts: int
    cu: np.ndarray
    segments: Segments
    whole_doc: list[int]
    whole_part: list[int]
    tok: list[float]
    wrk: list[float]
    cap_t: float
    max_moves: int
    whole_doc_ids: np.ndarray | None = field(default=None, compare=False, repr=False)
    cu_list: list[int] | None = field(default=None, compare=False, repr=False)

    def placement(self, token_cost: float | None, *, extra: list[float] | None = None) -> Placement:
        """The refined placement, named :attr:`name`; refinements that end alike are one object.

        Args:
            token_cost: the refinement evens out ``work + token_cost * tokens`` and may move tokens within ``cap_t``;
                ``None``: it evens out the work at unchanged token counts.
            extra: ``[n_parts]`` load (pairs) each part carries besides its attention work (its vision encoder
                work per layer, :mod:`.items`), which the refinement evens out too; None: none.
        """
        segs = self.segments
        moved = Segments(segs.doc, list(segs.start), list(segs.end), list(segs.part))
        starts, ends, parts = moved.start, moved.end, moved.part
        doc_first = self.cu[:-1].tolist() if self.cu_list is None else self.cu_list  # (its last entry unread)
        wrk = list(self.wrk) if extra is None else [w + e for w, e in zip(self.wrk, extra)]
        refine_moves(doc_first, moved, wrk, max_moves=self.max_moves,
                     tok=None if token_cost is None else list(self.tok), token_cost=token_cost or 0.0,
                     cap_t=self.cap_t, bounds=self._boundaries, sides=self._sides)
        key = (tuple(starts), tuple(ends))  # moves never change a segment's part: equal bounds, equal placement
        if key not in self._by_segments:
            doc, start, end, part = self._whole
            self._by_segments[key] = _finish(self.name, self.n_parts, np.concatenate([_int64(segs.doc), doc]),
                                             np.concatenate([_int64(starts), start]),
                                             np.concatenate([_int64(ends), end]), np.concatenate([_int64(parts), part]))
        return self._by_segments[key]

    @functools.cached_property
    def _by_segments(self) -> dict[tuple[tuple[int, ...], tuple[int, ...]], Placement]:
        """The refined placements by their segments' bounds (refinements that end alike share one placement)."""
        return {}

    @functools.cached_property
    def _boundaries(self) -> list[int]:
        """:func:`.refine.boundaries` of the segments (every refinement starts from them)."""
        return boundaries(self.segments)

    @functools.cached_property
    def _sides(self) -> Sides:
        """:func:`.refine.boundary_sides` of the segments (every refinement of the pass reads them)."""
        return boundary_sides(self._boundaries, self.segments.part, self.n_parts)

    @functools.cached_property
    def _whole(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(doc, start, end, part)`` int64 arrays of the whole documents' segments."""
        doc = _int64(self.whole_doc) if self.whole_doc_ids is None else self.whole_doc_ids
        part = _int64(self.whole_part)
        keep = part >= 0
        doc, part = doc[keep], part[keep]
        return doc, self.cu[doc], self.cu[doc + 1], part


def _int64(values: list[int]) -> np.ndarray:
    """``values`` as an int64 array (``np.fromiter``: faster than ``np.asarray`` on a list)."""
    return np.fromiter(values, dtype=np.int64, count=len(values))
