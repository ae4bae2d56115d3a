"""Where the pages read from: the results folder, the JSON each suite writes there (by key of the results dict), the
commands the pages name, and :func:`load_results`, which reads them all. Nothing is measured here."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["HYBRID_CMD", "MAIN", "MEMORY_CMD", "PAGE", "PEERS_CMD", "PLOTS", "RESULTS", "ROOT", "RUN_CMD", "SIDE",
           "SOAK_CMD", "VLM_CMD", "load_results"]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PLOTS = ROOT / "benchmarks" / "plots"
PAGE = ROOT / "BENCHMARKS.md"
MAIN = "results.json"  # python -m benchmarks core (bash scripts/bench.sh)
# the JSON other suites write beside it, by key of the results dict
SIDE = {"peers": "peers.json", "memory_levers": "memory_levers.json", "memory_model": "memory_model.json",
        "sft_memory": "sft_memory.json", "host_memory": "host_memory.json", "hybrid_step": "hybrid_step.json",
        "recurrent_split": "recurrent_split.json", "vlm_step": "vlm_step.json",
        "soak": "soak.json", "model_zoo": "model_zoo.json", "vlm_zoo": "vlm_zoo.json"}
RUN_CMD = "bash scripts/bench.sh"
PEERS_CMD = "bash scripts/bench_peers.sh"
MEMORY_CMD = "bash scripts/bench_memory.sh"
VLM_CMD = "bash scripts/bench_vlm.sh"
HYBRID_CMD = "bash scripts/bench_hybrid.sh"
SOAK_CMD = "python -m benchmarks soak"


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
