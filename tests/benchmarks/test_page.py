"""BENCHMARKS.md is one short page (``benchmarks/report/page.py``): at most :data:`MAX_LINES` lines, every headline table
right after the command that made it, every detail file under ``benchmarks/results/`` linked and present, and the
committed page and detail files exactly what ``python -m benchmarks report`` renders from the committed JSON."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.__main__ import SUITES
from benchmarks.report import page as pg
from benchmarks.report.details import CORE_GOALS
from benchmarks.report.memory import MEMORY_GOALS
from benchmarks.report.placement_goals import PLACEMENT_GOALS
from benchmarks.report.publish import render_all
from benchmarks.report.registry import DETAILS
from benchmarks.report.sources import PAGE, RESULTS, ROOT, load_results

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.fixture(scope="module")
def committed() -> dict:
    """The results the committed page was rendered from."""
    return load_results()


def _table_starts(lines: list[str]) -> list[int]:
    """The index of each table's first line."""
    return [i for i, line in enumerate(lines) if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))]


def test_the_page_is_short_and_every_link_resolves() -> None:
    text = PAGE.read_text()
    assert text.count("\n") <= pg.MAX_LINES
    links = LINK.findall(text)
    for link in links:
        assert (ROOT / link).exists(), link
    linked = {link for link in links if link.startswith("benchmarks/results/")}
    generated = {f"benchmarks/results/{p.name}" for p in RESULTS.glob("*.md")}
    assert linked == generated and len(generated) >= 12  # every detail file linked, every link a detail file
    assert {f"benchmarks/results/{d.name}.md" for d in DETAILS} >= linked
    assert "MODELS.md" in links
    for path in RESULTS.glob("*.md"):  # and each links back
        back = LINK.findall(path.read_text().split("\n\n", 2)[1])
        assert [(path.parent / b).resolve() for b in back] == [PAGE.resolve()], path.name


def test_each_headline_table_follows_the_command_that_made_it() -> None:
    lines = PAGE.read_text().splitlines()
    starts = _table_starts(lines)
    assert len(starts) >= 12
    for i in starts:
        assert lines[i - 1] == "", lines[i]
        command = lines[i - 2]
        assert command.startswith("Command: `"), (lines[i], command)
        for cmd in re.findall(r"`((?:bash|python)[^`]*)`", command):  # each names a script or a suite that exists
            words = cmd.split()
            if words[:3] == ["python", "-m", "benchmarks"]:
                assert words[3] in SUITES, cmd
                continue
            target = (ROOT / words[1] if words[0] == "bash" or words[1] != "-m"
                      else ROOT / (words[2].replace(".", "/") + ".py"))
            assert target.exists(), cmd


def test_the_header_states_the_data_and_every_goal_table_is_there(committed: dict) -> None:
    text = PAGE.read_text()
    head = text.split("\n## ", 1)[0]
    meta = committed["meta"]
    assert f"{meta['date']}, commit `{meta['commit']}`" in head and f"{meta['cores']} cores" in head
    assert "torch " in head and "`bash scripts/bench_peers.sh`" in head
    for topic in (CORE_GOALS, PLACEMENT_GOALS, MEMORY_GOALS):
        assert f"\n### Goals: {topic}\n" in text


def test_the_committed_files_are_what_publish_renders(committed: dict) -> None:
    out = render_all(committed)
    assert PAGE in out and len(out) == len(DETAILS) + 1
    for path, text in out.items():
        if text is None:
            assert not path.exists(), path
        else:
            assert path.read_text() == text, f"{path.name}: run python -m benchmarks report"


def test_a_page_over_the_limit_is_refused(committed: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg, "MAX_LINES", 50)
    with pytest.raises(ValueError, match="at most 50"):
        pg.render_page(committed, {})
