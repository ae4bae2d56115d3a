"""hf_hsap.checkpoint in one process: what counts as complete, what ``latest`` and an explicit path resolve to,
rotation, and the preemption handler (signals sent to this process)."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from hf_hsap.checkpoint import (COMPLETE_MARKER, PREEMPTED_EXIT_CODE, PreemptionHandler, atomic_save,
                                check_complete, is_complete, latest_complete, mark_complete, resolve_checkpoint,
                                rotate)


def make(out: Path, step: int, complete: bool) -> Path:
    path = out / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"x" * 16)
    if complete:
        mark_complete(path, step)
    return path


def test_latest_is_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    for step, ok in [(2, True), (10, True), (12, False), (9, True)]:
        make(tmp_path, step, ok)
    (tmp_path / "checkpoint-x").mkdir()  # not a checkpoint name
    assert latest_complete(tmp_path) == tmp_path / "checkpoint-10"  # by step, not by name; 12 is partial
    assert resolve_checkpoint(tmp_path, "latest") == resolve_checkpoint(tmp_path, True) == tmp_path / "checkpoint-10"
    assert resolve_checkpoint(tmp_path, None) is None and resolve_checkpoint(tmp_path, "") is None
    assert resolve_checkpoint(tmp_path / "empty", "latest") is None  # a first run starts at step 0
    assert json.loads((tmp_path / "checkpoint-10" / COMPLETE_MARKER).read_text())["step"] == 10
    assert not list(tmp_path.glob("*/*.tmp"))


def test_a_partial_or_missing_checkpoint_is_refused_naming_the_newest_complete(tmp_path: Path) -> None:
    make(tmp_path, 4, True)
    make(tmp_path, 8, False)
    (tmp_path / "checkpoint-9").mkdir()
    (tmp_path / "checkpoint-9" / COMPLETE_MARKER).write_text('{"st')  # a marker cut short is no marker
    assert resolve_checkpoint(tmp_path, str(tmp_path / "checkpoint-4")) == tmp_path / "checkpoint-4"
    for name in ("checkpoint-8", "checkpoint-9"):
        with pytest.raises(ValueError, match=rf"{name} is partial.*newest complete checkpoint there is .*checkpoint-4"):
            resolve_checkpoint(tmp_path, str(tmp_path / name))
    with pytest.raises(ValueError, match="checkpoint-5 does not exist"):
        check_complete(tmp_path / "checkpoint-5")
    with pytest.raises(ValueError, match="holds no complete checkpoint"):
        check_complete(tmp_path / "elsewhere" / "checkpoint-1")


def test_atomic_save_marks_only_a_finished_save_and_replaces_a_partial_one(tmp_path: Path) -> None:
    stale = make(tmp_path, 3, False)
    (stale / "leftover.bin").write_bytes(b"old")
    with atomic_save(stale, 3, is_main=True) as path:
        assert not path.exists() or not (path / "leftover.bin").exists()  # the killed run's files are gone
        path.mkdir(parents=True, exist_ok=True)
        (path / "state.bin").write_bytes(b"new")
    assert is_complete(stale) and sorted(p.name for p in stale.iterdir()) == [COMPLETE_MARKER, "state.bin"]
    with atomic_save(stale, 3, is_main=True) as path:  # into a complete one: unmarked while it is rewritten
        assert not is_complete(path)
        path.mkdir()
    assert is_complete(stale) and [p.name for p in stale.iterdir()] == [COMPLETE_MARKER]
    with pytest.raises(OSError) as err:
        with atomic_save(tmp_path / "checkpoint-5", 5, is_main=True) as path:
            path.mkdir()
            raise OSError(28, "No space left on device")
    assert not is_complete(tmp_path / "checkpoint-5")
    assert any("checkpoint-5 was not completed" in n and "checkpoint-3" in n for n in err.value.__notes__)


def test_rotation_keeps_the_newest_complete_and_what_is_asked(tmp_path: Path) -> None:
    for step, ok in [(1, True), (2, False), (3, True), (4, True), (5, True), (6, False)]:
        make(tmp_path, step, ok)
    assert rotate(tmp_path, None) == []
    deleted = rotate(tmp_path, 2, keep=[tmp_path / "checkpoint-1"])
    assert sorted(p.name for p in deleted) == ["checkpoint-2", "checkpoint-3"]  # old complete + old partial
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "checkpoint-4", "checkpoint-5",
                                                          "checkpoint-6"]  # 6 may be being written
    rotate(tmp_path, 1)
    assert latest_complete(tmp_path) == tmp_path / "checkpoint-5"
    with pytest.raises(ValueError, match=">= 1"):
        rotate(tmp_path, 0)


def test_the_handler_flags_a_signal_and_restores_the_previous_handlers() -> None:
    seen: list[int] = []
    before = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    try:
        previous = signal.getsignal(signal.SIGUSR1)
        with PreemptionHandler() as handler:
            assert signal.getsignal(signal.SIGTERM) == handler._on_signal
            assert not handler.should_stop()
            os.kill(os.getpid(), signal.SIGUSR1)
            assert handler.received == signal.SIGUSR1 and handler.should_stop() and handler.stopped
            os.kill(os.getpid(), signal.SIGUSR1)  # a second one: the previous handler, at once
            assert seen == [signal.SIGUSR1]
        assert signal.getsignal(signal.SIGUSR1) is previous and seen == [signal.SIGUSR1]
        with PreemptionHandler(signals=()) as none:
            assert signal.getsignal(signal.SIGUSR1) is previous and not none.should_stop()
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert PREEMPTED_EXIT_CODE == 75  # documented (README, recipes): EX_TEMPFAIL
