"""Sliding windows, logit soft-capping and attention sinks under attn_implementation="hsap", on one process.

Tiny random models (2 layers, hidden 64, 4 query / 2 KV heads of 16, vocab 96) whose windows are shorter than
most documents of a packed row: Gemma 2 (soft-capping, a sliding and a full layer), Gemma 3 text, GPT-OSS (sinks
and a window), Mistral (every layer windowed), Qwen2 with one windowed layer (``max_window_layers`` or
``layer_types``). The packed row with "hsap" (plain ``position_ids``, ``cu_seq_lens_q``, and through
``shard_batch(batch, 1)``), in float32 and float64, must give the logits and every parameter gradient (the sinks'
included) of each document run alone with eager attention in float64. The features are first shown to change the
reference (so the comparison could fail), and the window rules of the dispatcher are checked on direct calls.
"""
from __future__ import annotations

import copy
import functools

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GptOssConfig,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
)

import hf_hsap
from hf_hsap.integrations import hsap_attention_forward, register
from helpers import rel_err
from workers.zoo import GRAD_FLOOR, full_precision_softmax
from workers.zoo_run import FLOAT32_ISLAND

REGISTERED = register()
VOCAB = 96
WINDOW = 8  # the families' window; Mistral's is MISTRAL_WINDOW
MISTRAL_WINDOW = 16
DOC_LENS = [23, 1, 8, 30, 6]  # three documents longer than WINDOW, one exactly WINDOW
MISTRAL_DOCS = [64, 7, 64, 1]  # 64-token documents under a 16-token window
TOL = {torch.float32: 1e-4, torch.float64: 1e-9}  # relative to the reference's largest magnitude
FAMILIES = ("gemma2", "gemma3_text", "gpt_oss", "mistral", "qwen2", "qwen2_layer_types")
SLIDING_FULL = ["sliding_attention", "full_attention"]


def _config(family: str) -> PretrainedConfig:
    """A tiny config whose window (and soft-cap / sinks) matter on :data:`DOC_LENS` (initializer 0.1: sharp
    enough attention that a window, a cap of 1 and the sinks change the logits by far more than round-off)."""
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=256, pad_token_id=0,
                  eos_token_id=None, bos_token_id=None, initializer_range=0.1, attention_dropout=0.0)
    if family == "gemma2":  # sliding layer 0, full layer 1, soft-capping on both
        return Gemma2Config(sliding_window=WINDOW, attn_logit_softcapping=1.0, query_pre_attn_scalar=16,
                            layer_types=SLIDING_FULL, **common)
    if family == "gemma3_text":  # sliding / full layers with their own RoPE, q/k norms
        return Gemma3TextConfig(sliding_window=WINDOW, layer_types=SLIDING_FULL, **common)
    if family == "gpt_oss":  # sinks on both layers, a window on layer 0, MoE
        return GptOssConfig(sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
                            layer_types=SLIDING_FULL, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                            **common)
    if family == "mistral":  # no layer_types: every layer passes config.sliding_window
        return MistralConfig(sliding_window=MISTRAL_WINDOW, **common)
    common.pop("head_dim")
    if family == "qwen2":  # layers from max_window_layers on are sliding: layer 0 full, layer 1 sliding
        return Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, **common)
    if family == "qwen2_layer_types":  # the same through explicit layer_types (layer 0 sliding)
        return Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, layer_types=SLIDING_FULL, **common)
    raise KeyError(family)


def _lens(family: str) -> list[int]:
    return MISTRAL_DOCS if family == "mistral" else DOC_LENS


def _build(config: PretrainedConfig, attn: str, dtype: torch.dtype,
           state: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """The causal LM with seed-0 weights (or ``state``), in ``dtype`` and train mode (all dropouts are 0)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, experts_implementation="eager")
    if state is not None:
        model.load_state_dict(state, strict=True)
    return model.to(dtype).train()


@functools.lru_cache(maxsize=None)
def _weights(family: str) -> dict[str, torch.Tensor]:
    """The family's weights; GPT-OSS's sinks drawn from N(0, 1) (their init is ~0) so each head's differs."""
    model = _build(_config(family), "eager", torch.float32)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(5)
    for name in state:
        if name.endswith(".sinks"):
            state[name] = torch.randn(state[name].shape, generator=g)
    return state


def _row(family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed row: ``input_ids [1, T]`` and ``position_ids [1, T]`` restarting at 0 per document."""
    lens = _lens(family)
    ids = torch.randint(1, VOCAB, (1, sum(lens)), generator=torch.Generator().manual_seed(1))
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    return ids, pos


def _weights_of_loss(total: int, dtype: torch.dtype) -> torch.Tensor:
    """Fixed ``[T, V]`` weights of the loss ``sum(w * logits)`` (its gradient touches every logit)."""
    return torch.randn(total, VOCAB, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(dtype)


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in model.named_parameters()}


def _documents_alone(config: PretrainedConfig, state: dict[str, torch.Tensor], family: str,
                     backward: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Float64 eager, every document alone: logits ``[T, V]`` and the gradients of ``sum(w * logits)``."""
    with full_precision_softmax():
        model = _build(config, "eager", torch.float64, state)
        ids, _ = _row(family)
        pieces, start = [], 0
        for n in _lens(family):
            pos = torch.arange(n).unsqueeze(0)
            pieces.append(model(input_ids=ids[:, start:start + n], position_ids=pos, use_cache=False).logits[0])
            start += n
        logits = torch.cat(pieces)  # [T, V]
        if backward:
            (logits * _weights_of_loss(logits.shape[0], logits.dtype)).sum().backward()
    return logits.detach(), _grads(model)


@functools.lru_cache(maxsize=None)
def _reference(family: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return _documents_alone(_config(family), _weights(family), family)


def _without(family: str, feature: str) -> PretrainedConfig:
    """The family's config with one feature turned off (a window longer than every document, no soft-cap)."""
    config = copy.deepcopy(_config(family))
    if feature == "window":
        config.sliding_window = 1024
    elif feature == "softcap":
        config.attn_logit_softcapping = None
    return config


FEATURES = [("gemma2", "window"), ("gemma2", "softcap"), ("gemma3_text", "window"), ("gpt_oss", "window"),
            ("gpt_oss", "sinks"), ("mistral", "window"), ("qwen2", "window"), ("qwen2_layer_types", "window")]


@pytest.mark.parametrize("family, feature", FEATURES, ids=[f"{f}-{x}" for f, x in FEATURES])
def test_the_feature_changes_the_reference(family: str, feature: str) -> None:
    """Each window / soft-cap / sink changes the documents' logits by far more than :data:`TOL` (so the exactness
    test below would notice it missing)."""
    state = dict(_weights(family))
    if feature == "sinks":  # exp(-1e4) == 0: no sink term in the softmax
        state = {k: torch.full_like(v, -1e4) if k.endswith(".sinks") else v for k, v in state.items()}
    off, _ = _documents_alone(_without(family, feature), state, family, backward=False)
    assert rel_err(off, _reference(family)[0]) > 1e-3, f"{family}: turning off the {feature} changes nothing here"


def _packed_run(family: str, dtype: torch.dtype, how: str,
                attn: str = "hsap") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The packed row through ``attn``: ``how`` is ``"position_ids"``, ``"cu_seq_lens"`` or ``"shard_batch"``."""
    with full_precision_softmax():
        model = _build(_config(family), attn, dtype, _weights(family))
        ids, pos = _row(family)
        if attn != "hsap":  # masking_utils reads packed position_ids only without a cache
            inputs = dict(input_ids=ids, position_ids=pos, use_cache=False)
        elif how == "shard_batch":
            inputs = hf_hsap.shard_batch({"input_ids": ids, "position_ids": pos}, 1)
        elif how == "cu_seq_lens":
            cu = torch.tensor([0, *torch.tensor(_lens(family)).cumsum(0).tolist()], dtype=torch.int32)
            n = max(_lens(family))
            inputs = dict(input_ids=ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=n,
                          max_length_k=n)
        else:
            inputs = dict(input_ids=ids, position_ids=pos)
        logits = model(**inputs).logits[0]  # [T, V]
        if how == "shard_batch":
            hf_hsap.check_plan_used(inputs, model)
        (logits * _weights_of_loss(logits.shape[0], logits.dtype)).sum().backward()
    return logits.detach(), _grads(model)


def _errors(family: str, logits: torch.Tensor, grads: dict[str, torch.Tensor]) -> tuple[float, str, float]:
    """``(logits error, worst parameter, its gradient error)`` against :func:`_reference` (gradients relative to
    at least ``GRAD_FLOOR`` x the largest reference gradient, as the model zoo compares)."""
    ref_logits, ref_grads = _reference(family)
    floor = GRAD_FLOOR * max(float(g.abs().max()) for g in ref_grads.values())
    errors = {n: rel_err(grads[n], g, floor=floor) for n, g in ref_grads.items()}
    worst = max(errors, key=errors.get)
    return rel_err(logits, ref_logits), worst, errors[worst]


@functools.lru_cache(maxsize=None)
def _tolerance(family: str, dtype: torch.dtype) -> tuple[float, float]:
    """``(logits, gradients)`` tolerances: :data:`TOL`, in float64 each raised to 10x the error of Transformers'
    own eager run of the packed row where that is at float32 rounding (below ``FLOAT32_ISLAND``, the model zoo's
    rule): Gemma's RMSNorm takes its weight in float32, so that gradient is a float32 sum over the tokens whose
    rounding depends on the shapes (each document alone vs the packed row)."""
    if dtype != torch.float64:
        return TOL[dtype], TOL[dtype]
    logits_err, _, grad_err = _errors(family, *_packed_run(family, dtype, "position_ids", attn="eager"))
    return tuple(max(TOL[dtype], 10 * e) if e < FLOAT32_ISLAND else TOL[dtype] for e in (logits_err, grad_err))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_row_is_exact(family: str, dtype: torch.dtype) -> None:
    """Logits and every parameter gradient of the packed row equal the documents run alone (float64 eager)."""
    logits_tol, grad_tol = _tolerance(family, dtype)
    for how in ("position_ids", "cu_seq_lens", "shard_batch"):
        logits, grads = _packed_run(family, dtype, how)
        logits_err, worst, grad_err = _errors(family, logits, grads)
        assert logits_err <= logits_tol, f"{family} {how}: logits rel {logits_err:.2e} > {logits_tol:.1e}"
        assert grad_err <= grad_tol, f"{family} {how}: gradient of {worst} rel {grad_err:.2e} > {grad_tol:.1e}"
        if family == "gpt_oss":  # the sinks get their own gradient
            assert all(float(g.abs().max()) > 0 for n, g in grads.items() if n.endswith(".sinks"))


@pytest.mark.parametrize("window", [1, 2])
def test_tiny_windows(window: int) -> None:
    """A window of 1 (a token sees only itself: the mask probe sees no documents, every token is a segment) and
    of 2 (only the predecessor) on a packed row equal the documents alone."""
    config = _config("mistral")
    config.sliding_window = window
    state = _weights("mistral")
    ref, _ = _documents_alone(config, state, "mistral", backward=False)
    with full_precision_softmax(), torch.no_grad():
        model = _build(config, "hsap", torch.float64, state)
        ids, pos = _row("mistral")
        assert rel_err(model(input_ids=ids, position_ids=pos).logits[0], ref) <= TOL[torch.float64]


def _heads(seed: int, length: int = 12) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """query ``[1, 4, L, 16]`` and key / value ``[1, 2, L, 16]``."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, 4, length, 16, generator=g, dtype=torch.float64),
            torch.randn(1, 2, length, 16, generator=g, dtype=torch.float64),
            torch.randn(1, 2, length, 16, generator=g, dtype=torch.float64))


def test_which_window_a_call_gets() -> None:
    """``sliding_window`` passed as ``None`` is no window even when the module keeps one (Exaone 4's full layers);
    not passed at all, the module's; a window the layer's mask does not have (``layer_types``) follows the mask."""
    model = _build(_config("qwen2_layer_types"), "hsap", torch.float64, _weights("qwen2_layer_types"))
    sliding, full = model.model.layers[0].self_attn, model.model.layers[1].self_attn
    q, k, v = _heads(0)

    def out(module: torch.nn.Module, **kwargs) -> torch.Tensor:
        return hsap_attention_forward(module, q, k, v, None, **kwargs)[0]

    windowed, causal = out(sliding), out(full)
    assert rel_err(windowed, causal) > 1e-2  # 12 tokens, a window of 8: the window shows
    assert rel_err(out(sliding, sliding_window=WINDOW), windowed) == 0
    assert rel_err(out(full, sliding_window=3), causal) == 0  # the full layer's mask has no window
    assert rel_err(out(sliding, sliding_window=None), windowed) == 0  # the sliding layer's mask has one
    bare = torch.nn.Module()  # no config: the call decides
    bare.sliding_window = WINDOW
    assert rel_err(out(bare), windowed) <= 1e-12
    assert rel_err(out(bare, sliding_window=None), causal) <= 1e-12


def test_malformed_variants_are_refused() -> None:
    """Windows below 1, soft-caps that are not positive, sinks that are not one per query head, position biases."""
    module = torch.nn.Module()
    q, k, v = _heads(1)
    for kwargs, what in (({"sliding_window": 0}, "at least 1 token"), ({"softcap": -1.0}, "positive logit soft-cap"),
                         ({"s_aux": torch.zeros(2)}, r"one logit per query head \(\[4\]\)"),
                         ({"position_bias": torch.zeros(1)}, "position biases")):
        with pytest.raises(ValueError, match=what):
            hsap_attention_forward(module, q, k, v, None, **kwargs)
