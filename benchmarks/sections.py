"""A step benchmark's own section of BENCHMARKS.md, between its two HTML-comment markers, and its command line (the
VLM and hybrid steps)."""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Markers", "step_main"]


@dataclass(frozen=True)
class Markers:
    """The start and end markers of one section."""

    start: str
    end: str

    def put(self, text: str, section: str) -> str:
        """``text`` (BENCHMARKS.md) with ``section`` between the markers; appended with them at the end the first
        time.

        Args:
            text: the file's content; section: the section's markdown.

        Returns:
            The new content: everything outside the markers byte-identical.
        """
        block = self.block(section)
        if self.start in text and self.end in text:
            head, rest = text.split(self.start, 1)
            return head + block + rest.split(self.end, 1)[1]
        return text + ("" if text.endswith("\n") else "\n") + "\n" + block + "\n"

    def block(self, section: str) -> str:
        """The section with its markers."""
        return f"{self.start}\n{section}{self.end}"

    def committed(self, text: str) -> str | None:
        """The section between the markers of ``text``, or ``None`` without them."""
        if self.start not in text or self.end not in text:
            return None
        return text.split(self.start, 1)[1].split(self.end, 1)[0].removeprefix("\n")


def step_main(argv: Sequence[str] | None, description: str, config: Callable[[bool], Any],
              run: Callable[[Any], dict[str, Any]], render: Callable[[dict[str, Any]], str], out: Path,
              markers: Markers, md_path: Path, quick_help: str) -> int:
    """The command line of a step benchmark: measure, write the results JSON and (unless ``--no-write-md`` or
    ``--quick``) its section of BENCHMARKS.md.

    Args:
        argv: the arguments; description: the ``--help`` line; config: ``quick -> the benchmark's config``;
        run: ``config -> results``; render: ``results -> section``; out: the default results path; markers: the
        section's; md_path: BENCHMARKS.md; quick_help: what ``--quick`` does.

    Returns:
        The exit status.
    """
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--out", default=str(out))
    p.add_argument("--no-write-md", action="store_true", help="leave BENCHMARKS.md alone")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    res = run(config(args.quick))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    section = render(res)
    if not args.no_write_md and not args.quick:
        md_path.write_text(markers.put(md_path.read_text(), section))
    print(section)
    return 0
