"""The documentation site builds with ``mkdocs build --strict`` (every link, anchor and API docstring checked),
and README.md's relative links name files of the repository."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_links_exist() -> None:
    links = re.findall(r"\[[^\]]+\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    local = [link.split("#")[0] for link in links if not re.match(r"[a-z]+:|#", link)]
    assert any(link.startswith("docs/") for link in local)
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_site_builds_strict(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]
    index = (tmp_path / "site" / "index.html").read_text()
    assert "Set up and run (fresh machine)" in index  # README.md is the front page
    assert (tmp_path / "site" / "api" / "hf_hsap" / "index.html").read_text().count('id="hf_hsap.') > 20
