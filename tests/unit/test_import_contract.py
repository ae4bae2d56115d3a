"""The import contract (``.importlinter``): the layers of ARCHITECTURE.md, a planner that reaches no process group,
runtime or device query, and the benchmarks' layers (no suite imports the report). ``lint-imports`` is
import-linter's command."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _lint(config: pathlib.Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.fail("import-linter is not installed: pip install -e '.[test]' (scripts/setup_env.sh does)")
    return subprocess.run([exe, "--config", str(config), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_the_import_contract_holds() -> None:
    res = _lint(ROOT / ".importlinter")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 kept, 0 broken" in res.stdout


def test_the_linter_catches_a_broken_layer(tmp_path) -> None:
    """The same tool fails on a contract the code breaks (the plan placed above the runtime)."""
    cfg = tmp_path / "broken.ini"
    cfg.write_text("[importlinter]\nroot_package = hf_hsap\n\n[importlinter:contract:x]\nname = inverted\n"
                   "type = layers\ncontainers =\n    hf_hsap\nlayers =\n    plan\n    runtime\n")
    res = _lint(cfg)
    assert res.returncode != 0 and "BROKEN" in res.stdout and "hf_hsap.runtime" in res.stdout
