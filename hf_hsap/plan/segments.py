"""The segments of split documents that a greedy placement pass builds and :mod:`.refine` moves."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Segments"]


@dataclass(frozen=True)
class Segments:
    """Segments as parallel lists: segment ``i`` holds the global rows ``[start[i], end[i])`` of document ``doc[i]``
    on part ``part[i]``; each document's segments are consecutive and in order. The lists themselves are fixed, their
    contents are not: a greedy pass appends to them, the refinement moves ``start`` / ``end`` in place.

    Attributes:
        doc, start, end, part: the segments' document, first row, end row and part.
    """

    doc: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    part: list[int] = field(default_factory=list)

    def append(self, doc: int, start: int, end: int, part: int) -> None:
        """Add one segment at the end."""
        self.doc.append(doc)
        self.start.append(start)
        self.end.append(end)
        self.part.append(part)

