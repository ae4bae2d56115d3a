"""End-to-end recipe checks on CPU: SP 4 (Ulysses 2 x ring 2, 4 gloo processes under ``accelerate launch``)
logs the losses of one process at SP 1, and a run resumed from a checkpoint (here under another layout, SP 2
on 2 processes) logs the losses of the uninterrupted run. Small sizes: the tiny built-in model, short rows,
a few hundred shipped documents.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from recipe_runs import (PRETRAIN_ARGS, PRETRAIN_SAVE, PRETRAIN_STEPS, SFT_ARGS, SFT_SAVE, SFT_STEPS,
                         assert_same_losses, run_recipe)

# the recipes run as subprocesses, under accelerate launch; 20-50 s each on 2 CPU cores
pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_pretrain_sp4_ulysses2_logs_the_sp1_losses(pretrain_sp1, tmp_path: Path) -> None:
    _, ref = pretrain_sp1
    got = run_recipe("pretrain.py", tmp_path, ["--sp_size", "4", "--ulysses_size", "2", *PRETRAIN_ARGS], procs=4)
    steps = list(range(1, PRETRAIN_STEPS + 1))
    assert_same_losses(got, ref, steps)
    for a, b in zip(got, ref):  # the same documents every step, whatever the number of processes
        assert (a["tokens"], a["targets"]) == (b["tokens"], b["targets"])
    assert ref[-1]["loss"] < ref[0]["loss"] - 1.0  # it learns
    assert all(r["tgs"] > 0 and r["peak_mem_gb"] > 0 for r in got)


def test_pretrain_resume_logs_the_uninterrupted_losses(pretrain_sp1, tmp_path: Path) -> None:
    out, ref = pretrain_sp1
    ckpt = out / f"checkpoint-{PRETRAIN_SAVE}"
    assert (ckpt / "hsap_state.json").exists() and (ckpt / "hsap_complete.json").exists()
    # also under other plan options: KV by peer in rounds of at most 16 tokens (several rounds, refetch)
    got = run_recipe("pretrain.py", tmp_path, ["--sp_size", "2", "--resume_from_checkpoint", str(ckpt),
                                               "--rounds", "by_peer", "--recv_budget_tokens", "16",
                                               *PRETRAIN_ARGS], procs=2)
    assert_same_losses(got, ref, list(range(PRETRAIN_SAVE + 1, PRETRAIN_STEPS + 1)))


# SFT under SP 4 x Ulysses 2 against one process: tests/recipes/test_hsap_sft.py (hsap-sft, which this recipe wraps)


def test_sft_trl_resume_under_sp2_logs_the_uninterrupted_losses(sft_sp1, tmp_path: Path) -> None:
    """3 micro-batches per step: resuming at step 5 skips 15 SP batches, i.e. 7 rounds of 2 and one more."""
    out, ref = sft_sp1
    got = run_recipe("sft_trl.py", tmp_path, ["--sp_size", "2", "--resume_from_checkpoint",
                                              str(out / f"checkpoint-{SFT_SAVE}"), "--hsap_rounds", "batched",
                                              "--hsap_recv_budget_tokens", "16", *SFT_ARGS], procs=2)
    assert_same_losses(got, ref, list(range(SFT_SAVE + 1, SFT_STEPS + 1)))


def test_pretrain_memory_levers_log_the_plain_losses(tmp_path: Path) -> None:
    """SP 2 on 2 processes: --gradient_checkpointing, the tiled MLP and the chunked loss (its default) log the losses
    and eval losses of the run with none of them (full logits), to 1e-5."""
    args = [*PRETRAIN_ARGS[2:], "--max_steps", "10", "--sp_size", "2"]  # PRETRAIN_ARGS starts with --max_steps N
    plain = run_recipe("pretrain.py", tmp_path / "plain", [*args, "--no_chunked_loss"], procs=2)
    levers = run_recipe("pretrain.py", tmp_path / "levers", [*args, "--gradient_checkpointing", "--tiled_mlp",
                                                             "--mlp_tile_tokens", "16", "--loss_tile_tokens", "64"],
                        procs=2)
    assert len(plain) == len(levers) == 10
    for a, b in zip(levers, plain):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), a["step"]
        if "eval_loss" in b:
            assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-5)
