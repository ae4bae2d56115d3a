"""``prepare_model`` is the one step that changes a model, and ``undo()`` takes every change back; ``check_model``
only reads.

The model of record is a hybrid vision-language model (Qwen3.5: gated-delta-rule layers beside attention, a vision
tower) with every memory lever on, so that each kind of change is made at once: recurrent kernels' forwards, vision
feature methods, forward hooks, the LM head, tiled MLPs and norms, gradient checkpointing and the config.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, StableLmConfig

import hf_hsap
from hf_hsap.model_state import MIXERS, RELAY, VISION_ROWS, state_of
from workers import vlm_zoo_configs as VC

EVERY_LEVER = hf_hsap.MemoryLevers(loss_tile_tokens=8, gradient_checkpointing=True, activation_offloading=True,
                                   tiled_mlp=True, mlp_tile_tokens=4, recompute_norms=True, tiled_attention=True,
                                   attention_tile_tokens=4)
_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks",
          "_state_dict_hooks", "_load_state_dict_pre_hooks")


def _value(v: Any) -> Any:
    """A plain value as it is, any other object by identity."""
    return v if isinstance(v, (bool, int, float, str, type(None))) else ("id", id(v))


def _snapshot(model: torch.nn.Module) -> dict[str, Any]:
    """Everything of a model a preparation could change: each module's own attributes (its forward, wrapped
    methods, hsap state), submodules, hooks, the kernel wrappers' attributes and the config."""
    modules = {}
    for name, m in model.named_modules():
        own = {k: _value(v) for k, v in m.__dict__.items() if k not in ("_parameters", "_buffers", "_modules")}
        own["_modules"] = {k: id(v) for k, v in m._modules.items()}
        own["_parameters"] = {k: id(v) for k, v in m._parameters.items()}
        own["hooks"] = {h: list(getattr(m, h, {})) for h in _HOOKS}
        for fname, fn in (m.__dict__.get("_kernel_funcs") or {}).items():  # Transformers' per-layer kernel wrappers
            own[f"kernel {fname}"] = {k: _value(v) for k, v in fn.__dict__.items()
                                      if k not in ("_parameters", "_buffers", "_modules")}
        modules[name] = own
    return {"modules": modules, "config": model.config.to_dict()}


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _hybrid_vlm() -> torch.nn.Module:
    return VC.build_model(VC.tiny_config("qwen3_5"), "hsap", torch.float64).train()


LENS = [5, 9, 6]


def _row(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(3, vocab, (1, sum(LENS)), generator=torch.Generator().manual_seed(0))
    return ids, torch.cat([torch.arange(n) for n in LENS]).unsqueeze(0)


@torch.no_grad()
def _documents_alone(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Each document of the row run alone (one document per row needs no preparation): its logits ``[T, V]`` and
    the packed row's loss (the mean next-token cross-entropy within documents)."""
    ids, _ = _row(model)
    logits = torch.cat([model(input_ids=part, use_cache=False).logits[0] for part in ids.split(LENS, dim=1)])
    targets = torch.cat([torch.cat([part[0, 1:], torch.tensor([-100])]) for part in ids.split(LENS, dim=1)])
    return logits, torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100)


def _packed_step(model: torch.nn.Module, offload: Callable[[], Any] = contextlib.nullcontext) -> torch.Tensor:
    """One forward + backward of the packed row of three documents (its loss through hf_hsap's path)."""
    ids, pos = _row(model)
    local = hf_hsap.shard_batch({"input_ids": ids, "position_ids": pos, "labels": ids.clone()}, 1)
    with offload():
        loss = hf_hsap.integrations.hsap_model_loss(model, local, int(local["num_items_in_batch"]))
        loss.backward()
    return loss.detach()


def test_undo_restores_a_hybrid_vlm_with_every_lever() -> None:
    model = _hybrid_vlm()
    before, state = _snapshot(model), _state(model)
    logits_before, loss_alone = _documents_alone(model)
    prepared = hf_hsap.prepare_model(model, sp_size=1, levers=EVERY_LEVER)
    # what it changed: the recurrent layers, the vision rows, the head, the tiled forwards, checkpointing
    assert prepared.check.mixer_layers == 3 and state_of(model, MIXERS) is not None
    assert state_of(model, VISION_ROWS) is not None
    assert type(model.get_output_embeddings()).__name__ == "ChunkedLMHead"
    assert model.is_activation_checkpointing and _snapshot(model) != before
    # the packed row, every lever on, gives the documents' own loss
    torch.testing.assert_close(_packed_step(model, prepared.offload), loss_alone, rtol=1e-10, atol=0)
    assert hf_hsap.prepare_model(model, sp_size=1, levers=EVERY_LEVER) is prepared  # the same arguments: the same
    with pytest.raises(ValueError, match=r"\.undo\(\)"):
        hf_hsap.prepare_model(model, sp_size=2, levers=EVERY_LEVER)
    model.zero_grad(set_to_none=True)
    prepared.undo()
    assert prepared.changes == 0
    after = _snapshot(model)
    assert after["config"] == before["config"]
    assert list(after["modules"]) == list(before["modules"])
    for name, own in before["modules"].items():
        assert after["modules"][name] == own, name
    restored = model.state_dict()
    assert list(restored) == list(state)
    assert all(torch.equal(restored[k], v) for k, v in state.items())
    assert not model.is_activation_checkpointing and type(model.get_output_embeddings()) is torch.nn.Linear
    assert torch.equal(_documents_alone(model)[0], logits_before)  # the model computes as before
    with pytest.raises(hf_hsap.integrations.UnsupportedModelError, match="prepare_model"):
        _packed_step(model)  # and its packed rows are refused again, not wrong
    assert hf_hsap.prepare_model(model, sp_size=1).check.mixer_layers == 3  # it can be prepared again


def test_check_model_changes_nothing() -> None:
    """check_model (with its SP probe forward) and the per-step check leave every module as it was."""
    model = _hybrid_vlm()
    before, state = _snapshot(model), _state(model)
    assert hf_hsap.check_model(model, sp_size=2).mixer_layers == 3
    assert _snapshot(model) == before
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    with pytest.raises(hf_hsap.integrations.UnsupportedModelError, match="prepare_model"):
        _packed_step(model)  # its recurrent layers were not prepared: refused, not wrong


def test_a_relayed_plan_is_undone() -> None:
    """StableLM's decoder layers call the attention without the keyword arguments: under SP the preparation relays
    the plan to them (a hook and a mark per layer), and undo removes both."""
    config = StableLmConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="hsap")
    before = _snapshot(model)
    prepared = hf_hsap.prepare_model(model, sp_size=2)
    assert prepared.check.unreached_layers and state_of(model, RELAY) is not None
    assert sum(state_of(m, RELAY) is not None for m in model.modules()) == 1 + config.num_hidden_layers
    prepared.undo()
    assert _snapshot(model) == before


def test_a_decoder_loaded_with_another_attention_gets_hsap_and_it_back() -> None:
    config = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    prepared = hf_hsap.prepare_model(model)
    assert model.config._attn_implementation == "hsap"
    prepared.undo()
    assert model.config._attn_implementation == "sdpa"
