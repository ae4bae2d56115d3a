"""What a greedy placement (:mod:`.balanced`, :mod:`.density`) hands over before its refinement.

A greedy pass places every document; :func:`.refine.refine_work` then slides boundaries of split
documents. ``placement="auto"`` refines and prices several greedy passes; the state in between lets it
bound a candidate's step time from below before paying for its refinement, finish and transfers
(:meth:`Greedy.floor`), and refine one pass several ways (:meth:`Greedy.placement`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .placement import Placement, _finish
from .refine import refine_floor, refine_work


@dataclass(frozen=True)
class Greedy:
    """The segments and per-part figures of one greedy pass (lists, as the greedy appends them; never
    changed here: every refinement works on copies).

    Attributes:
        name: the placement's name. n_parts: P.
        doc_first: every document's first global position (``cu_seqlens[:-1]``).
        seg_doc, seg_start, seg_end, seg_part: the segments, each document's consecutive and in order.
        tok, wrk: tokens and (query, key) pairs of every part.
        cap_t: the token cap no slide exceeds. max_moves: the refinement's most moves.
    """

    name: str
    n_parts: int
    doc_first: list[int]
    seg_doc: list[int]
    seg_start: list[int]
    seg_end: list[int]
    seg_part: list[int]
    tok: list[float]
    wrk: list[float]
    cap_t: float
    max_moves: int

    def floor(self, token_cost: float) -> float:
        """A lower bound of the largest ``work + token_cost * tokens`` of a part after any refinement
        (:func:`.refine.refine_floor`); a part's step time is at least that (:mod:`.cost`).

        Args:
            token_cost: the price of a token in pairs.

        Returns:
            The bound, in pairs.
        """
        load = [w + token_cost * t for w, t in zip(self.wrk, self.tok)]
        return refine_floor(self.seg_doc, self.seg_start, self.seg_end, self.seg_part, load)

    def placement(self, token_cost: float | None) -> Placement:
        """The refined placement.

        Args:
            token_cost: the refinement evens out ``work + token_cost * tokens`` and may move tokens within
                ``cap_t``; ``None``: it evens out the work at unchanged token counts.

        Returns:
            The placement (named :attr:`name`).
        """
        starts, ends, parts = list(self.seg_start), list(self.seg_end), list(self.seg_part)
        refine_work(self.doc_first, self.seg_doc, starts, ends, parts, list(self.wrk), max_moves=self.max_moves,
                    tok=None if token_cost is None else list(self.tok), token_cost=token_cost or 0.0,
                    cap_t=self.cap_t)
        return _finish(self.name, self.n_parts, self.seg_doc, starts, ends, parts)
