"""Decoder layers checkpointed in blocks (``checkpoint_layers``) and the last layers kept on the device
(``layers_kept_on_device``): the same logits, loss and parameter gradients as checkpointing each layer, at SP 1 and
under SP 2 (float64); one checkpoint per block; exactly the kept layers' saved tensors withheld from the offloading
hooks (counted: on CPU offloading itself is a no-op); what blocks refuse; ``undo()``."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

import hf_hsap
from helpers import rel_err
from hf_hsap.integrations import hsap_model_loss, shard_batch
from hf_hsap.memory.blocks import checkpoints_kept
from workers import levers as L
from workers import sp_model as W
from workers import zoo_configs as ZC

TIMEOUT_S = 150
TOL = 1e-12  # float64: the same operations on the same values
CKPT = {"loss_tile_tokens": 16, "gradient_checkpointing": True, "tiled_mlp": True, "mlp_tile_tokens": 8,
        "recompute_norms": True}


def same(a: dict, b: dict) -> None:
    assert rel_err(a["logits"], b["logits"]) <= TOL
    assert a["loss"] == pytest.approx(b["loss"], rel=TOL)
    assert a["grads"].keys() == b["grads"].keys()
    for name, g in a["grads"].items():
        assert rel_err(g, b["grads"][name]) <= TOL, name


@pytest.mark.parametrize("per_block", [2, 3, 4])
def test_sp1_blocks_match_layer_checkpoints(per_block: int) -> None:
    """3 layers: blocks of 2 + a short block of 1, one block of 3, one block longer than the stack."""
    run = lambda **lev: L.levers_forward_backward("qwen2", 1, {**CKPT, **lev}, dtype=torch.float64, layers=3)
    layer = run()
    same(run(checkpoint_layers=per_block), layer)
    same(run(checkpoint_layers=per_block, gradient_checkpointing=True, tiled_mlp=False, recompute_norms=False),
         run(tiled_mlp=False, recompute_norms=False))


def test_sp2_blocks_match_layer_checkpoints(pools) -> None:
    """Under SP 2 the SAP attention recomputes its transfers inside the block (every rank the same layers)."""
    pool = pools(2, TIMEOUT_S)
    for lev in ({"checkpoint_layers": 2}, {"checkpoint_layers": 2, "layers_kept_on_device": 1}):
        blocks = pool.run(L.levers_forward_backward, "llama", 2, {**CKPT, **lev}, 1, torch.float64, 3)
        layers = pool.run(L.levers_forward_backward, "llama", 2, CKPT, 1, torch.float64, 3)
        for a, b in zip(sorted(blocks, key=lambda r: r["index"][0]), sorted(layers, key=lambda r: r["index"][0])):
            assert torch.equal(a["index"], b["index"])
            same(a, b)


def packs_by_layer(levers: dict[str, Any], layers: int = 3) -> list[int]:
    """Tensors each decoder layer's call hands to the saved-tensor hooks around the forward (where TRL's offloading
    context sits): counted by a pack hook, attributed by forward hooks on the layers."""
    model = W.make_model("llama", layers=layers).double()
    prepared = hf_hsap.prepare_model(model, levers=hf_hsap.MemoryLevers(**levers))
    counts, current = [0] * layers, [None]
    for i, m in enumerate(model.model.layers):
        m.register_forward_pre_hook(lambda *_a, i=i: current.__setitem__(0, i))
        m.register_forward_hook(lambda *_a: current.__setitem__(0, None), always_call=True)

    def pack(t: torch.Tensor) -> torch.Tensor:
        if current[0] is not None:
            counts[current[0]] += 1
        return t

    local = shard_batch(W.global_batch(), 1)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = hsap_model_loss(model, local, local["num_items_in_batch"])
    loss.backward()
    prepared.undo()
    return counts


@pytest.mark.parametrize("per_block,kept", [(1, 0), (1, 2), (2, 0), (2, 1), (2, 2), (3, 1), (1, 3)])
def test_one_checkpoint_per_block_and_the_kept_layers_withheld(per_block: int, kept: int) -> None:
    lev = {**CKPT, "checkpoint_layers": per_block, "activation_offloading": True, "layers_kept_on_device": kept}
    counts = packs_by_layer(lev)
    starts = set(range(0, 3, per_block))
    offloaded = [i for i in starts if i < 3 - kept]
    assert counts == [1 if i in offloaded else 0 for i in range(3)]  # the checkpoint's input, once per block
    assert len(starts) - len(offloaded) == checkpoints_kept(3, per_block, kept)


def test_kept_layers_without_checkpointing_save_nothing_through_the_hooks() -> None:
    plain = packs_by_layer({"activation_offloading": True})
    kept = packs_by_layer({"activation_offloading": True, "layers_kept_on_device": 2})
    assert all(n > 1 for n in plain) and kept == [plain[0], 0, 0]


def test_blocks_run_plain_outside_training_and_undo_restores() -> None:
    model = W.make_model("llama", layers=3).double()
    keys, local = list(model.state_dict()), shard_batch(W.global_batch(), 1)
    inputs = {k: local[k] for k in ("input_ids", "position_ids")}
    with torch.no_grad():
        before = model(**inputs).logits
    prepared = hf_hsap.prepare_model(model, levers=hf_hsap.MemoryLevers(
        chunked_loss=False, gradient_checkpointing=True, checkpoint_layers=2, activation_offloading=True,
        layers_kept_on_device=1))
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, before)
    model.eval()
    assert torch.equal(model(**inputs).logits.detach(), before)
    model.train()
    prepared.undo()
    assert not any("forward" in m.__dict__ or m._forward_hooks or m._forward_pre_hooks for m in model.model.layers)


def test_blocks_refusals() -> None:
    model = W.make_model("llama", layers=3)
    hf_hsap.prepare_model(model, levers=hf_hsap.MemoryLevers(checkpoint_layers=2))  # checkpointing off
    local = shard_batch(W.global_batch(), 1)
    with pytest.raises(ValueError, match="needs gradient checkpointing"):
        model(input_ids=local["input_ids"], position_ids=local["position_ids"])
    model = W.make_model("llama", layers=3)
    hf_hsap.prepare_model(model, levers=hf_hsap.MemoryLevers(gradient_checkpointing=True, checkpoint_layers=2))
    with pytest.raises(ValueError, match="output_hidden_states"):
        model(input_ids=local["input_ids"], position_ids=local["position_ids"], output_hidden_states=True)
    config = Qwen2Config(vocab_size=W.VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
                         layer_types=["sliding_attention", "full_attention"] * 2)
    mixed = AutoModelForCausalLM.from_config(config, attn_implementation="hsap")
    with pytest.raises(ValueError, match="mix attention types"):
        hf_hsap.prepare_model(mixed, levers=hf_hsap.MemoryLevers(gradient_checkpointing=True, checkpoint_layers=2))
    assert not any("forward" in m.__dict__ for m in mixed.model.layers)  # nothing left changed
    hybrid = ZC.build_model(ZC.tiny_config("lfm2"), "hsap", torch.float32).train()  # short convolutions
    with pytest.raises(ValueError, match="recurrent layers"):
        hf_hsap.prepare_model(hybrid, levers=hf_hsap.MemoryLevers(gradient_checkpointing=True, checkpoint_layers=2))
    for bad in (dict(checkpoint_layers=0), dict(layers_kept_on_device=-1)):
        with pytest.raises(ValueError, match="MemoryLevers"):
            hf_hsap.MemoryLevers(**bad)


def test_hf_trainer_blocks_under_its_own_checkpointing(tmp_path) -> None:
    """HSAPTrainer turns checkpointing on itself after prepare_model; the blocks run under it (else the first
    forward refuses) and log the losses of the run without levers."""
    from unittest import mock

    from hf_hsap.memory import blocks as B

    handed_on = []  # per call of a block's second layer: whether its first layer ran the block (checkpointed)
    run_other = B._Block.run_other

    def spy(block: Any, *args: Any, **kwargs: Any) -> Any:
        handed_on.append(block.pending is not None)
        return run_other(block, *args, **kwargs)

    plain = W.trainer_losses(1, str(tmp_path / "plain"), steps=2, hsap_chunked_loss=False)
    with mock.patch.object(B._Block, "run_other", spy):
        blocks = W.trainer_losses(1, str(tmp_path / "blocks"), steps=2, activation_checkpointing=True,
                                  hsap_checkpoint_layers=2, hsap_loss_tile_tokens=16)
    assert handed_on.count(True) == 2 and handed_on.count(False) >= 1  # two training steps; evaluation runs plain
    assert blocks["train"] == pytest.approx(plain["train"], rel=1e-5)
    assert blocks["eval"] == pytest.approx(plain["eval"], rel=1e-5)


def _grads_with_layer_hooks(per_block: int, wrap: Any) -> tuple[float, dict]:
    """Loss and gradients (float64, 3 layers) with ``wrap`` applied to every decoder layer's input and output by
    module hooks, as DeepSpeed ZeRO-3's identity functions are."""
    model = W.make_model("llama", layers=3).double()
    hf_hsap.prepare_model(model, levers=hf_hsap.MemoryLevers(**{**CKPT, "checkpoint_layers": per_block}))
    for m in model.model.layers:
        m.register_forward_pre_hook(lambda _m, args: (wrap(args[0]), *args[1:]))
        m.register_forward_hook(lambda _m, _args, out: wrap(out))
    local = shard_batch(W.global_batch(), 1)
    loss = hsap_model_loss(model, local, local["num_items_in_batch"])
    loss.backward()
    return loss.item(), {k: p.grad for k, p in model.named_parameters()}


def test_blocks_hand_on_through_hooks_that_alias_the_hidden_states() -> None:
    loss, grads = _grads_with_layer_hooks(2, lambda t: t.view_as(t))
    loss_1, grads_1 = _grads_with_layer_hooks(1, lambda t: t.view_as(t))
    assert loss == pytest.approx(loss_1, rel=TOL)
    assert all(rel_err(g, grads_1[k]) <= TOL for k, g in grads.items())
    with pytest.raises(ValueError, match="was not called with the hidden states"):
        _grads_with_layer_hooks(2, lambda t: t * 1.0)  # new values between layers: refused, not handed on


def _fsdp2_blocks_refusal() -> str:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = W.make_model("llama", layers=3)
    hf_hsap.prepare_model(model, levers=hf_hsap.MemoryLevers(gradient_checkpointing=True, checkpoint_layers=2))
    mesh = init_device_mesh("cpu", (2,))
    for m in model.model.layers:
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    local = shard_batch(W.global_batch(), 1)
    try:
        model(input_ids=local["input_ids"], position_ids=local["position_ids"])
    except ValueError as e:
        return str(e)
    return "not refused"


def test_blocks_refuse_fsdp2_sharded_layers(pools) -> None:
    for message in pools(2, TIMEOUT_S).run(_fsdp2_blocks_refusal):
        assert "sharded by FSDP2" in message
