"""A suite writes its JSON and says whether the pages are rendered again (``benchmarks.suites.output``: not with
``--no-write-md`` or ``--quick``, nor when its JSON went elsewhere); the entry point renders them
(``benchmarks.report.publish.publish``: the detail files from the JSON of a folder; a detail file whose JSON is gone
is removed). Run in a temporary folder: the repository's page and detail files are never touched."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.__main__ import SUITES, main
from benchmarks.report.hybrid import hybrid_section
from benchmarks.report.publish import publish
from benchmarks.report.sources import PAGE
from benchmarks.suites.hybrid_step import DEFAULT_OUT
from benchmarks.suites.output import renders_pages, step_main


def _folder(tmp_path: Path) -> tuple[dict, Path, Path]:
    res = json.loads(DEFAULT_OUT.read_text())
    folder = tmp_path / "results"
    folder.mkdir()
    return res, folder / DEFAULT_OUT.name, tmp_path / "BENCHMARKS.md"


def test_pages_are_rendered_only_when_asked_and_from_the_folder_s_json(tmp_path: Path) -> None:
    res, default, page = _folder(tmp_path)
    default.write_text(json.dumps(res))
    assert not renders_pages(default, default, leave=True)
    assert not renders_pages(tmp_path / "elsewhere.json", default, leave=False)
    assert renders_pages(default, default, leave=False)
    assert publish(default.parent, page) == [default.parent / "hybrid.md"]
    text = (default.parent / "hybrid.md").read_text()
    assert hybrid_section(res).strip() in text and "[BENCHMARKS.md](../BENCHMARKS.md)" in text
    assert not page.exists()  # no results.json of the core suite: the page is left alone
    default.unlink()
    assert publish(default.parent, page) == [] and not (default.parent / "hybrid.md").exists()


def test_step_main_stamps_its_json_and_asks_for_the_pages_unless_told_not_to(tmp_path: Path) -> None:
    res, default, _ = _folder(tmp_path)

    def run(*flags: str) -> tuple[dict, bool]:
        outcome = step_main(["--out", str(default), *flags], suite="hybrid", description="d",
                            config=lambda quick: quick, run=lambda quick: dict(res), out=default, quick_help="q")
        written = json.loads(default.read_text())
        assert outcome.status == 0 and outcome.results == written
        return written, outcome.render_pages

    written, render = run("--no-write-md")
    assert written["rows"] == res["rows"] and len(written["date"]) > 10 and "commit" in written and not render
    assert not run("--quick")[1]
    assert run()[1]
    assert not list(default.parent.glob("*.md"))  # a suite never renders a page itself


def test_the_entry_point_renders_the_pages_of_a_folder_and_refuses_an_unknown_suite(tmp_path: Path) -> None:
    res, default, page = _folder(tmp_path)
    default.write_text(json.dumps(res))
    before = PAGE.stat().st_mtime_ns
    assert main(["report", "--results", str(default.parent), "--out", str(page)]) == 0
    assert (default.parent / "hybrid.md").exists() and not page.exists()
    assert PAGE.stat().st_mtime_ns == before
    assert main(["no-such-suite"]) == 2 and main([]) == 2
    assert {"core", "peers", "memory", "hybrid", "vlm", "soak", "sweep", "windows", "calibrate"} <= set(SUITES)
