"""A benchmark command publishes after it measures (``benchmarks.sections.step_main``,
``benchmarks.publish.publish_after``): its JSON, stamped with date and commit, then the detail files rendered from
the JSON of its folder, unless ``--no-write-md`` or ``--quick`` or its JSON went elsewhere; a detail file whose JSON
is gone is removed. Run in a temporary folder: the repository's page and detail files are never touched."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.hybrid_step import DEFAULT_OUT, hybrid_section
from benchmarks.publish import PAGE, publish, publish_after
from benchmarks.sections import step_main


def _folder(tmp_path: Path) -> tuple[dict, Path, Path]:
    res = json.loads(DEFAULT_OUT.read_text())
    folder = tmp_path / "results"
    folder.mkdir()
    return res, folder / DEFAULT_OUT.name, tmp_path / "BENCHMARKS.md"


def test_publish_after_writes_the_detail_file_only_when_asked(tmp_path: Path) -> None:
    res, default, page = _folder(tmp_path)
    default.write_text(json.dumps(res))
    publish_after(default, default, no_write=True, page=page)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(res))
    publish_after(elsewhere, default, no_write=False, page=page)
    assert not list(default.parent.glob("*.md"))
    publish_after(default, default, no_write=False, page=page)
    assert [p.name for p in default.parent.glob("*.md")] == ["hybrid.md"]
    text = (default.parent / "hybrid.md").read_text()
    assert hybrid_section(res).strip() in text and "[BENCHMARKS.md](../BENCHMARKS.md)" in text
    assert not page.exists()  # no results.json of the main run: the page is left alone
    default.unlink()
    assert publish(default.parent, page) == [] and not (default.parent / "hybrid.md").exists()


def test_step_main_stamps_its_json_and_publishes_unless_told_not_to(tmp_path: Path) -> None:
    res, default, _ = _folder(tmp_path)
    before = PAGE.stat().st_mtime_ns

    def main(*flags: str) -> dict:
        assert step_main(["--out", str(default), *flags], "d", lambda quick: quick, lambda quick: dict(res),
                         hybrid_section, default, "q") == 0
        return json.loads(default.read_text())

    written = main("--no-write-md")
    assert written["rows"] == res["rows"] and len(written["date"]) > 10 and "commit" in written
    assert not list(default.parent.glob("*.md"))
    main("--quick")
    assert not list(default.parent.glob("*.md"))
    main()
    assert hybrid_section(res).strip() in (default.parent / "hybrid.md").read_text()
    assert PAGE.stat().st_mtime_ns == before  # no main run in the folder: the page is left alone
