"""The chunked LM head on families that transform their logits, its refusals, and the levers' own checks."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, CohereConfig, Gemma2Config, LlamaConfig, Qwen3MoeConfig

import hf_hsap
from hf_hsap.memory import MemoryLevers, TiledForward, logit_transform

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def _tiled(model: torch.nn.Module, *, keep_input_only: bool) -> list[str]:
    """Names of the modules with a tiled forward of that kind."""
    return [n for n, m in model.named_modules() if isinstance(m.__dict__.get("forward"), TiledForward)
            and m.__dict__["forward"].keep_input_only == keep_input_only]


def _model(config) -> torch.nn.Module:
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="hsap", dtype=torch.float32).train()


@pytest.mark.parametrize("config,transform", [
    (Gemma2Config(final_logit_softcapping=3.0, head_dim=8, **SMALL), (3.0, 1.0)),
    (CohereConfig(logit_scale=0.5, **SMALL), (None, 0.5)),
    (LlamaConfig(tie_word_embeddings=True, **SMALL), (None, 1.0))], ids=["gemma2-softcap", "cohere-scale", "tied"])
def test_transforming_families_are_exact(config, transform) -> None:
    """Soft-capped, scaled and tied heads: the loss and every gradient equal the full logits' cross-entropy."""
    assert logit_transform(config) == transform
    full, tiled = _model(config), _model(config)
    hf_hsap.prepare_model(tiled, levers=MemoryLevers(loss_tile_tokens=10))  # verifies against the model's own logits
    ids = torch.randint(0, 97, (1, 40), generator=torch.Generator().manual_seed(1))
    pos = torch.cat([torch.arange(15), torch.arange(25)]).unsqueeze(0)
    batch = hf_hsap.shard_batch({"input_ids": ids, "position_ids": pos, "labels": ids.clone()}, 1)
    inputs = {k: batch[k] for k in ("input_ids", "position_ids", "hsap_plan")}
    want = F.cross_entropy(full(**inputs).logits[0].float(), batch["shift_labels"][0], reduction="sum") / 38
    got = hf_hsap.integrations.hsap_model_loss(tiled, batch, 38)
    want.backward()
    got.backward()
    assert abs(got.item() - want.item()) <= 1e-5 * want.item()
    for (name, a), b in zip(full.named_parameters(), tiled.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6), name
    if config.tie_word_embeddings:
        assert tiled.get_output_embeddings().weight is tiled.get_input_embeddings().weight


def test_an_unknown_logit_transform_is_refused() -> None:
    """A config naming a soft-cap that the family's forward does not apply: the probe sees the difference, and the
    refused preparation leaves the model as it was (its own head, no hf_hsap state)."""
    config = LlamaConfig(**SMALL)
    config.final_logit_softcapping = 2.0  # Llama ignores it; the head would apply it
    model = _model(config)
    head = model.lm_head
    with pytest.raises(ValueError, match="chunked_loss=False"):
        hf_hsap.prepare_model(model, levers=MemoryLevers())
    assert model.lm_head is head and type(head) is torch.nn.Linear
    assert not any(k.startswith("_hsap") for m in model.modules() for k in m.__dict__)


def test_levers_validate_and_moe_mlps_stay_whole() -> None:
    with pytest.raises(ValueError, match="loss_tile_tokens"):
        MemoryLevers(loss_tile_tokens=0)
    assert MemoryLevers(tiled_mlp=True).names == ["chunked_loss", "tiled_mlp"]
    moe = _model(Qwen3MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=8,
                                decoder_sparse_step=1, mlp_only_layers=[1], **SMALL))
    hf_hsap.prepare_model(moe, levers=MemoryLevers(chunked_loss=False, tiled_mlp=True, mlp_tile_tokens=8))
    assert _tiled(moe, keep_input_only=False) == ["model.layers.1.mlp"]  # layer 0's experts are left alone


def test_training_arguments_carry_the_levers(tmp_path) -> None:
    from hf_hsap.integrations import HSAPTrainingArguments

    args = HSAPTrainingArguments(output_dir=str(tmp_path), gradient_checkpointing=True, hsap_tiled_mlp=True,
                                 hsap_loss_tile_tokens=512, activation_offloading=True, use_cpu=True, report_to=[])
    assert args.memory_levers() == MemoryLevers(loss_tile_tokens=512, gradient_checkpointing=True,
                                                activation_offloading=True, tiled_mlp=True)
    with pytest.raises(ValueError, match="mlp_tile_tokens"):
        HSAPTrainingArguments(output_dir=str(tmp_path), hsap_mlp_tile_tokens=0, use_cpu=True, report_to=[])


@pytest.mark.parametrize("softcap,scale,bias", [(None, 1.0, False), (3.0, 0.7, True), (None, 0.5, True)])
def test_fused_cross_entropy_is_exact_in_float64(softcap, scale, bias) -> None:
    """Loss and the gradients of hidden states, weight and bias equal autograd through the full logits to float64
    rounding, across tiles that do not divide the tokens, with ignored targets; in no-grad mode only the loss."""
    from hf_hsap.memory.fused_ce import fused_linear_cross_entropy

    g = torch.Generator().manual_seed(3)
    h = torch.randn(37, 16, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(50, dtype=torch.float64, generator=g, requires_grad=True) if bias else None
    y = torch.randint(0, 50, (37,), generator=g)
    y[[0, 3, 36]] = -100
    z = (h @ w.t() + (b if bias else 0)) * scale
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    want = F.cross_entropy(z, y, reduction="sum", ignore_index=-100)
    params = [h, w] + ([b] if bias else [])
    ref = torch.autograd.grad(want * 0.3, params)
    got = fused_linear_cross_entropy(h, w, b, y, 5, softcap=softcap, scale=scale)
    assert abs(got.item() - want.item()) <= 1e-12 * want.item()
    for a, r in zip(torch.autograd.grad(got * 0.3, params), ref):
        assert torch.allclose(a, r, rtol=1e-12, atol=1e-14)
    with torch.no_grad():
        assert fused_linear_cross_entropy(h, w, b, y, 4, softcap=softcap, scale=scale).item() == pytest.approx(want.item(), 1e-12)
    twice = fused_linear_cross_entropy(h, w, b, y, 5, softcap=softcap, scale=scale)
    twice.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward"):
        twice.backward()


def test_instance_forwards_come_and_go() -> None:
    """The tiled MLP and the recomputed norms change instances only, and undo removes them again."""
    model = _model(LlamaConfig(**SMALL))
    keys = list(model.state_dict())
    prepared = hf_hsap.prepare_model(model, levers=MemoryLevers(chunked_loss=False, tiled_mlp=True, mlp_tile_tokens=4,
                                                                recompute_norms=True))
    assert len(_tiled(model, keep_input_only=False)) == 2  # 2 MLPs
    assert len(_tiled(model, keep_input_only=True)) == 5  # 2 layers x 2 norms + final
    assert list(model.state_dict()) == keys and type(model.model.layers[0].mlp).__name__ == "LlamaMLP"
    prepared.undo()
    assert not any("forward" in m.__dict__ for m in model.modules())
