"""The one rule that writes the benchmark pages: every benchmark command writes its JSON into
``benchmarks/results/``; :func:`publish` then renders ``BENCHMARKS.md`` (the one page a user reads,
:mod:`benchmarks.page`) and every detail file ``benchmarks/results/<name>.md`` (:func:`details`) from all the JSON
there. Nothing is measured here.

Usage: ``python -m benchmarks.publish`` (re-render the page and the detail files from the committed JSON);
``python -m benchmarks.run --render-only`` does the same and redraws the plots.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "BENCHMARKS.md"
MAIN = "results.json"  # python -m benchmarks.run (bash scripts/bench.sh)
# the JSON other commands write beside it, by key of the results dict
SIDE = {"peers": "peers.json", "memory_levers": "memory_levers.json", "memory_model": "memory_model.json",
        "hybrid_step": "hybrid_step.json", "vlm_step": "vlm_step.json", "soak": "soak.json",
        "model_zoo": "model_zoo.json", "vlm_zoo": "vlm_zoo.json"}
RUN_CMD = "bash scripts/bench.sh"
PEERS_CMD = "bash scripts/bench_peers.sh"
MEMORY_CMD = "bash scripts/bench_memory.sh"

__all__ = ["Detail", "details", "load_results", "publish", "publish_after", "render_all", "stamp"]


@dataclass(frozen=True)
class Detail:
    """One detail file: ``benchmarks/results/<name>.md``.

    Attributes:
        name: the file's stem. title: its heading and its line in the page's "Detail" list. commands: the
            commands whose results it shows. render: ``(results dict, the file's folder) -> markdown body``
            (``None`` when the results it needs are missing: no file is written).
    """

    name: str
    title: str
    commands: tuple[str, ...]
    render: Callable[[dict[str, Any], Path], str | None]

    def path(self, folder: Path) -> Path:
        """The file in ``folder``."""
        return folder / f"{self.name}.md"

    def command_text(self) -> str:
        """The commands as markdown code spans, comma-separated."""
        return ", ".join(f"`{c}`" for c in self.commands)


def _run_part(key: str, fn: Callable[[dict[str, Any], Path], str]) -> Callable[[dict[str, Any], Path], str | None]:
    """A renderer of the main run's results.

    Args:
        key: what the results must hold (else no file). fn: ``(results, folder) -> markdown``.

    Returns:
        The renderer; its body opens with the run's data line (:func:`benchmarks.render.data_line`).
    """
    def render(res: dict[str, Any], folder: Path) -> str | None:
        from .render import data_line

        if not (res.get("meta") and res.get(key)):
            return None
        return f"{data_line(res)}\n\n{fn(res, folder)}"
    return render


def _side(key: str, fn: Callable[[Any], str]) -> Callable[[dict[str, Any], Path], str | None]:
    """A renderer of one side result.

    Args:
        key: the result's key in the results dict (no file without it). fn: ``result -> markdown``.

    Returns:
        The renderer.
    """
    return lambda res, folder: fn(res[key]) if res.get(key) else None


@functools.cache
def details() -> tuple[Detail, ...]:
    """The registry of detail files (its imports deferred: the benchmark modules import :func:`publish_after`).

    Returns:
        One :class:`Detail` per file, in the page's order.
    """
    from . import render as rd
    from .analysis import analysis
    from .goals41 import memory_sections
    from .hybrid_step import hybrid_section
    from .peers import peers_section
    from .soak import soak_markdown
    from .sweep_render import render_sweep
    from .vlm_step import vlm_section
    from .windows import render_windows

    def memory(res: dict[str, Any], folder: Path) -> str | None:
        """Both memory sections (levers, memory model), whichever exist."""
        return "\n\n".join(memory_sections(res)) or None

    return (
        Detail("goals", "Goals of issues 6, 19 and 41, with their figures", (RUN_CMD, PEERS_CMD, MEMORY_CMD),
               _run_part("traffic_goals", lambda res, _: rd.goals_detail(res))),
        Detail("analysis", "Where hf_hsap loses, and why", (RUN_CMD,),
               _run_part("cost_rows", lambda res, _: analysis(res))),
        Detail("traffic", "Exact traffic and balance (no clock)", (RUN_CMD,),
               _run_part("traffic_rows", lambda res, _: rd.traffic_detail(res))),
        Detail("windows", "Sliding windows (no clock)", (RUN_CMD,),
               _run_part("windows", lambda res, _: render_windows(res["windows"]))),
        Detail("sweep", "Placement sweep (no clock)", (RUN_CMD,),
               _run_part("sweep", lambda res, _: render_sweep(res["sweep"]))),
        Detail("cost_model", "Cost model: predicted tokens / s / GPU", (RUN_CMD,),
               _run_part("cost_rows", lambda res, _: rd.cost_detail(res))),
        Detail("planning", "Planning time", (RUN_CMD,), _run_part("planning", lambda res, _: rd.planning_detail(res))),
        Detail("cpu", "Measured on CPU: schedules, the kernel, peak memory per rank", (RUN_CMD,),
               _run_part("meta", lambda res, _: rd.cpu_detail(res))),
        Detail("peers", "hf_hsap beside DeepSpeed's sequence parallelism (CPU)", (PEERS_CMD,),
               _side("peers", peers_section)),
        Detail("memory", "Memory levers and the memory model (issue 41)", (MEMORY_CMD,), memory),
        Detail("vlm", "VLM training step (issue 42)", ("bash scripts/bench_vlm.sh",), _side("vlm_step", vlm_section)),
        Detail("hybrid", "Hybrid model training step (linear attention under SP)", ("bash scripts/bench_hybrid.sh",),
               _side("hybrid_step", hybrid_section)),
        Detail("soak", "Soak: a long run with a new layout every step", ("python -m benchmarks.soak",),
               _side("soak", soak_markdown)),
        Detail("plots", "Plots", (RUN_CMD,), _run_part("plots", rd.plots_detail)),
    )


def load_results(folder: Path = RESULTS, main: str = MAIN) -> dict[str, Any]:
    """Every result in ``folder``: the main run's (``main``, empty without it) and each of :data:`SIDE` (``None``
    when its file is missing).

    Args:
        folder: the results folder. main: the main run's file name.

    Returns:
        The main run's results dict with one key per side result added.
    """
    path = folder / main
    res: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for key, name in SIDE.items():
        res[key] = json.loads((folder / name).read_text()) if (folder / name).exists() else None
    return res


def _link(target: Path, start: Path) -> str:
    """``target`` relative to the folder ``start`` (a markdown link's path)."""
    return Path(os.path.relpath(target, start)).as_posix()


def render_all(res: dict[str, Any], folder: Path = RESULTS, page: Path = PAGE,
               models: Path = ROOT / "MODELS.md") -> dict[Path, str | None]:
    """The text of every file :func:`publish` writes (nothing is written).

    Args:
        res: :func:`load_results`'s dict. folder: where the detail files go. page: ``BENCHMARKS.md``. models: the
            model zoo's page (linked from the page).

    Returns:
        ``{path: text}`` for each detail file (``None``: its results are missing, so it is removed) and, when the
        main run's results exist, the page last.
    """
    from .page import render_page

    out: dict[Path, str | None] = {}
    for d in details():
        body = d.render(res, folder)
        out[d.path(folder)] = None if body is None else (
            f"# {d.title}\n\nGenerated by {d.command_text()} from the JSON in this folder; `python -m "
            f"benchmarks.publish` renders it again without measuring. Do not edit by hand. Back to "
            f"[BENCHMARKS.md]({_link(page, folder)}).\n\n" + body.strip("\n") + "\n")
    if res.get("meta"):
        links = {p.stem: _link(p, page.parent) for p, text in out.items() if text is not None}
        out[page] = render_page(res, links, _link(models, page.parent))
    return out


def publish(folder: Path = RESULTS, page: Path = PAGE, main: str = MAIN) -> list[Path]:
    """Render the page and the detail files from the JSON in ``folder`` (:func:`render_all`) and write them; a
    detail file whose results are gone is removed.

    Args:
        folder: the results folder (the detail files go there too). page: ``BENCHMARKS.md``. main: the main run's
            results file in ``folder``.

    Returns:
        The files written (the page last; without the main run's results the page is left alone).
    """
    res = load_results(folder, main)
    written = []
    for path, text in render_all(res, folder, page).items():
        if text is None:
            path.unlink(missing_ok=True)
            continue
        path.write_text(text)
        written.append(path)
    if not res.get("meta"):
        print(f"no {folder / main}: {page} left alone (run bash scripts/bench.sh first)")
    return written


def publish_after(out: str | Path, default: Path, no_write: bool, page: Path = PAGE) -> None:
    """What a benchmark command does after writing its results JSON ``out``: :func:`publish` unless
    ``no_write`` (its ``--no-write-md`` or ``--quick``) or ``out`` is not the file the page reads (``default``).

    Args:
        out: the JSON just written. default: the command's results file in ``benchmarks/results/``.
        no_write: leave the page and the detail files alone. page: ``BENCHMARKS.md``.
    """
    if no_write:
        return
    if Path(out).resolve() != Path(default).resolve():
        print(f"{out} is not {default}: BENCHMARKS.md and the detail files left alone")
        return
    written = publish(Path(default).parent, page)
    print("wrote " + ", ".join(str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in written))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.publish``: render the page and the detail files from the JSON. Returns 0."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.publish", description=__doc__.split("\n")[0])
    p.add_argument("--results", default=str(RESULTS), help="the results folder (default benchmarks/results)")
    p.add_argument("--out", default=str(PAGE), help="the page (default BENCHMARKS.md)")
    args = p.parse_args(argv)
    written = publish(Path(args.results), Path(args.out))
    print(f"wrote {len(written)} files: " + ", ".join(p.name for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
