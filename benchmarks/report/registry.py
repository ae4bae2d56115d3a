"""The registry of detail files (:data:`DETAILS`): each file ``benchmarks/results/<name>.md``, its title, the
commands whose results it shows and the renderer that makes it from the results dict
(:func:`benchmarks.report.sources.load_results`)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import details as dt
from .analysis import analysis
from .cpu import cpu_detail
from .details import data_line
from .hybrid import hybrid_section
from .memory import memory_sections
from .peers import peers_section
from .recurrent_split import split_section
from .soak import soak_markdown
from .sources import HYBRID_CMD, MEMORY_CMD, PEERS_CMD, RUN_CMD, SOAK_CMD, VLM_CMD
from .sweep import render_sweep
from .vlm import vlm_section
from .windows import render_windows

__all__ = ["DETAILS", "Detail"]


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
        The renderer; its body opens with the run's data line (:func:`benchmarks.report.details.data_line`).
    """
    def render(res: dict[str, Any], folder: Path) -> str | None:
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


def _hybrid(res: dict[str, Any], folder: Path) -> str | None:
    """The hybrid step's section and the split-document section of the recurrent-only models, whichever exist."""
    parts = [fn(res[key]) for key, fn in (("hybrid_step", hybrid_section), ("recurrent_split", split_section))
             if res.get(key)]
    return "\n".join(parts) or None


def _memory(res: dict[str, Any], folder: Path) -> str | None:
    """Both memory sections (levers, memory model), whichever exist."""
    return "\n\n".join(memory_sections(res)) or None


DETAILS: tuple[Detail, ...] = (
    Detail("goals", "Goals, with their figures", (RUN_CMD, PEERS_CMD, MEMORY_CMD),
           _run_part("traffic_goals", lambda res, _: dt.goals_detail(res))),
    Detail("analysis", "Where hf_hsap loses, and why", (RUN_CMD,),
           _run_part("cost_rows", lambda res, _: analysis(res))),
    Detail("traffic", "Exact traffic and balance (no clock)", (RUN_CMD,),
           _run_part("traffic_rows", lambda res, _: dt.traffic_detail(res))),
    Detail("windows", "Sliding windows (no clock)", (RUN_CMD,),
           _run_part("windows", lambda res, _: render_windows(res["windows"]))),
    Detail("sweep", "Placement sweep (no clock)", (RUN_CMD,),
           _run_part("sweep", lambda res, _: render_sweep(res["sweep"]))),
    Detail("cost_model", "Cost model: predicted tokens / s / GPU", (RUN_CMD,),
           _run_part("cost_rows", lambda res, _: dt.cost_detail(res))),
    Detail("planning", "Planning time", (RUN_CMD,), _run_part("planning", lambda res, _: dt.planning_detail(res))),
    Detail("cpu", "Measured on CPU: schedules, the kernel, peak memory per rank", (RUN_CMD,),
           _run_part("meta", lambda res, _: cpu_detail(res))),
    Detail("peers", "hf_hsap beside DeepSpeed's sequence parallelism (CPU)", (PEERS_CMD,),
           _side("peers", peers_section)),
    Detail("memory", "Memory levers and the memory model", (MEMORY_CMD,), _memory),
    Detail("vlm", "VLM training step", (VLM_CMD,), _side("vlm_step", vlm_section)),
    Detail("hybrid", "Hybrid model training step (linear attention under SP)", (HYBRID_CMD,), _hybrid),
    Detail("soak", "Soak: a long run with a new layout every step", (SOAK_CMD,), _side("soak", soak_markdown)),
    Detail("plots", "Plots", (RUN_CMD,), _run_part("traffic_rows", dt.plots_detail)),
)  # one per file, in the page's order
