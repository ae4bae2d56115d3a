"""A benchmark's section of BENCHMARKS.md goes between its markers and nothing else moves (``benchmarks.sections``,
what the VLM and hybrid step benchmarks write with)."""
from __future__ import annotations

from benchmarks.sections import Markers


def test_the_section_goes_between_its_markers_and_nothing_else_moves() -> None:
    m = Markers("<!-- x:start -->", "<!-- x:end -->")
    text = "# Title\n\n<!-- other:start -->\nother\n<!-- other:end -->\n"
    first = m.put(text, "## A\n")
    assert first == text + f"\n{m.start}\n## A\n{m.end}\n" and m.committed(first) == "## A\n"
    second = m.put(first + "tail\n", "## B\nrow\n")
    assert second == text + f"\n{m.start}\n## B\nrow\n{m.end}\ntail\n"
    assert m.committed(text) is None and m.block("s\n") == f"{m.start}\ns\n{m.end}"
