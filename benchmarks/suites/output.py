"""What every suite shares: where its results go, the stamp its results JSON carries, what it hands back to the entry
point (:class:`Outcome`: ``python -m benchmarks <suite>`` then re-renders the pages from the JSON, in
:mod:`benchmarks.report`, which no suite imports), and the command line of a step benchmark (the VLM and hybrid
steps, :func:`step_main`).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ROOT", "RESULTS", "Outcome", "command_line", "renders_pages", "stamp", "step_main"]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"  # every suite's results JSON, where the pages read them


@dataclass(frozen=True)
class Outcome:
    """What a suite did.

    Attributes:
        status: the exit status (1: a check of the suite failed; its results are written all the same).
        results: what it measured (the entry point prints their section), or ``None``.
        render_pages: whether the entry point renders ``BENCHMARKS.md`` and the detail files again from the JSON
            (:func:`renders_pages`).
    """

    status: int
    results: dict[str, Any] | None
    render_pages: bool


def command_line(suite: str, argv: Sequence[str]) -> str:
    """The command that ran a suite, as its results JSON records it.

    Args:
        suite: the suite's name (``python -m benchmarks <suite>``). argv: its arguments.

    Returns:
        ``"python -m benchmarks <suite> <args>"``.
    """
    return f"python -m benchmarks {suite}" + "".join(f" {a}" for a in argv)


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


def renders_pages(out: str | Path, default: Path, leave: bool) -> bool:
    """Whether the pages are rendered again after a suite wrote its results JSON ``out``: not when ``leave`` (its
    ``--no-write-md`` or ``--quick``), nor when ``out`` is not the file the pages read (``default``).

    Args:
        out: the JSON just written. default: the suite's results file in ``benchmarks/results/``.
        leave: leave the page and the detail files alone.

    Returns:
        True when the entry point renders the pages.
    """
    if leave:
        return False
    if Path(out).resolve() != Path(default).resolve():
        print(f"{out} is not {default}: BENCHMARKS.md and the detail files left alone")
        return False
    return True


def step_main(argv: Sequence[str], *, suite: str, description: str, config: Callable[[bool], Any],
              run: Callable[[Any], dict[str, Any]], out: Path, quick_help: str) -> Outcome:
    """The command line of a step benchmark: measure and write the results JSON; the pages are rendered again
    unless ``--no-write-md`` or ``--quick``.

    Args:
        argv: the arguments; suite: its name; description: the ``--help`` line; config: ``quick -> the benchmark's
        config``; run: ``config -> results``; out: the default results path (in ``benchmarks/results/``, where the
        page reads it); quick_help: what ``--quick`` does.

    Returns:
        The outcome (status 0).
    """
    p = argparse.ArgumentParser(prog=f"python -m benchmarks {suite}", description=description)
    p.add_argument("--quick", action="store_true", help=quick_help + "; BENCHMARKS.md and the detail files left alone")
    p.add_argument("--out", default=str(out))
    p.add_argument("--no-write-md", action="store_true", help="leave BENCHMARKS.md and the detail files alone")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    res = {**run(config(args.quick)), **stamp()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return Outcome(0, res, renders_pages(args.out, out, args.no_write_md or args.quick))
