"""Faults around the step, on CPU (2 gloo ranks, each its own process, ``hf_hsap.testing.run_ranks``): one run
of the pretraining recipe is taken through a SIGTERM during a step, a SIGKILL of one rank during a save, a full
disk during a save and a SIGKILL during a step, each run resuming with ``--resume_from_checkpoint latest``; the
last one finishes. Every fault must end both ranks before the deadline (no hang), keep the metrics of every
finished step, leave no checkpoint that ``latest`` would pick and fail on, and the whole metrics file must hold
the losses of the uninterrupted single-process run (``pretrain_sp1``, conftest.py). The TRL recipe is
preempted once (SIGTERM in a Trainer step).

The faults are injected by ``tests/workers/recipe_faults.py`` (a rank signals itself, or its ``torch.save``
raises ``ENOSPC``: a size-limited file system needs root, a patched writer does not).
"""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from hf_hsap.checkpoint import PREEMPTED_EXIT_CODE, check_complete, is_complete, latest_complete
from hf_hsap.testing import RankResult, launch_env, run_ranks

from recipe_runs import PRETRAIN_ARGS, PRETRAIN_STEPS, ROOT, SFT_ARGS, assert_same_losses

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

DEADLINE_S = 150  # per run of 2 ranks (about 10-20 s on 2 cores); a hang fails the test here
SAVE = ["--sp_size", "2", "--save_every", "2", "--save_total_limit", "2"]


def run_with_fault(out: Path, fault: str, *extra: str, recipe: str = "pretrain.py") -> list[RankResult]:
    """A recipe on 2 ranks with ``fault`` (``kind:rank:step``, see recipe_faults.py)."""
    args = [*SAVE, *PRETRAIN_ARGS] if recipe == "pretrain.py" else ["--sp_size", "2", *SFT_ARGS]
    cmd = [sys.executable, str(ROOT / "tests" / "workers" / "recipe_faults.py"), str(ROOT / "recipes" / recipe),
           "--output_dir", str(out), *args, *extra]
    res = run_ranks(cmd, 2, DEADLINE_S, cwd=ROOT, env=dict(launch_env(), HSAP_TEST_FAULT=fault))
    assert all(r.returncode is not None for r in res), "a rank hung:\n" + "\n".join(r.output[-3000:] for r in res)
    return res


def logged_steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def checkpoints(out: Path) -> tuple[list[int], list[int]]:
    """(complete, partial) checkpoint steps in ``out``."""
    steps = {int(p.name.split("-")[1]): is_complete(p) for p in out.glob("checkpoint-*")}
    return sorted(s for s, ok in steps.items() if ok), sorted(s for s, ok in steps.items() if not ok)


def failed(res: list[RankResult], killed: int | None = None) -> str:
    """Assert every rank failed (``killed``: that rank by SIGKILL); returns the outputs for more checks."""
    for r in res:
        if r.rank == killed:
            assert r.returncode == -signal.SIGKILL, (r.returncode, r.output[-3000:])
        else:
            assert r.returncode not in (0, PREEMPTED_EXIT_CODE), (r.rank, r.returncode, r.output[-3000:])
    return "\n".join(r.output for r in res)


def test_pretrain_survives_sigterm_kills_and_a_full_disk(pretrain_sp1: tuple[Path, list[dict[str, Any]]],
                                                         tmp_path: Path) -> None:
    _, ref = pretrain_sp1
    out = tmp_path
    latest = ("--resume_from_checkpoint", "latest")

    # SIGTERM on rank 1 while step 3 runs: both ranks finish step 3, save it and exit with 75
    res = run_with_fault(out, "sigterm_in_step:1:3")
    assert [r.returncode for r in res] == [PREEMPTED_EXIT_CODE] * 2, [r.output[-3000:] for r in res]
    assert checkpoints(out) == ([2, 3], []) and logged_steps(out) == [1, 2, 3]

    # SIGKILL of rank 1 right after it wrote its part of checkpoint-4: rank 0 fails at the barrier
    failed(run_with_fault(out, "kill_in_save:1:4", *latest), killed=1)
    assert checkpoints(out) == ([2, 3], [4]) and logged_steps(out) == [1, 2, 3, 4]
    assert latest_complete(out) == out / "checkpoint-3"
    with pytest.raises(ValueError, match=r"checkpoint-4 is partial.*newest complete checkpoint .*checkpoint-3"):
        check_complete(out / "checkpoint-4")

    # a full disk on rank 0 while it writes checkpoint-6 (resumed from 3; checkpoint-4 saved again, 2 rotated out)
    text = failed(run_with_fault(out, "enospc_in_save:0:6", *latest))
    assert "No space left on device" in text and "checkpoint-6 was not completed" in text
    assert checkpoints(out) == ([3, 4], [6]) and logged_steps(out) == [1, 2, 3, 4, 5, 6]

    # SIGKILL of rank 1 in step 5 (resumed from 4, the partial 6 skipped): rank 0 fails in the step
    text = failed(run_with_fault(out, "kill_in_step:1:5", *latest), killed=1)
    assert "skipping partial checkpoint(s) checkpoint-6" in text
    assert checkpoints(out) == ([3, 4], [6]) and logged_steps(out) == [1, 2, 3, 4]

    # resumed once more, the run finishes: every step's loss is the uninterrupted run's
    res = run_with_fault(out, "none:0:0", *latest)
    assert [r.returncode for r in res] == [0, 0], [r.output[-3000:] for r in res]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert_same_losses(records, ref, list(range(1, PRETRAIN_STEPS + 1)))
    assert checkpoints(out) == ([PRETRAIN_STEPS - 2, PRETRAIN_STEPS], [])  # rotation removed the partial 6


def test_sft_recipe_preempted_by_sigterm_saves_and_exits_with_75(sft_sp1: tuple[Path, list[dict[str, Any]]],
                                                                 tmp_path: Path) -> None:
    """The TRL recipe (HSAPSFTTrainer): SIGTERM on rank 1 in step 4 -> checkpoint-4 (checkpoint-2 rotated out by
    --save_total_limit 1), status 75 on both ranks, the finished steps in metrics.jsonl with the uninterrupted
    losses, no final model. (That the trainer resumes from it with the uninterrupted losses:
    tests/distributed/test_preemption.py; the recipe's resume: test_recipes.py.)"""
    _, ref = sft_sp1
    res = run_with_fault(tmp_path, "sigterm_in_trainer_step:1:4", "--save_every", "2", "--save_total_limit", "1",
                         recipe="sft_trl.py")
    assert [r.returncode for r in res] == [PREEMPTED_EXIT_CODE] * 2, [r.output[-3000:] for r in res]
    assert checkpoints(tmp_path) == ([4], [])
    assert not (tmp_path / "model.safetensors").exists()  # TRL's final save_model is skipped: not finished
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert_same_losses(records, ref[:4], [1, 2, 3, 4])
