"""The memory model's checkpoint blocks (``checkpoint_layers``) and its device / host split of the checkpoints
(``layers_kept_on_device``), arithmetically; the counts through levers_from_names, hsap-plan and the recipes."""
from __future__ import annotations

import math

import pytest

from hf_hsap.inspect import main as hsap_plan
from hf_hsap.memory import MemoryLevers
from hf_hsap.memory.advice import MEMORY_MODELS, levers_from_names
from hf_hsap.memory.blocks import block_starts, checkpoints_kept
from hf_hsap.memory.model import predict_step_memory

L70 = MEMORY_MODELS["llama-3-70b"]
ROW = 1 << 20
CKPT = MemoryLevers(gradient_checkpointing=True, tiled_mlp=True, recompute_norms=True)
OFF = CKPT.replace(activation_offloading=True)


def predict(levers: MemoryLevers, **kw):
    return predict_step_memory(L70, ROW, **{**dict(world=8, sp_size=8, sharding="zero3", levers=levers), **kw})


def test_block_layout():
    assert block_starts(80, 1) == list(range(80)) and block_starts(80, 3)[-1] == 78 and len(block_starts(80, 3)) == 27
    assert [checkpoints_kept(80, 4, k) for k in (0, 3, 4, 5, 8, 80, 99)] == [0, 0, 1, 1, 2, 20, 20]
    assert [checkpoints_kept(3, 2, k) for k in (1, 2, 3)] == [1, 1, 2]  # blocks start at layers 0 and 2


@pytest.mark.parametrize("per_block", [2, 3, 4, 80])
def test_blocks_trade_checkpoints_for_the_recomputed_block(per_block):
    """ceil(L / b) layer inputs in the stack instead of L; the recompute holds b - 1 more layers' saved tensors."""
    one, blocks = predict(CKPT), predict(CKPT.replace(checkpoint_layers=per_block))
    t, a, H = ROW // 8, 2, 8192
    loss_one, loss_b = (predict(lev).stages["loss"] for lev in (CKPT, CKPT.replace(checkpoint_layers=per_block)))
    assert loss_one - loss_b == pytest.approx((80 - math.ceil(80 / per_block)) * t * a * H)
    assert blocks.working > one.working and blocks.stage == "layer"
    two = predict(CKPT.replace(checkpoint_layers=2))  # each more layer in a block: one more layer's saved tensors
    assert blocks.working - one.working == pytest.approx((per_block - 1) * (two.working - one.working))
    assert predict(CKPT.replace(checkpoint_layers=per_block + 1)).working > blocks.working or per_block == 80


def test_blocks_off_without_checkpointing():
    lev = MemoryLevers(tiled_mlp=True)
    assert predict(lev) == predict(lev.replace(checkpoint_layers=4))


@pytest.mark.parametrize("per_block,kept", [(1, 0), (1, 5), (2, 5), (4, 8), (4, 80)])
def test_kept_checkpoints_split_between_device_and_host(per_block, kept):
    t, a, H = ROW // 8, 2, 8192
    base = predict(OFF.replace(checkpoint_layers=per_block))
    got = predict(OFF.replace(checkpoint_layers=per_block, layers_kept_on_device=kept))
    n = checkpoints_kept(80, per_block, kept)
    assert base.host - got.host == pytest.approx(n * t * a * H)
    assert got.stages["loss"] - base.stages["loss"] == pytest.approx(n * t * a * H)
    assert predict(CKPT.replace(checkpoint_layers=per_block, layers_kept_on_device=kept)) == predict(
        CKPT.replace(checkpoint_layers=per_block))  # without offloading everything is on the device anyway


def test_kept_layers_without_checkpointing_keep_their_saved_tensors():
    lev = MemoryLevers(activation_offloading=True, tiled_mlp=True, recompute_norms=True)
    # unrounded pinned buffers: the host's share is then the tensors' own bytes (rounding: tests/unit/test_memory_host.py)
    base, kept = (predict(x, pinned_round_limit_mb=0) for x in (lev, lev.replace(layers_kept_on_device=2)))
    assert kept.host < base.host and (base.host - kept.host) == pytest.approx(kept.stages["loss"]
                                                                               - base.stages["loss"])


def test_counts_need_their_lever(capsys):
    assert levers_from_names("all", checkpoint_layers=4, layers_kept_on_device=2).checkpoint_layers == 4
    with pytest.raises(ValueError, match="needs gradient checkpointing"):
        levers_from_names("tiled_mlp", checkpoint_layers=2)
    with pytest.raises(ValueError, match="needs activation offloading"):
        levers_from_names("gradient_checkpointing", layers_kept_on_device=1)
    assert hsap_plan(["--max-length", "--model", "llama-3-70b", "--gpus", "8", "--checkpoint-layers", "2",
                      "--layers-kept-on-device", "2"]) == 0
    assert "activation_offloading, checkpoint_layers 2, layers_kept_on_device 2)" in capsys.readouterr().out
    assert hsap_plan(["--max-length", "--levers", "none", "--checkpoint-layers", "2"]) == 2


def test_recipe_and_trainer_arguments_carry_the_counts():
    import argparse

    from hf_hsap.integrations.arguments import HSAPTrainingArguments
    from recipes.common import add_memory_args, memory_levers

    p = argparse.ArgumentParser()
    add_memory_args(p)
    lev = memory_levers(p.parse_args(["--gradient_checkpointing", "--checkpoint_layers", "3",
                                      "--activation_offloading", "--layers_kept_on_device", "2"]))
    assert (lev.checkpoint_layers, lev.layers_kept_on_device) == (3, 2)
    with pytest.raises(ValueError, match="needs gradient checkpointing"):
        memory_levers(p.parse_args(["--checkpoint_layers", "3"]))
    args = HSAPTrainingArguments(output_dir="/tmp/unused", activation_checkpointing=True, hsap_checkpoint_layers=2,
                                 report_to=[], use_cpu=True)
    assert args.memory_levers().checkpoint_layers == 2
    with pytest.raises(ValueError, match="needs activation offloading"):
        HSAPTrainingArguments(output_dir="/tmp/unused", hsap_layers_kept_on_device=1, report_to=[], use_cpu=True)
