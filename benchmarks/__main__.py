"""The one entry point of the benchmarks: ``python -m benchmarks <suite> [args]`` runs a suite (:data:`SUITES`), prints
its section and, unless the suite says to leave them (``--quick``, ``--no-write-md``, a results file elsewhere),
renders ``BENCHMARKS.md`` and the detail files again from every results JSON (:func:`benchmarks.report.publish.publish`;
after the core suite, the plots too). ``python -m benchmarks report [--plots]`` renders them without measuring.

    python -m benchmarks core [--quick] [--skip-cpu]     # bash scripts/bench.sh
    python -m benchmarks peers [--quick] [--T N]         # bash scripts/bench_peers.sh (DeepSpeed's environment)
    python -m benchmarks memory [--quick]                # bash scripts/bench_memory.sh: memory_levers, memory_model,
                                                         #   sft_memory, host_memory
    python -m benchmarks sft_memory [--quick]            # the SFT recipe's resident memory (in memory too)
    python -m benchmarks host_memory [--quick]           # the model's host terms against CPU runs' peak RSS (in
                                                         #   memory too)
    python -m benchmarks hybrid [--quick]                # bash scripts/bench_hybrid.sh: hybrid_step, recurrent_split
    python -m benchmarks recurrent_split [--quick]       # a split document in recurrent-only models (in hybrid too)
    python -m benchmarks vlm [--quick]                   # bash scripts/bench_vlm.sh
    python -m benchmarks report                          # the pages from the committed JSON
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .report.hybrid import hybrid_section
from .report.memory import levers_section
from .report.peers import peers_section
from .report.plots import draw_plots
from .report.publish import publish
from .report.recurrent_split import split_section
from .report.soak import soak_markdown
from .report.sources import MAIN, PAGE, PLOTS, RESULTS, ROOT
from .report.sweep import render_sweep
from .report.vlm import vlm_section
from .report.windows import render_windows
from .suites import (core, gpu_calibrate, host_memory, hybrid_step, memory_levers, memory_model, peers,
                     recurrent_split, sft_memory, soak, sweep, vlm_step, windows)
from .suites.output import Outcome

__all__ = ["SUITES", "Step", "main"]


@dataclass(frozen=True)
class Step:
    """One suite run by the entry point.

    Attributes:
        run: the suite's ``main(argv) -> Outcome``. section: ``results -> markdown`` printed after it (``None``:
            nothing printed). takes_args: whether the command line's arguments go to it (else it runs without).
    """

    run: Callable[[Sequence[str]], Outcome]
    section: Callable[[dict[str, Any]], str] | None = None
    takes_args: bool = True


SUITES: dict[str, tuple[Step, ...]] = {
    "core": (Step(core.main),),
    "peers": (Step(peers.main, peers_section),),
    "memory": (Step(memory_levers.main, levers_section), Step(memory_model.main, takes_args=False),
               Step(sft_memory.main, takes_args=False), Step(host_memory.main, takes_args=False)),
    "memory_levers": (Step(memory_levers.main, levers_section),),
    "memory_model": (Step(memory_model.main),),
    "sft_memory": (Step(sft_memory.main),),
    "host_memory": (Step(host_memory.main),),
    "hybrid": (Step(hybrid_step.main, hybrid_section), Step(recurrent_split.main_after_hybrid, split_section)),
    "recurrent_split": (Step(recurrent_split.main, split_section),),
    "vlm": (Step(vlm_step.main, vlm_section),),
    "soak": (Step(soak.main, soak_markdown),),
    "sweep": (Step(sweep.main, render_sweep),),
    "windows": (Step(windows.main, render_windows),),
    "calibrate": (Step(gpu_calibrate.main),),
}  # a suite of several steps runs them in order (the first one's arguments from the command line)


def _shown(paths: Sequence[Path]) -> str:
    """Paths relative to the repository root where they are inside it."""
    return ", ".join(str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in paths)


def report(argv: Sequence[str]) -> int:
    """``python -m benchmarks report [--plots]``: the pages (and with ``--plots`` the plots) from the JSON.

    Args:
        argv: the arguments after ``report``.

    Returns:
        0.
    """
    p = argparse.ArgumentParser(prog="python -m benchmarks report", description=report.__doc__.split("\n")[0])
    p.add_argument("--results", default=str(RESULTS), help="the results folder (default benchmarks/results)")
    p.add_argument("--out", default=str(PAGE), help="the page (default BENCHMARKS.md)")
    p.add_argument("--plots", action="store_true",
                   help="also redraw the plots into benchmarks/plots/ (from benchmarks/results/ only)")
    args = p.parse_args(argv)
    folder = Path(args.results)
    if args.plots and folder.resolve() == RESULTS.resolve() and (folder / MAIN).exists():
        print(f"wrote {_shown(draw_plots(json.loads((folder / MAIN).read_text()), PLOTS))}")
    print(f"wrote {_shown(publish(folder, Path(args.out)))}")
    return 0


def run_suite(name: str, argv: Sequence[str]) -> int:
    """Run a suite's steps, print their sections, then render the pages (and after the core suite the plots) when
    every step asks for it.

    Args:
        name: the suite (:data:`SUITES`). argv: its arguments.

    Returns:
        The first failing step's status, else 0.
    """
    outcomes = []
    for step in SUITES[name]:
        outcome = step.run(argv if step.takes_args else [])
        if step.section is not None and outcome.results is not None:
            print(step.section(outcome.results))
        outcomes.append(outcome)
    if all(o.render_pages for o in outcomes):
        if name == "core":
            print(f"wrote {_shown(draw_plots(json.loads((RESULTS / MAIN).read_text()), PLOTS))}")
        print(f"wrote {_shown(publish())}")
    return next((o.status for o in outcomes if o.status), 0)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks <suite> [args]`` or ``python -m benchmarks report [args]``.

    Args:
        argv: the command line after ``python -m benchmarks`` (default ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*SUITES, "report"):
        print(__doc__.strip() + f"\n\nSuites: {', '.join(SUITES)}; or report.", file=sys.stderr)
        return 2
    return report(argv[1:]) if argv[0] == "report" else run_suite(argv[0], argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
