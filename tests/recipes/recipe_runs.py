"""What the recipe tests share: running a recipe (one process or ``accelerate launch``), its arguments, and the
loss comparison. The session-wide reference runs are fixtures in ``conftest.py``."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from hf_hsap.testing import launch_env

ROOT = Path(__file__).resolve().parents[2]
CPU_CONFIG = ROOT / "accelerate_configs" / "cpu_4proc.yaml"
RUN_TIMEOUT_S = 240
REL_TOL = 1e-3  # the bound; observed differences are ~1e-7
PRETRAIN_STEPS, PRETRAIN_SAVE = 30, 15
PRETRAIN_ARGS = ["--max_steps", str(PRETRAIN_STEPS), "--max_length", "128", "--docs_per_step", "8",
                 "--max_samples", "300", "--eval_docs", "16", "--eval_every", "15", "--seed", "3",
                 "--no_final_model"]
SFT_STEPS, SFT_SAVE = 10, 5
SFT_ARGS = ["--max_steps", str(SFT_STEPS), "--max_length", "128", "--rows_per_step", "3", "--max_samples", "200",
            "--seed", "1"]


def run_recipe(script: str, out: Path, args: list[str], procs: int = 1) -> list[dict[str, Any]]:
    """Run ``recipes/<script>`` (one process, or ``accelerate launch`` with ``procs`` CPU processes);
    returns its metrics.jsonl records."""
    target = [str(ROOT / "recipes" / script), "--output_dir", str(out), *args]
    if procs == 1:
        cmd = [sys.executable, *target]
    else:  # --main_process_port 0: Accelerate picks a free port right before binding it
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_CONFIG),
               "--num_processes", str(procs), "--main_process_port", "0", *target]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # its own process group: the ranks go with it
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the launcher's elastic agent passes SIGTERM on to the ranks
        try:
            output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        raise AssertionError(f"{' '.join(cmd)} did not finish in {RUN_TIMEOUT_S}s:\n{output[-6000:]}") from None
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-8000:]}")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def assert_same_losses(got: list[dict[str, Any]], ref: list[dict[str, Any]], steps: list[int]) -> None:
    """Every listed step is logged by both runs with losses within REL_TOL."""
    by_step = {r["step"]: r for r in got}
    ref_by_step = {r["step"]: r for r in ref}
    assert sorted(by_step) == steps, f"logged steps {sorted(by_step)} != {steps}"
    for s in steps:
        a, b = by_step[s]["loss"], ref_by_step[s]["loss"]
        assert abs(a - b) <= REL_TOL * abs(b), f"step {s}: loss {a} vs {b}"
        for key in ("eval_loss",):
            if key in ref_by_step[s]:
                assert abs(by_step[s][key] - ref_by_step[s][key]) <= REL_TOL * abs(ref_by_step[s][key])
