"""The one model-shape type (hf_hsap.model_shape.ModelShape): its counts by hand, and its reading of configs."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from hf_hsap.model_shape import MODEL_SHAPES, ModelShape, text_config

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False)


def test_the_table_entry_is_the_config_read():
    """Llama-3-8B of the benchmark table is the shape read from its config.json fields, but for its name."""
    assert dataclasses.replace(MODEL_SHAPES["llama3-8b"], name="") == ModelShape.from_config(LLAMA3_8B)


def test_counts_by_hand():
    """Head bytes, linear weights and all parameters of a dense layer, written out."""
    s = MODEL_SHAPES["llama3-8b"]
    assert s.kv_token_bytes == 2 * 8 * 128 * 2 and s.q_token_bytes == 32 * 128 * 2
    linear = 4096 * 128 * (2 * 32 + 2 * 8) + 3 * 4096 * 14336
    assert s.layer_linear_params == linear
    assert s.layer_params == linear + 2 * 4096  # and the layer's two norms
    assert s.params == 2 * 128256 * 4096 + 32 * s.layer_params + 4096
    qk = dataclasses.replace(s, qk_norm=True)
    assert qk.layer_params == s.layer_params + 2 * 128 and qk.layer_linear_params == linear


def test_experts_hold_every_expert_and_a_token_meets_top_k():
    """A MoE layer holds every expert's weights; a token is multiplied by the router and its top_k experts'."""
    moe = ModelShape.from_config(dict(model_type="qwen3_moe", hidden_size=64, intermediate_size=96,
                                      moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=16, vocab_size=100))
    attn = 64 * 16 * (2 * 4 + 2 * 2)
    assert (moe.experts, moe.top_k, moe.moe_intermediate, moe.qk_norm) == (8, 2, 16, True)
    assert moe.layer_params == attn + 8 * 3 * 64 * 16 + 8 * 64 + 2 * 64 + 2 * 16
    assert moe.layer_linear_params == attn + 2 * 3 * 64 * 16 + 8 * 64


def test_a_composite_config_is_read_through_its_text_config():
    """A vision-language config's decoder sizes are those of its text config; defaults fill what a config omits."""
    text = SimpleNamespace(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           vocab_size=50)
    composite = SimpleNamespace(get_text_config=lambda decoder: text, hidden_size=999)
    assert text_config(composite) is text
    s = ModelShape.from_config(composite)
    assert (s.hidden, s.kv_heads, s.head_dim, s.tied, s.experts) == (32, 4, 8, False, 0)


def test_frozen_and_keyword_only():
    with pytest.raises(dataclasses.FrozenInstanceError):
        MODEL_SHAPES["llama2-7b"].layers = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        ModelShape(4096, 11008, 32, 32, 32, 128, 32000)  # type: ignore[misc]
