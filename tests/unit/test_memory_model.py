"""The step memory model (hf_hsap.memory.model) and longest_row: its properties, and one measured CPU step."""
from __future__ import annotations


import pytest

from hf_hsap.memory import MemoryLevers
from hf_hsap.memory.fit import longest_row
from hf_hsap.memory.model import TERMS, predict_step_memory
from hf_hsap.model_shape import ModelShape

LLAMA8 = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
              num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False)
MOE = dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
           num_experts=128, num_experts_per_tok=8, num_hidden_layers=48, num_attention_heads=32,
           num_key_value_heads=4, head_dim=128, vocab_size=151936)
LEVERS = [MemoryLevers(chunked_loss=False), MemoryLevers(), MemoryLevers(gradient_checkpointing=True),
          MemoryLevers(tiled_mlp=True), MemoryLevers(gradient_checkpointing=True, activation_offloading=True,
                                                     tiled_mlp=True)]


def predict(tokens, config=LLAMA8, **kw):
    args = dict(world=8, sp_size=8, sharding="zero3", levers=MemoryLevers())
    args.update(kw)
    return predict_step_memory(config, tokens, **args)


def test_shape_counts_llama3_8b_parameters():
    assert abs(ModelShape.from_config(LLAMA8).params / 8.03e9 - 1) < 0.01
    assert ModelShape.from_config(MOE).experts == 128 and ModelShape.from_config(MOE).top_k == 8


@pytest.mark.parametrize("config", [LLAMA8, MOE])
@pytest.mark.parametrize("levers", LEVERS)
def test_monotone_in_row_length(config, levers):
    totals = [predict(n, config, levers=levers).total for n in (8192, 65536, 1 << 20, 1 << 23)]
    assert totals == sorted(totals) and totals[0] < totals[-1]


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_each_lever_never_increases_the_prediction(device):
    """From 16K tokens per rank on: below, the chunked loss's float32 head gradient ``[V, H]`` (2 GiB for Llama-3)
    can outweigh the full logits of a short row."""
    base = MemoryLevers(chunked_loss=False)
    for n in (1 << 17, 1 << 21, 1 << 24):
        previous = predict(n, levers=base, device=device).total
        for change in (dict(chunked_loss=True), dict(gradient_checkpointing=True), dict(activation_offloading=True),
                       dict(tiled_mlp=True), dict(recompute_norms=True)):
            base = base.replace(**change)
            now = predict(n, levers=base, device=device).total
            assert now <= previous * (1 + 1e-12), (n, change)
            previous = now
        base = MemoryLevers(chunked_loss=False)


def test_offloading_moves_the_saved_inputs_to_the_host_on_cuda_only():
    lev = MemoryLevers(gradient_checkpointing=True, activation_offloading=True)
    gpu, cpu = predict(1 << 20, levers=lev), predict(1 << 20, levers=lev, device="cpu")
    assert gpu.activations == 0 and gpu.host > 0
    assert cpu.host == 0 and cpu.activations > 0


def test_sharding_divides_the_states():
    ddp = predict(4096, world=8, sp_size=1, sharding="ddp")
    for sharding in ("fsdp2", "zero3"):
        z = predict(4096, world=8, sp_size=1, sharding=sharding)
        layer = ModelShape.from_config(LLAMA8).layer_params * 2
        assert z.states == pytest.approx(ddp.states / 8)
        assert z.weights == pytest.approx(ddp.weights / 8 + layer)
    assert predict(4096, world=64, sp_size=1).states == pytest.approx(ddp.states / 64)


def test_sp_divides_the_per_token_terms():
    lev = MemoryLevers(gradient_checkpointing=True, tiled_mlp=True)
    one = predict(1 << 20, world=8, sp_size=1, levers=lev, sharding="zero3")
    eight = predict(8 << 20, world=8, sp_size=8, levers=lev, sharding="zero3", recv_budget_tokens=1 << 17)
    assert eight.tokens == one.tokens
    assert eight.activations == pytest.approx(one.activations)
    assert one.sap == 0  # under a budget SAP's buffers live in the attention's backward, below the norm's here
    assert predict(8 << 20, world=8, sp_size=8, levers=lev, sharding="zero3").sap > 0


def test_receive_budget_and_ulysses_shrink_sap_buffers():
    lev = MemoryLevers(gradient_checkpointing=True)
    flat = predict(1 << 22, levers=lev)
    budget = predict(1 << 22, levers=lev, recv_budget_tokens=1 << 16)
    ulysses = predict(1 << 22, levers=lev, ulysses_size=8)
    assert budget.sap < flat.sap and ulysses.sap < flat.sap


def test_longest_row_fits_at_the_answer_and_not_one_step_further():
    lev = MemoryLevers(gradient_checkpointing=True, activation_offloading=True, tiled_mlp=True)
    kw = dict(gpus=8, memory_per_gpu_gib=80, levers=lev, reserve_gib=4, recv_budget_tokens=1 << 16)
    fit = longest_row(LLAMA8, **kw)
    assert fit.tokens > 0 and fit.tokens % 8 == 0
    args = dict(world=8, sp_size=8, sharding="zero3", levers=lev, recv_budget_tokens=1 << 16)
    assert predict_step_memory(LLAMA8, fit.tokens, **args).total <= 76 * 2**30
    over = predict_step_memory(LLAMA8, fit.tokens + 8, **args)
    assert over.total > 76 * 2**30
    assert fit.limiting_term == over.limiting_term() and fit.limiting_term in TERMS


def test_nothing_fits_gives_zero():
    assert longest_row(LLAMA8, gpus=1, memory_per_gpu_gib=8, levers=MemoryLevers(), reserve_gib=1).tokens == 0


@pytest.mark.parametrize("config", [LLAMA8, MOE, dict(LLAMA8, model_type="qwen3")])
@pytest.mark.parametrize("levers", LEVERS)
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_recompute_norms_never_increases_the_prediction(config, levers, dtype):
    kw = dict(param_dtype=dtype, compute_dtype=dtype)
    for n in (4096, 1 << 17, 1 << 21, 1 << 24):
        for extra in (dict(), dict(ulysses_size=8), dict(recv_budget_tokens=1 << 16), dict(device="cpu")):
            off = predict(n, config, levers=levers, **kw, **extra)
            on = predict(n, config, levers=levers.replace(recompute_norms=True), **kw, **extra)
            assert on.total <= off.total * (1 + 1e-12), (n, extra)


def test_recompute_norms_drops_the_float32_copies_in_16_bit():
    lev = MemoryLevers(gradient_checkpointing=True, tiled_mlp=True)
    off, on = predict(1 << 22, levers=lev), predict(1 << 22, levers=lev.replace(recompute_norms=True))
    assert on.working < off.working and on.stage == off.stage == "layer"


def test_tiled_attention_lowers_the_sp1_attention_backward_only():
    """At SP 1 on a long row the tiled attention's backward holds dQ and float32 dK|dV sums (16 KB a token for
    Llama-3-8B in bf16, and dK's cast at the end) instead of flash's 44 KB; under SP nothing changes."""
    lev = MemoryLevers(gradient_checkpointing=True, activation_offloading=True, tiled_mlp=True, recompute_norms=True)
    n = 1 << 20
    for device in ("cuda", "cpu"):
        off, on = (predict(n, levers=le, world=1, sp_size=1, device=device)
                   for le in (lev, lev.replace(tiled_attention=True)))
        assert on.working < off.working and on.total < off.total, device
    off, on = (predict(n, levers=le, world=1, sp_size=1) for le in (lev, lev.replace(tiled_attention=True)))
    assert off.working - on.working == n * (45056 - 16384 - 2048)  # flash's 44 KB -> dQ, dK|dV sums, dK's cast
    assert predict(n, levers=lev) == predict(n, levers=lev.replace(tiled_attention=True))  # SP 8: SAP's attention
