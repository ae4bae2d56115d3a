"""Generation conformance of attn_implementation="hsap" on one process, on tiny random models.

For the same weights, "hsap" must generate exactly what "sdpa" and "eager" generate (greedy tokens identical,
per-step scores equal to round-off) with a dynamic cache, a static cache and a static cache longer than the
sliding window of a windowed model (Mistral), for batch 1 without a mask, batch 1 with an all-ones mask and a
left-padded batch of 3. A prefill forward with an explicit cache object followed by one decode step is compared
on logits directly. Finally a packed row (positions restarting at 0, no attention_mask) must equal its documents
run alone, also for families whose decoder layers do not forward ``position_ids`` to the attention function.

Windows shorter than the prompts (:data:`WINDOW_FAMILIES`: Mistral, Gemma 3 text, GPT-OSS with sinks, Gemma 2
with soft-capping; their sliding layers get Transformers' sliding-window cache layers, dynamic and static) are
compared the same way, against eager where the family has no SDPA (GPT-OSS, Gemma 2), in float32 and float64 (run
inside the model zoo's ``full_precision_softmax``, so float64 eager is float64 throughout).
"""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    Gemma2Config,
    Gemma3TextConfig,
    GemmaConfig,
    GPTBigCodeConfig,
    GptOssConfig,
    LlamaConfig,
    Llama4TextConfig,
    MistralConfig,
    PersimmonConfig,
    Phi3Config,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
    StaticCache,
)
from transformers.generation import GenerateDecoderOnlyOutput

from hf_hsap.integrations import register
from helpers import rel_err
from workers.zoo import full_precision_softmax

REGISTERED = register()
VOCAB = 97
PROMPT_LEN = 9
NEW_TOKENS = 8
WINDOW = 20  # Mistral's sliding window: longer than prompt + generated tokens (17), shorter than LONG_CACHE
LONG_CACHE = 40  # "static_long": a static cache with many unfilled slots (Mistral: 20-slot sliding layers)
PADS = (0, 3, 5)  # left padding per row of the padded batch
TOL = {torch.float32: 1e-4, torch.float64: 1e-9}  # relative to the reference's largest magnitude
# Transformers' eager attention takes its softmax in float32 (``softmax(..., dtype=torch.float32)``): in float64 it
# is only float32-exact, and its float64 ``finfo.min`` mask becomes -inf in that softmax, so fully padded query rows
# turn NaN and poison the padded cache slots (left-padded float64 eager logits are NaN). Eager is therefore a
# reference in float32 only; SDPA (a true float64 softmax) is the float64 reference.
REFERENCES = {torch.float32: ("sdpa", "eager"), torch.float64: ("sdpa",)}

GEN_FAMILIES = ("llama", "qwen2", "mistral", "qwen3", "phi3", "gemma")
CACHES = ("dynamic", "static", "static_long")
BATCHES = ("one_nomask", "one_ones", "left_padded")
PACKED_FAMILIES = ("llama", "llama4", "persimmon", "gpt_bigcode")
SHORT_WINDOW = 4  # the windowed families': shorter than every prompt (9 tokens, 4 after the most left padding)
WINDOW_FAMILIES = ("mistral_swa", "gemma3", "gpt_oss", "gemma2")
WINDOW_REFERENCES = {"gpt_oss": ("eager",), "gemma2": ("eager",)}  # no SDPA (sinks, soft-capping); else sdpa, eager
SLIDING_FULL = ["sliding_attention", "full_attention"]
DOC_LENS = [5, 1, 9, 3, 6]


def _cases() -> list:
    """family x cache x batch; ``static_long`` only where it adds a layout (Mistral's window, and llama)."""
    return [
        pytest.param(f, c, b, id=f"{f}-{c}-{b}")
        for f in GEN_FAMILIES
        for c in CACHES
        if c != "static_long" or f in ("mistral", "llama")
        for b in BATCHES
    ]


def _config(family: str) -> PretrainedConfig:
    """A tiny config (hidden 32, 2 layers, 4 query heads, 2 KV heads where the family has GQA)."""
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=128, pad_token_id=0, eos_token_id=None,
                  bos_token_id=None, tie_word_embeddings=False)
    if family == "llama":
        return LlamaConfig(num_key_value_heads=2, **common)
    if family == "qwen2":
        return Qwen2Config(num_key_value_heads=2, **common)
    if family == "mistral":  # every layer is a sliding layer (DynamicSlidingWindowLayer / StaticSlidingWindowLayer)
        return MistralConfig(num_key_value_heads=2, sliding_window=WINDOW, **common)
    if family == "qwen3":  # q/k norms, head_dim != hidden / heads
        return Qwen3Config(num_key_value_heads=2, head_dim=16, **common)
    if family == "phi3":  # fused qkv projection
        return Phi3Config(num_key_value_heads=2, **common)
    if family == "gemma":  # scaled embeddings, tied head by default, head_dim != hidden / heads
        common["tie_word_embeddings"] = True
        return GemmaConfig(num_key_value_heads=2, head_dim=16, hidden_activation="gelu_pytorch_tanh", **common)
    # windowed families (initializer 0.1: attention sharp enough that the window, cap and sinks matter)
    window = dict(sliding_window=SHORT_WINDOW, initializer_range=0.1)
    if family == "mistral_swa":  # every layer a sliding layer of SHORT_WINDOW
        return MistralConfig(num_key_value_heads=2, **window, **common)
    if family == "gemma3":  # one sliding, one full layer
        return Gemma3TextConfig(num_key_value_heads=2, head_dim=16, layer_types=SLIDING_FULL, **window, **common)
    if family == "gpt_oss":  # sinks on both layers, MoE
        return GptOssConfig(num_key_value_heads=2, head_dim=16, layer_types=SLIDING_FULL, num_local_experts=4,
                            num_experts_per_tok=2, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                            **window, **common)
    if family == "gemma2":  # soft-capping on both layers
        return Gemma2Config(num_key_value_heads=2, head_dim=16, layer_types=SLIDING_FULL, attn_logit_softcapping=1.0,
                            query_pre_attn_scalar=16, **window, **common)
    if family == "llama4":  # decoder layer does not pass position_ids on; dense, RoPE on every layer, no chunking
        return Llama4TextConfig(num_key_value_heads=2, head_dim=8, intermediate_size_mlp=48, moe_layers=[],
                                no_rope_layers=[1, 1], attention_chunk_size=None, attn_temperature_tuning=False,
                                **common)
    if family == "persimmon":  # attention takes position_ids as a named argument and drops it
        common.pop("intermediate_size")
        return PersimmonConfig(intermediate_size=48, qk_layernorm=True, **common)
    if family == "gpt_bigcode":  # learned absolute positions, multi-query; blocks do not pass position_ids on
        return GPTBigCodeConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_inner=48, n_positions=128,
                                multi_query=True, pad_token_id=0, eos_token_id=None, bos_token_id=None,
                                attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    raise KeyError(family)


def _models(family: str, dtype: torch.dtype, impls: tuple[str, ...] | None = None) -> dict:
    """The same random weights (seed 0) once per attention implementation, in eval mode and ``dtype``."""
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(_config(family), attn_implementation="eager",
                                            experts_implementation="eager").to(dtype).eval()  # MoE in float64
    out = {}
    for impl in impls or ("hsap", *REFERENCES[dtype]):
        model = copy.deepcopy(base)
        model.set_attn_implementation(impl)
        assert model.config._attn_implementation == impl
        out[impl] = model
    return out


def _batch(kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tokenizer-free prompts: ``input_ids [B, PROMPT_LEN]`` (tokens >= 1, pad id 0) and the mask or ``None``."""
    g = torch.Generator().manual_seed(3)
    if kind == "one_nomask":
        return torch.randint(1, VOCAB, (1, PROMPT_LEN), generator=g), None
    if kind == "one_ones":
        ids = torch.randint(1, VOCAB, (1, PROMPT_LEN), generator=g)
        return ids, torch.ones_like(ids)
    if kind == "left_padded":
        ids = torch.randint(1, VOCAB, (len(PADS), PROMPT_LEN), generator=g)
        mask = torch.ones_like(ids)
        for row, pad in enumerate(PADS):
            ids[row, :pad], mask[row, :pad] = 0, 0
        return ids, mask
    raise KeyError(kind)


def _generate(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None, cache: str
) -> GenerateDecoderOnlyOutput:
    """Greedy generation of ``NEW_TOKENS`` tokens with per-step scores."""
    kwargs: dict = dict(max_new_tokens=NEW_TOKENS, do_sample=False, output_scores=True,
                        return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    if mask is not None:
        kwargs["attention_mask"] = mask
    if cache != "dynamic":
        kwargs["cache_implementation"] = "static"
    if cache == "static_long":
        kwargs["max_cache_len"] = LONG_CACHE
    with torch.no_grad():
        return model.generate(ids, **kwargs)


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """Where two ``[B, PROMPT_LEN + NEW_TOKENS]`` sequences first differ (generated step, rows)."""
    diff = (a != b).any(dim=0).nonzero().flatten()
    col = int(diff[0])
    rows = (a[:, col] != b[:, col]).nonzero().flatten().tolist()
    return f"sequences differ at step {col - PROMPT_LEN} (rows {rows}): {a[:, col].tolist()} vs {b[:, col].tolist()}"


def _check_generation(family: str, cache: str, batch: str, references: dict) -> None:
    """Greedy tokens of "hsap" identical to each reference's and per-step scores within round-off.

    Args:
        family, cache, batch: see :func:`_config`, :func:`_generate`, :func:`_batch`.
        references: dtype -> the attention implementations to compare with.
    """
    ids, mask = _batch(batch)
    for dtype in (torch.float32, torch.float64):
        models = _models(family, dtype, ("hsap", *references[dtype]))
        out = {impl: _generate(m, ids, mask, cache) for impl, m in models.items()}
        for ref in references[dtype]:
            a, b = out["hsap"], out[ref]
            assert a.sequences.shape == b.sequences.shape, (ref, dtype)
            where = "" if torch.equal(a.sequences, b.sequences) else _first_difference(a.sequences, b.sequences)
            assert not where, f"vs {ref}, {dtype}: {where}"
            errors = [rel_err(x, y) for x, y in zip(a.scores, b.scores)]
            assert len(errors) == NEW_TOKENS
            worst = max(range(NEW_TOKENS), key=lambda s: errors[s])
            assert errors[worst] <= TOL[dtype], (
                f"vs {ref}, {dtype}: scores differ at step {worst}, rel {errors[worst]:.2e}")


@pytest.mark.parametrize("family, cache, batch", _cases())
def test_generate_matches_sdpa_and_eager(family: str, cache: str, batch: str) -> None:
    """Greedy tokens identical and per-step scores within round-off, float32 and float64."""
    _check_generation(family, cache, batch, REFERENCES)


def _positions(mask: torch.Tensor | None, length: int, batch: int) -> torch.Tensor:
    """What generate passes: ``cumsum(mask) - 1`` with padded slots at 1, else ``arange``."""
    if mask is None:
        return torch.arange(length).expand(batch, -1)
    return (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)


def _make_cache(kind: str, model: torch.nn.Module) -> DynamicCache | StaticCache:
    """A fresh cache object of ``kind`` (static: 13 slots, or ``LONG_CACHE`` for ``static_long``)."""
    if kind == "dynamic":
        return DynamicCache(config=model.config)
    return StaticCache(config=model.config, max_cache_len=LONG_CACHE if kind == "static_long" else PROMPT_LEN + 4)


def _check_prefill_and_decode(family: str, cache: str, batch: str, references: dict) -> None:
    """``model(prompt, cache=...)`` then one decode step: logits of valid positions equal each reference's."""
    ids, mask = _batch(batch)
    nxt = torch.randint(1, VOCAB, (ids.shape[0], 1), generator=torch.Generator().manual_seed(4))
    pos = _positions(mask, PROMPT_LEN, ids.shape[0])
    mask2 = None if mask is None else torch.cat([mask, torch.ones_like(nxt)], dim=1)
    valid = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()  # [B, L]
    for dtype in (torch.float32, torch.float64):
        logits = {}
        for impl, model in _models(family, dtype, ("hsap", *references[dtype])).items():
            kv = _make_cache(cache, model)
            with torch.no_grad():
                prefill = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=kv, use_cache=True)
                step = model(input_ids=nxt, attention_mask=mask2, position_ids=pos[:, -1:] + 1, cache=kv,
                             use_cache=True)
            logits[impl] = (prefill.logits[valid], step.logits[:, -1])  # [N_valid, V], [B, V]
        for ref in references[dtype]:
            pre = rel_err(logits["hsap"][0], logits[ref][0])
            dec = rel_err(logits["hsap"][1], logits[ref][1])
            assert pre <= TOL[dtype], f"vs {ref}, {dtype}: prefill logits differ, rel {pre:.2e}"
            assert dec <= TOL[dtype], f"vs {ref}, {dtype}: decode-step logits differ, rel {dec:.2e}"


@pytest.mark.parametrize("family, cache, batch", _cases())
def test_prefill_and_decode_step_logits(family: str, cache: str, batch: str) -> None:
    """``model(prompt, cache=...)`` then one decode step: logits of valid positions equal SDPA's and eager's."""
    _check_prefill_and_decode(family, cache, batch, REFERENCES)


def _window_references(family: str) -> dict:
    """dtype -> references of a windowed family (eager only where the family has no SDPA)."""
    refs = WINDOW_REFERENCES.get(family, ("sdpa", "eager"))
    return {torch.float32: refs, torch.float64: refs}


WINDOW_CASES = [
    pytest.param(f, c, b, id=f"{f}-{c}-{b}")
    for f in WINDOW_FAMILIES
    for c in CACHES
    if c != "static_long" or f in ("mistral_swa", "gemma3")
    for b in ("one_nomask", "left_padded")
]


@pytest.mark.parametrize("family, cache, batch", WINDOW_CASES)
def test_windowed_generate_matches_references(family: str, cache: str, batch: str) -> None:
    """Windows shorter than the prompts: greedy tokens identical and scores within round-off (the sliding layers'
    caches keep ``SHORT_WINDOW - 1`` keys (dynamic) or ``SHORT_WINDOW`` rolled slots (static))."""
    with full_precision_softmax():
        _check_generation(family, cache, batch, _window_references(family))


@pytest.mark.parametrize("family, cache", [(f, c) for f in WINDOW_FAMILIES for c in ("dynamic", "static")])
def test_windowed_prefill_and_decode_step_logits(family: str, cache: str) -> None:
    """A left-padded prefill longer than the window into an explicit cache, then one decode step."""
    with full_precision_softmax():
        _check_prefill_and_decode(family, cache, "left_padded", _window_references(family))


# With a cache (use_cache left at its default: the model builds a DynamicCache) masking_utils does not look
# for packed sequences, for every attention implementation; "hsap" still splits documents by position_ids,
# which only reach it in families whose layers forward them (llama). The others need use_cache=False (the
# README's limits), or shard_batch / cu_seq_lens_q, which give the documents explicitly.
PACKED_CASES = [("llama", None)] + [(family, False) for family in PACKED_FAMILIES]


@pytest.mark.parametrize("family,use_cache", PACKED_CASES,
                         ids=[f"{f}-{'use_cache_default' if u is None else 'use_cache_false'}" for f, u in PACKED_CASES])
def test_packed_row_matches_documents_alone(family: str, use_cache: bool | None) -> None:
    """A packed row (positions restart at 0, no mask) through ``model(ids, position_ids=...)`` with "hsap"
    equals every document run alone with "eager" (see ``PACKED_CASES`` for ``use_cache``)."""
    models = _models(family, torch.float32, impls=("hsap", "eager"))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (1, sum(DOC_LENS)), generator=g)
    pos = torch.cat([torch.arange(n) for n in DOC_LENS]).unsqueeze(0)
    kwargs = {} if use_cache is None else {"use_cache": use_cache}
    with torch.no_grad():
        packed = models["hsap"](input_ids=ids, position_ids=pos, **kwargs).logits[0]  # [T, V]
        start, errors = 0, []
        for n in DOC_LENS:
            alone = models["eager"](input_ids=ids[:, start:start + n]).logits[0]  # [n, V]
            errors.append(rel_err(packed[start:start + n], alone))
            start += n
    bad = [(i, f"{e:.2e}") for i, e in enumerate(errors) if e > TOL[torch.float32]]
    assert not bad, f"{family}: documents (index, rel error) mixed with their neighbours: {bad}"


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generation_past_the_sliding_window_matches_sdpa(cache: str) -> None:
    """Mistral generating 12 tokens after left-padded 9-token prompts with a window of 10 (the window is crossed
    while decoding) and of 8 (prompts longer than the window): the same tokens and scores as SDPA."""
    config = _config("mistral")
    ids, mask = _batch("left_padded")
    kwargs: dict = dict(max_new_tokens=12, do_sample=False, output_scores=True, return_dict_in_generate=True,
                        pad_token_id=0, eos_token_id=None, attention_mask=mask)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    for window in (10, 8):
        config.sliding_window = window
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
        hsap = copy.deepcopy(base)
        hsap.set_attn_implementation("hsap")
        with torch.no_grad():
            a, b = hsap.generate(ids, **kwargs), base.generate(ids, **kwargs)
        assert torch.equal(a.sequences, b.sequences), f"window {window}"
        assert max(rel_err(x, y) for x, y in zip(a.scores, b.scores)) <= TOL[torch.float32], f"window {window}"
