"""Launch-time refusals under ``accelerate launch`` with the shipped CPU config (2 processes).

A bare ``Accelerator()`` on a CPU machine initialises the process group but reports one process, so
``prepare()`` would not wrap the model for data parallelism: ``init_sequence_parallel`` refuses that state
and names ``Accelerator(cpu=True)``, which works (the control run).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hf_hsap.testing import launch_env

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # two accelerate launches (~25 s on 2 CPU cores)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "workers" / "bare_accelerator.py"
CPU_CONFIG = ROOT / "accelerate_configs" / "cpu_4proc.yaml"


def _launch(kind: str) -> subprocess.CompletedProcess:
    # --main_process_port 0: Accelerate picks a free port right before binding it
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_CONFIG), "--num_processes",
           "2", "--main_process_port", "0", str(SCRIPT), kind]
    return subprocess.run(cmd, cwd=ROOT, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=180)


def test_bare_accelerator_on_cpu_is_refused_with_the_fix() -> None:
    bare = _launch("bare")
    assert bare.returncode != 0, bare.stdout[-3000:]
    assert "counts 1 process(es) but torch.distributed has 2" in bare.stdout, bare.stdout[-3000:]
    assert "Accelerator(cpu=True)" in bare.stdout
    fixed = _launch("cpu")  # the fix the message names
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    assert fixed.stdout.count("OK accelerator 2 processes, sp 2") == 2
