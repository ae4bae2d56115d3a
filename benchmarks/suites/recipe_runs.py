"""One rule for measuring a recipe's resident memory: launch it on 2 CPU processes (SP 2) with Accelerate, read the
``metrics.jsonl`` it writes (per step: ``peak_mem_gb``, the largest rank's peak resident set; ``tokens``, the step's
global tokens; ``loss``), and the growth of that peak per token per rank between a short and a long row."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from hf_hsap.testing import launch_env

from .output import ROOT

__all__ = ["PROCESSES", "kb_per_token", "recipe_peak"]

PROCESSES = 2  # every recipe run: 2 CPU processes, SP 2


def recipe_peak(script: str, flags: Sequence[str], out: Path) -> dict[str, Any]:
    """One run of a recipe on :data:`PROCESSES` CPU processes.

    Args:
        script: the recipe's file in ``recipes/`` (e.g. ``"pretrain.py"``). flags: its arguments (``--output_dir``
            is added). out: its output folder.

    Returns:
        ``{"rss_gib": the largest rank's peak resident set over the steps (GiB), "tokens_per_rank": the most tokens
        of a step per rank, "loss": [per step]}``.
    """
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "accelerate_configs" / "cpu_4proc.yaml"), "--num_processes", str(PROCESSES),
           "--main_process_port", "0", str(ROOT / "recipes" / script), *flags, "--output_dir", str(out)]
    subprocess.run(cmd, cwd=ROOT, env=launch_env(), check=True, capture_output=True, timeout=1800)
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"rss_gib": max(r["peak_mem_gb"] for r in records),
            "tokens_per_rank": max(r["tokens"] for r in records) / PROCESSES, "loss": [r["loss"] for r in records]}


def kb_per_token(short: dict[str, Any], long: dict[str, Any]) -> float:
    """The peak resident set's growth between two runs of :func:`recipe_peak`, in KB (1,000 bytes) per token per
    rank."""
    return (long["rss_gib"] - short["rss_gib"]) * 2**30 / 1e3 / (long["tokens_per_rank"] - short["tokens_per_rank"])
