"""The command line of a step benchmark (the VLM and hybrid steps): measure, write the results JSON, then publish
(:func:`benchmarks.publish.publish_after`: ``BENCHMARKS.md`` and every detail file rendered from the JSON)."""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .publish import publish_after, stamp

__all__ = ["step_main"]


def step_main(argv: Sequence[str] | None, description: str, config: Callable[[bool], Any],
              run: Callable[[Any], dict[str, Any]], render: Callable[[dict[str, Any]], str], out: Path,
              quick_help: str) -> int:
    """The command line of a step benchmark: measure, write the results JSON and (unless ``--no-write-md`` or
    ``--quick``) publish: its detail file and ``BENCHMARKS.md``, which reads the JSON.

    Args:
        argv: the arguments; description: the ``--help`` line; config: ``quick -> the benchmark's config``;
        run: ``config -> results``; render: ``results -> its markdown`` (printed); out: the default results path
        (in ``benchmarks/results/``, where the page reads it); quick_help: what ``--quick`` does.

    Returns:
        The exit status.
    """
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help=quick_help + "; BENCHMARKS.md and the detail files left alone")
    p.add_argument("--out", default=str(out))
    p.add_argument("--no-write-md", action="store_true", help="leave BENCHMARKS.md and the detail files alone")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    res = {**run(config(args.quick)), **stamp()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(render(res))
    publish_after(args.out, out, args.no_write_md or args.quick)
    return 0


def stamp() -> dict[str, str]:
    """When and at which commit a benchmark measured: what a command adds to its results JSON (the page states it).

    Returns:
        ``{"date": "YYYY-MM-DD HH:MM UTC", "commit": short hash ("" outside a git checkout)}``.
    """
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit}
