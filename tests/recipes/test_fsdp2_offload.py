"""FSDP2 with CPUOffloadPolicy through the shipped ``accelerate_configs/fsdp2_offload_8.yaml`` (``--num_processes 2``,
fp32) at HSAP SP 2 on CPU gives the single-process losses (rel. 1e-4) with the pretraining recipe (2 micro-batches
per step: FSDP2's gradient sync skipped on the first, and an eval) and with HSAPSFTTrainer. Accelerate runs no FSDP
on CPU by itself: the ranks run under ``scripts/cpu_engine.py`` (which also sets ``pin_memory=False``) and report the
engine they got (``detect_offload`` on the live Accelerator)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hf_hsap.testing import launch_env

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # four runs, two of them accelerate launches (~70 s)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "accelerate_configs" / "fsdp2_offload_8.yaml"
HARNESS, WORKER = ROOT / "scripts" / "cpu_engine.py", ROOT / "scripts" / "engine_sft_worker.py"
REL_TOL = 1e-4  # float32; observed differences are ~1e-7
PRETRAIN = ["--max_steps", "3", "--grad_accum", "2", "--max_length", "128", "--docs_per_step", "8",
            "--max_samples", "200", "--eval_docs", "16", "--eval_every", "3", "--seed", "3", "--no_final_model"]


def _run(target: list[str], fsdp: bool) -> str:
    cmd = [sys.executable, *target]
    if fsdp:  # --main_process_port 0: Accelerate picks a free port right before binding it
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIG), "--num_processes",
               "2", "--mixed_precision", "no", "--main_process_port", "0", str(HARNESS), *target]
    proc = subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-6000:]}"
    if fsdp:
        assert re.search(r"^ENGINE FSDP OFFLOAD params$", proc.stdout, flags=re.M), proc.stdout[-3000:]
    return proc.stdout


def _assert_close(got: list[float], ref: list[float]) -> None:
    assert len(got) == len(ref) and all(abs(a - b) <= REL_TOL * abs(b) for a, b in zip(got, ref)), (got, ref)


def _metrics(out: Path) -> dict[str, list[float]]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {k: [r[k] for r in records if k in r] for k in ("loss", "eval_loss")}


def test_pretrain_recipe_under_fsdp2_cpu_offload(tmp_path: Path) -> None:
    recipe = str(ROOT / "recipes" / "pretrain.py")
    _run([recipe, "--output_dir", str(tmp_path / "ref"), "--sp_size", "1", *PRETRAIN], fsdp=False)
    out = _run([recipe, "--output_dir", str(tmp_path / "fsdp"), "--sp_size", "2", *PRETRAIN], fsdp=True)
    assert "FSDP world 2 = dp 1 x sp 2" in out
    ref, got = _metrics(tmp_path / "ref"), _metrics(tmp_path / "fsdp")
    assert len(ref["loss"]) == 3 and len(ref["eval_loss"]) == 1
    _assert_close(got["loss"], ref["loss"])
    _assert_close(got["eval_loss"], ref["eval_loss"])


def test_hsap_sft_trainer_under_fsdp2_cpu_offload(tmp_path: Path) -> None:
    from hf_hsap.examples import save_sft_data, save_tiny_model

    model, data = save_tiny_model(tmp_path / "model", max_length=128), save_sft_data(tmp_path / "data", n_train=48)

    def losses(stdout: str) -> tuple[list[float], Any]:
        found = re.search(r"^LOSS (\[.*\])$", stdout, flags=re.M)
        return json.loads(found.group(1)), re.search(r"^OPTIMIZER (\S+)$", stdout, flags=re.M).group(1)

    ref, _ = losses(_run([str(WORKER), model, data, str(tmp_path / "ref")], fsdp=False))
    got, optimizer = losses(_run([str(WORKER), model, data, str(tmp_path / "fsdp")], fsdp=True))
    assert len(ref) == 4 and optimizer == "AdamW"
    _assert_close(got, ref)
