"""Every Python snippet of the README runs as written on CPU (each in a fresh process, in a scratch
directory); the training-loop snippet also under ``accelerate launch`` on 2 processes, where it must print the
loss of the single-process run on every rank."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_hsap.testing import launch_env

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def _run(code: str, cwd: Path, procs: int = 1) -> str:
    script = cwd / "snippet.py"
    script.write_text(code)
    cmd = [sys.executable, str(script)]
    if procs > 1:  # --main_process_port 0: Accelerate picks a free port itself (a short race window remains)
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "accelerate_configs" / "cpu_4proc.yaml"), "--num_processes", str(procs),
               "--main_process_port", "0", str(script)]
    proc = subprocess.run(cmd, cwd=cwd, env=launch_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"README snippet failed ({proc.returncode}):\n{code}\n{proc.stderr[-5000:]}"
    return proc.stdout


def test_readme_has_the_snippets() -> None:
    assert len(BLOCKS) >= 3
    setup = re.search(r"## Set up and run \(fresh machine\)\n\n```bash\n(.*?)```", (ROOT / "README.md").read_text(),
                      flags=re.S)
    assert setup is not None
    commands = [line.split("#")[0].strip() for line in setup.group(1).splitlines() if line.split("#")[0].strip()]
    assert commands == ["bash scripts/pretrain_cpu.sh", "bash scripts/test.sh"]


@pytest.mark.distributed
@pytest.mark.parametrize("index", [i for i, b in enumerate(BLOCKS) if "SPDataLoader(loader" not in b])
def test_readme_python_snippet_runs(index: int, tmp_path: Path) -> None:
    _run(BLOCKS[index], tmp_path)  # the loop snippet runs in the next test


@pytest.mark.distributed
@pytest.mark.slow
def test_readme_loop_gives_the_single_process_loss_on_2_processes(tmp_path: Path) -> None:
    loop = next(b for b in BLOCKS if "SPDataLoader(loader" in b)
    one = re.findall(r"loss (\d+\.\d+)", _run(loop, tmp_path))
    two = re.findall(r"loss (\d+\.\d+)", _run(loop, tmp_path, procs=2))
    assert len(one) == 1 and len(two) == 2
    assert two[0] == two[1] == one[0], (one, two)
