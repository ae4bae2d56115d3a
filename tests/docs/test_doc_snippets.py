"""Every code snippet of the guides in ``docs/`` runs, once: the guides include their Python and shell snippets
from ``docs/snippets/`` (``--8<--``, pymdownx.snippets) and write no other Python; a shell block written inline
is titled as not run here. Each snippet file runs in a fresh process in a scratch directory, except those that
README.md holds as Python blocks: they must be identical to their files, and tests/recipes/test_readme.py runs
them."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hf_hsap.testing import launch_env

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SNIPPETS = sorted(p for p in (DOCS / "snippets").iterdir() if p.suffix in (".py", ".sh"))
README_BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```", flags=re.S | re.M)
INCLUDE = re.compile(r'--8<-- "(docs/snippets/[^"]+)"\n')
NOT_RUN = "not run by the docs tests"
RUN_HERE = [p for p in SNIPPETS if p.read_text() not in README_BLOCKS]


def _fences() -> list[tuple[str, str, str, str]]:
    """(page, language, the rest of the opening line, body) of every fenced block of the guides."""
    return [(page.relative_to(DOCS).as_posix(), *match.groups())
            for page in sorted(DOCS.rglob("*.md")) for match in FENCE.finditer(page.read_text())]


def test_guides_run_only_included_snippets() -> None:
    included = set()
    for page, language, info, body in _fences():
        include = INCLUDE.fullmatch(body)
        if language == "python":
            assert include, f"{page}: a Python block must include a file of docs/snippets, not hold code"
        elif language == "bash" and not include:
            assert NOT_RUN in info, f"{page}: a shell block is a docs/snippets file or titled '({NOT_RUN})'"
        if include:
            assert (ROOT / include.group(1)).is_file(), f"{page} includes a missing {include.group(1)}"
            assert Path(include.group(1)).suffix == {"python": ".py", "bash": ".sh"}[language], (page, body)
            included.add(include.group(1))
    assert included == {p.relative_to(ROOT).as_posix() for p in SNIPPETS}, "a snippet file no guide includes"


def test_readme_python_blocks_are_snippet_files() -> None:
    files = {p.read_text() for p in SNIPPETS}
    assert len(README_BLOCKS) >= 3
    for block in README_BLOCKS:
        assert block in files, f"README.md's Python block is no docs/snippets file:\n{block}"


@pytest.mark.distributed
@pytest.mark.parametrize("snippet", RUN_HERE, ids=lambda p: p.name)
def test_snippet_runs(snippet: Path, tmp_path: Path) -> None:
    env = launch_env()  # hsap-plan: the console script of this interpreter's environment
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = [sys.executable, str(snippet)] if snippet.suffix == ".py" else ["bash", "-euo", "pipefail", str(snippet)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{snippet.name} failed ({proc.returncode}):\n{proc.stderr[-5000:]}"
    assert proc.stdout.strip(), f"{snippet.name} printed nothing"
