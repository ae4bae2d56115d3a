"""``check_model``, ``prepare_model`` and the config checks on one process: what is refused, with which fix, and what runs.

References are each document alone in eager attention (float64).
"""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, BloomConfig, LlamaConfig

import hf_hsap
from hf_hsap.integrations import UnsupportedModelError
from workers.plan_use import chunked_llama4

VOCAB = 61
LENS = [5, 20, 1, 13]  # documents longer than the chunk of 8 and shorter ones


def _row() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (1, sum(LENS)), generator=g)
    return ids, torch.cat([torch.arange(n) for n in LENS]).unsqueeze(0)


def test_chunked_attention_is_exact_on_one_process() -> None:
    model = chunked_llama4(chunk=8).double().eval()
    ids, pos = _row()
    with torch.no_grad():
        model.set_attn_implementation("eager")
        ref, start = [], 0
        for n in LENS:
            ref.append(model(input_ids=ids[:, start:start + n], use_cache=False).logits[0])
            start += n
        ref = torch.cat(ref)  # [T, V]
        model.set_attn_implementation("hsap")
        plain = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        sharded = model(**hf_hsap.shard_batch({"input_ids": ids, "position_ids": pos}, 1)).logits[0]
    scale = ref.abs().max()
    assert float((plain - ref).abs().max() / scale) < 1e-12
    assert float((sharded - ref).abs().max() / scale) < 1e-12
    assert hf_hsap.check_model(model, sp_size=2).chunk_size == 8


def test_llama_passes_with_its_layer_count() -> None:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="hsap")
    assert hf_hsap.check_model(model, sp_size=4).attention_layers == 3


def test_attention_outside_the_interface_is_refused() -> None:
    config = BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="hsap")
    with pytest.raises(UnsupportedModelError, match="bloom computes attention in its own code.*sdpa"):
        hf_hsap.check_model(model)
    ids, _ = _row()
    with pytest.raises(UnsupportedModelError, match="outside Transformers' AttentionInterface"):
        model(input_ids=ids[:, :6])  # even one document: bloom would have lost causality


def test_attention_dropout_is_refused_until_disabled() -> None:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.1)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="hsap").train()
    with pytest.raises(UnsupportedModelError, match="disable_attention_dropout=True to hf_hsap.prepare_model"):
        hf_hsap.prepare_model(model)
    assert model.model.layers[0].self_attn.attention_dropout == 0.1  # refused: nothing was changed
    prepared = hf_hsap.prepare_model(model, disable_attention_dropout=True)
    assert prepared.check.attention_layers == 2
    assert model.model.layers[0].self_attn.attention_dropout == 0.0 and model.config.attention_dropout == 0.0
    prepared.undo()
    assert model.model.layers[1].self_attn.attention_dropout == 0.1 and model.config.attention_dropout == 0.1


def test_hybrid_model_unprepared_refused_then_exact_on_packed_rows_given_by_cu_seq_lens_only() -> None:
    """The documents may reach "hsap" only as cu_seq_lens_q (no position_ids): a hybrid whose convolution layers
    prepare_model did not prepare is refused then too (check_model alone changes nothing); prepared, its packed row
    equals its documents run alone."""
    from transformers import Lfm2Config

    config = Lfm2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, full_attn_idxs=[1])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="hsap").double()
    ids, _ = _row()
    cu = torch.tensor([0, *torch.tensor(LENS).cumsum(0).tolist()], dtype=torch.int32)
    packed = dict(input_ids=ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=20, max_length_k=20, use_cache=False)
    with pytest.raises(UnsupportedModelError, match="lfm2's linear-attention .* on packed rows: call hf_hsap.prepare_model"):
        model(**packed)
    model(input_ids=ids[:, :5], use_cache=False)  # one document: the convolution sees only it, exact
    assert hf_hsap.check_model(model).mixer_layers == 1
    with pytest.raises(UnsupportedModelError, match="call hf_hsap.prepare_model"):
        model(**packed)  # the check only read
    assert hf_hsap.prepare_model(model).check.mixer_layers == 1
    got = model(**packed).logits[0]
    alone = torch.cat([model(input_ids=ids[:, a:b], use_cache=False).logits[0] for a, b in zip(cu[:-1], cu[1:])])
    # positions run on through the row here (no position_ids): RoPE's float32 angles differ from each document's own
    torch.testing.assert_close(got, alone, rtol=1e-6, atol=1e-6)


def test_gpt2_attention_dropout_found_and_disabled() -> None:
    """GPT-2 keeps its attention dropout as ``attn_dropout`` (from ``attn_pdrop``), not ``attention_dropout``."""
    from transformers import GPT2Config

    model = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                                        attn_pdrop=0.1), attn_implementation="hsap")
    with pytest.raises(UnsupportedModelError, match="disable_attention_dropout"):
        hf_hsap.check_model(model.eval())  # eval mode too: training will turn the dropout on
    hf_hsap.prepare_model(model.train(), disable_attention_dropout=True)
    assert all(block.attn.attn_dropout.p == 0.0 for block in model.transformer.h)
    ids, _ = _row()
    model(input_ids=ids[:, :6])  # the forward in train mode passes dropout 0 now


def test_packed_rows_with_a_padding_mask_and_chunks_with_cu_seq_lens() -> None:
    """Position restarts split documents also beside a padding mask (masking_utils then does not look for
    them); chunk boundaries split documents also when cu_seq_lens_q gives them."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").double().eval()
    ids, _ = _row()
    lens = [5, 4]  # then 3 padded slots
    row = ids[:, :12]
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 1, 1, 1]])
    mask = torch.tensor([[1] * 9 + [0] * 3])
    with torch.no_grad():
        ref = torch.cat([model(input_ids=row[:, :5]).logits[0], model(input_ids=row[:, 5:9]).logits[0]])
        model.set_attn_implementation("hsap")
        got = model(input_ids=row, position_ids=pos, attention_mask=mask, use_cache=False).logits[0, :9]
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-6, lens  # eager's softmax runs in float32

    chunked = chunked_llama4(chunk=8).double().eval()
    cu = torch.tensor([0, 20, 30], dtype=torch.int32)
    long_row = ids[:, :30]
    with torch.no_grad():
        chunked.set_attn_implementation("eager")
        ref = torch.cat([chunked(input_ids=long_row[:, :20], use_cache=False).logits[0],
                         chunked(input_ids=long_row[:, 20:], use_cache=False).logits[0]])
        chunked.set_attn_implementation("hsap")
        pos = torch.cat([torch.arange(20), torch.arange(10)]).unsqueeze(0)
        got = chunked(input_ids=long_row, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=20,
                      max_length_k=20, use_cache=False).logits[0]
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-6  # merged chunks: ~0.3
