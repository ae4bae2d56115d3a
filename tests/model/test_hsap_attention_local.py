"""The "hsap" attention implementation on one process (no sequence parallelism), on tiny random models.

Reference: every document run alone through the same weights with attn_implementation="eager".
"""
from __future__ import annotations

import copy

import pytest
import torch

import hf_hsap
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
)

from hf_hsap.integrations import hsap_attention_forward, is_registered, register
from helpers import rel_err

REGISTERED = register()
VOCAB = 97
DOC_LENS = [1, 7, 2, 33, 1, 12, 3, 48, 5, 1]  # 10 documents, 113 tokens


def _config(kind: str, **extra) -> PretrainedConfig:
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=256, pad_token_id=0, eos_token_id=None,
                  bos_token_id=None, tie_word_embeddings=False)
    common.update(extra)
    if kind == "llama":
        return LlamaConfig(num_key_value_heads=4, **common)
    if kind == "qwen2":  # GQA: 4 query heads share 2 key/value heads
        return Qwen2Config(num_key_value_heads=2, **common)
    if kind == "qwen3":  # explicit head_dim != hidden / heads, q/k norms
        return Qwen3Config(num_key_value_heads=1, head_dim=16, **common)
    if kind == "mistral":  # a sliding window longer than every document must not change anything
        common.setdefault("sliding_window", 64)
        return MistralConfig(num_key_value_heads=2, **common)
    if kind == "mistral_swa":  # a window shorter than the 33- and 48-token documents: computed exactly
        return MistralConfig(num_key_value_heads=2, sliding_window=16, **common)
    raise KeyError(kind)


def _models(kind: str, tmp_path, **extra) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same random weights loaded twice: with "hsap" (from_pretrained) and with "eager"."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(kind, **extra)).float()
    model.save_pretrained(tmp_path)
    hsap = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="hsap", dtype=torch.float32)
    eager = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager", dtype=torch.float32)
    assert hsap.config._attn_implementation == "hsap"
    return hsap, eager


def _packed(lens: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids ``[1, T]``, position_ids ``[1, T]`` (restart at 0), cu_seqlens ``[n + 1]`` int32."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (1, sum(lens)), generator=g)
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return ids, pos, cu


def _loss(logits: torch.Tensor) -> torch.Tensor:
    """A per-token loss whose gradient touches every logit: ``sum(w * logits)`` with fixed weights."""
    w = torch.randn(logits.shape[-2:], generator=torch.Generator().manual_seed(2))  # [T, V]
    return (logits[0] * w).sum()


def _reference(eager: torch.nn.Module, ids: torch.Tensor, lens: list[int]) -> tuple[torch.Tensor, dict]:
    """Logits ``[1, T, V]`` and parameter gradients from running each document alone with eager attention."""
    eager.zero_grad()
    pieces, start = [], 0
    for n in lens:
        pieces.append(eager(input_ids=ids[:, start:start + n]).logits)
        start += n
    logits = torch.cat(pieces, dim=1)  # [1, T, V]
    _loss(logits).backward()
    return logits.detach(), {k: p.grad.clone() for k, p in eager.named_parameters()}


def _check_packed(hsap: torch.nn.Module, ref_logits: torch.Tensor, ref_grads: dict, **inputs) -> None:
    hsap.zero_grad()
    logits = hsap(**inputs).logits
    _loss(logits).backward()
    assert rel_err(logits.detach(), ref_logits) <= 1e-4
    for name, p in hsap.named_parameters():
        assert rel_err(p.grad, ref_grads[name]) <= 1e-4, name


def test_register_is_idempotent_and_set_attn_implementation(tmp_path) -> None:
    assert register() == "hsap" and register() == "hsap" and is_registered()
    from transformers import AttentionInterface

    assert AttentionInterface._global_mapping["hsap"] is hsap_attention_forward
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config("llama"), attn_implementation="eager")
    model.set_attn_implementation("hsap")
    assert model.config._attn_implementation == "hsap"
    ids, pos, _ = _packed([3, 4])
    model.set_attn_implementation("eager")
    # use_cache=False: with a cache, eager/SDPA ignore packed position_ids (masking_utils checks `cache is None`)
    ref = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    model.set_attn_implementation("hsap")
    assert rel_err(model(input_ids=ids, position_ids=pos).logits, ref) <= 1e-4


def test_mask_interface_never_builds_a_dense_mask() -> None:
    from transformers.masking_utils import create_causal_mask

    config = _config("llama")
    config._attn_implementation = "hsap"
    embeds = torch.zeros(2, 7, 32)
    _, pos, _ = _packed([3, 4])
    # packed rows: the document ids read off the composed mask's sub-diagonal, [B, L] (never [B, 1, L, L])
    ids = create_causal_mask(config, embeds, None, None, position_ids=pos.expand(2, -1))
    assert ids.dtype == torch.int32 and torch.equal(ids, torch.tensor([[1, 1, 1, 2, 2, 2, 2]] * 2, dtype=torch.int32))
    assert create_causal_mask(config, embeds, None, None) is None  # one causal document per row
    assert create_causal_mask(config, embeds, torch.ones(2, 7, dtype=torch.long), None, position_ids=pos) is None
    padding = torch.ones(2, 7, dtype=torch.long)
    padding[0, :2] = 0
    mask = create_causal_mask(config, embeds, padding, None, position_ids=pos)
    assert mask.shape == (2, 7) and torch.equal(mask.bool(), padding.bool())  # 0 = padding
    assert torch.equal(mask[0, 2:], mask[0, 2:3].expand(5)) and bool((mask[1] == mask[1, 0]).all())


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral", "mistral_swa"])
def test_packed_row_matches_documents_alone(kind: str, tmp_path) -> None:
    hsap, eager = _models(kind, tmp_path)
    hsap.train(), eager.train()  # dropout is 0 in these configs; train mode exercises the training path
    ids, pos, cu = _packed(DOC_LENS)
    ref_logits, ref_grads = _reference(eager, ids, DOC_LENS)
    _check_packed(hsap, ref_logits, ref_grads, input_ids=ids, position_ids=pos)
    n = int(cu.diff().max())
    _check_packed(hsap, ref_logits, ref_grads, input_ids=ids, position_ids=pos,
                  cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=n, max_length_k=n)


def test_batched_packed_rows_and_right_padding(tmp_path) -> None:
    """Two packed rows (``B = 2``): documents never span rows; a right-padded batch equals its rows alone."""
    hsap, eager = _models("qwen2", tmp_path)
    rows = [[5, 1, 10], [2, 9, 3, 2]]  # 16 tokens per row
    ids = torch.cat([_packed(r)[0] for r in rows])  # [2, 16]
    pos = torch.cat([_packed(r)[1] for r in rows])
    flat_lens = rows[0] + rows[1]
    ref_logits, ref_grads = _reference(eager, ids.reshape(1, -1), flat_lens)
    hsap.zero_grad()
    logits = hsap(input_ids=ids, position_ids=pos).logits.reshape(1, -1, VOCAB)  # [2, 16, V] -> [1, 32, V]
    _loss(logits).backward()
    assert rel_err(logits.detach(), ref_logits) <= 1e-4
    for name, p in hsap.named_parameters():
        assert rel_err(p.grad, ref_grads[name]) <= 1e-4, name
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0  # right padding of the second row
    with torch.no_grad():
        out = hsap(input_ids=ids, attention_mask=mask).logits
        assert rel_err(out[0], eager(input_ids=ids[:1]).logits[0]) <= 1e-4
        assert rel_err(out[1, :11], eager(input_ids=ids[1:, :11]).logits[0]) <= 1e-4


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_generate_matches_eager(kind: str, tmp_path) -> None:
    hsap, eager = _models(kind, tmp_path)
    prompt = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(prompt)
    prompt[1, :4], mask[1, :4] = 0, 0  # left padding
    kwargs = dict(max_new_tokens=12, do_sample=False, return_dict_in_generate=True, output_scores=True)
    for extra in ({}, {"cache_implementation": "static"}):
        a = hsap.generate(prompt, attention_mask=mask, **kwargs, **extra)
        b = eager.generate(prompt, attention_mask=mask, **kwargs, **extra)
        assert torch.equal(a.sequences, b.sequences)
        assert max(rel_err(x, y) for x, y in zip(a.scores, b.scores)) <= 1e-4
    single = prompt[:1]
    assert torch.equal(hsap.generate(single, max_new_tokens=8, do_sample=False),
                       eager.generate(single, max_new_tokens=8, do_sample=False))


def test_refusals(tmp_path) -> None:
    """What "hsap" still refuses (windows, soft-capping and sinks are exact: tests/model/test_windows_local.py)."""
    ids, pos, _ = _packed([30, 4])
    model, _ = _models("llama", tmp_path / "l")
    attn = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 5, 8)
    k = v = torch.randn(1, 4, 5, 8)
    for kwargs, what in (({"position_bias": torch.zeros(1, 4, 5, 5)}, "position biases"),
                         ({"s_aux": torch.zeros(3)}, "one logit per query head"), ({"softcap": 0.0}, "soft-cap"),
                         ({"sliding_window": 0}, "at least 1 token"),
                         ({"dropout": 0.1}, "dropout"), ({"is_causal": False}, "not causal")):
        with pytest.raises(ValueError, match=what):
            hsap_attention_forward(attn, q, k, v, None, **kwargs)
    bidir = copy.copy(attn)
    bidir.is_causal = False
    with pytest.raises(ValueError, match="not causal"):
        hsap_attention_forward(bidir, q, k, v, None)
    with pytest.raises(ValueError, match="only 2D padding masks"):
        hsap_attention_forward(attn, q, k, v, torch.zeros(1, 1, 5, 5))

    with pytest.raises(ValueError, match="contiguous"):  # padding between tokens
        model(input_ids=ids[:, :6], attention_mask=torch.tensor([[1, 1, 0, 1, 1, 1]]))
    for layer in model.model.layers:  # as if loaded with config.attention_dropout = 0.1
        layer.self_attn.attention_dropout = 0.1
    model.train()
    with pytest.raises(ValueError, match="attention_dropout"):
        model(input_ids=ids, position_ids=pos)
    model.eval()  # eval mode passes dropout=0
    model(input_ids=ids, position_ids=pos)
    model.train()
    model.config.attention_dropout = 0.0  # what the old message advised: does not reach the layers
    with pytest.raises(ValueError, match="disable_attention_dropout=True to hf_hsap.prepare_model"):
        model(input_ids=ids, position_ids=pos)
    hf_hsap.prepare_model(model, disable_attention_dropout=True)  # the fix the message names
    assert all(layer.self_attn.attention_dropout == 0.0 for layer in model.model.layers)
    model(input_ids=ids, position_ids=pos)
    model.eval()
    prompt = torch.randint(1, VOCAB, (2, 6))
    right = torch.ones_like(prompt)
    right[1, 4:] = 0
    with pytest.raises(ValueError, match="padding_side"):
        model.generate(prompt, attention_mask=right, max_new_tokens=2, do_sample=False)
