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
    """SP 2 on 2 processes: --gradient_checkpointing (in blocks of 2 layers), the tiled MLP and the chunked loss (its
    default) log the losses and eval losses of the run with none of them (full logits), to 1e-5."""
    args = [*PRETRAIN_ARGS[2:], "--max_steps", "10", "--sp_size", "2"]  # PRETRAIN_ARGS starts with --max_steps N
    plain = run_recipe("pretrain.py", tmp_path / "plain", [*args, "--no_chunked_loss"], procs=2)
    levers = run_recipe("pretrain.py", tmp_path / "levers", [*args, "--gradient_checkpointing", "--tiled_mlp",
                                                             "--mlp_tile_tokens", "16", "--loss_tile_tokens", "64",
                                                             "--recompute_norms", "--checkpoint_layers", "2"],
                        procs=2)
    assert len(plain) == len(levers) == 10
    for a, b in zip(levers, plain):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), a["step"]
        if "eval_loss" in b:
            assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-5)


def test_pretrain_refuses_a_row_that_cannot_fit(tmp_path: Path) -> None:
    """Before the first step: the modelled step of a 4,096-token row exceeds --memory_per_device_gib, and the message
    names the lever that makes it fit (the memory model's own choice, tests/unit/test_memory_advice.py)."""
    import subprocess
    import sys

    from recipe_runs import ROOT
    from hf_hsap.testing import launch_env

    from transformers import AutoTokenizer

    from hf_hsap.data import tokenizer_path
    from hf_hsap.examples import builtin_config
    from hf_hsap.memory import MemoryLevers
    from hf_hsap.memory.model import predict_step_memory

    config = builtin_config("tiny-llama", len(AutoTokenizer.from_pretrained(str(tokenizer_path()))), 4096)
    need = {chunked: predict_step_memory(config, 4096, world=1, sp_size=1, sharding="none", param_dtype="fp32",
                                         compute_dtype="fp32", master_weights=False, device="cpu",
                                         levers=MemoryLevers(chunked_loss=chunked)).total / 2**30
            for chunked in (False, True)}
    assert need[True] < need[False]
    between = (need[True] + need[False]) / 2  # fits with the chunked loss, not without
    cmd = [sys.executable, str(ROOT / "recipes" / "pretrain.py"), "--max_steps", "1", "--max_length", "4096",
           "--no_chunked_loss", "--memory_per_device_gib", f"{between:.6f}", "--output_dir", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "turn on the chunked loss (drop --no_chunked_loss)" in proc.stderr
    assert not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text().strip()
