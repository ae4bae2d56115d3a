"""End-to-end recipe checks on CPU: SP 4 (Ulysses 2 x ring 2, 4 gloo processes under ``accelerate launch``)
logs the losses of one process at SP 1, and a run resumed from a checkpoint (here under another layout, SP 2
on 2 processes) logs the losses of the uninterrupted run. Small sizes: the tiny built-in model, short rows,
a few hundred shipped documents.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hf_hsap.testing import launch_env

# the recipes run as subprocesses, under accelerate launch; 20-50 s each on 2 CPU cores
pytestmark = [pytest.mark.distributed, pytest.mark.slow]

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


@pytest.fixture(scope="module")
def pretrain_sp1(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("pretrain_sp1")
    return out, run_recipe("pretrain.py", out, ["--sp_size", "1", "--save_every", str(PRETRAIN_SAVE),
                                                *PRETRAIN_ARGS])


@pytest.fixture(scope="module")
def sft_sp1(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("sft_sp1")
    return out, run_recipe("sft_trl.py", out, ["--sp_size", "1", "--save_every", str(SFT_SAVE), *SFT_ARGS])


def test_pretrain_sp4_ulysses2_logs_the_sp1_losses(pretrain_sp1, tmp_path: Path) -> None:
    _, ref = pretrain_sp1
    got = run_recipe("pretrain.py", tmp_path, ["--sp_size", "4", "--ulysses_size", "2", *PRETRAIN_ARGS], procs=4)
    steps = list(range(1, PRETRAIN_STEPS + 1))
    assert_same_losses(got, ref, steps)
    for a, b in zip(got, ref):  # the same documents every step, whatever the number of processes
        assert (a["tokens"], a["targets"]) == (b["tokens"], b["targets"])
    assert ref[-1]["loss"] < ref[0]["loss"] - 1.0  # it learns
    assert all(r["tgs"] > 0 and r["peak_mem_gb"] > 0 for r in got)


def test_pretrain_resume_logs_the_uninterrupted_losses(pretrain_sp1, tmp_path: Path) -> None:
    out, ref = pretrain_sp1
    ckpt = out / f"checkpoint-{PRETRAIN_SAVE}"
    assert (ckpt / "hsap_state.json").exists()
    # also under other plan options: KV by peer in rounds of at most 16 tokens (several rounds, refetch)
    got = run_recipe("pretrain.py", tmp_path, ["--sp_size", "2", "--resume_from_checkpoint", str(ckpt),
                                               "--rounds", "by_peer", "--recv_budget_tokens", "16",
                                               *PRETRAIN_ARGS], procs=2)
    assert_same_losses(got, ref, list(range(PRETRAIN_SAVE + 1, PRETRAIN_STEPS + 1)))


# SFT under SP 4 x Ulysses 2 against one process: tests/recipes/test_hsap_sft.py (hsap-sft, which this recipe wraps)


def test_sft_trl_resume_under_sp2_logs_the_uninterrupted_losses(sft_sp1, tmp_path: Path) -> None:
    """3 micro-batches per step: resuming at step 5 skips 15 SP batches, i.e. 7 rounds of 2 and one more."""
    out, ref = sft_sp1
    got = run_recipe("sft_trl.py", tmp_path, ["--sp_size", "2", "--resume_from_checkpoint",
                                              str(out / f"checkpoint-{SFT_SAVE}"), "--hsap_rounds", "batched",
                                              "--hsap_recv_budget_tokens", "16", *SFT_ARGS], procs=2)
    assert_same_losses(got, ref, list(range(SFT_SAVE + 1, SFT_STEPS + 1)))
