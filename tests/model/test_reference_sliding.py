"""Unlimited-OCR's ``"reference_sliding_attention"`` layers under attn_implementation="hsap": causal within a forward.

Transformers masks these layers with ``sliding window OR (causal AND key in the prefill)``; without a KV cache every
key is prefill, so a training forward is plain causal attention, whatever ``sliding_window`` says. A tiny text model
(2 dense layers) with a window of 2 tokens, far shorter than its documents: the packed row through
"hsap" (through ``shard_batch(batch, 1)``) must give the hidden states and every parameter gradient of each document
run alone with SDPA in float64 (applying the window, or refusing the layers, fails it). A decode step of several
tokens is refused naming SDPA.
"""
from __future__ import annotations

import pytest
import torch
from transformers.models.unlimited_ocr.configuration_unlimited_ocr import UnlimitedOcrTextConfig
from transformers.models.unlimited_ocr.modeling_unlimited_ocr import UnlimitedOcrTextModel

import hf_hsap
from hf_hsap.integrations import register
from hf_hsap.integrations.mask import hsap_mask_function
from hf_hsap.integrations.model_check import UnsupportedModelError
from helpers import rel_err

REGISTERED = register()
LENS = [9, 3, 12]  # documents longer than the window
VOCAB = 64


def _config(attn: str) -> UnlimitedOcrTextConfig:
    config = UnlimitedOcrTextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                    mlp_layer_types=["dense", "dense"], sliding_window=2,
                                    max_position_embeddings=64, pad_token_id=0, initializer_range=0.2)
    config._attn_implementation = attn
    return config


def _run(attn: str, packed: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Hidden states ``[T, D]`` of the row (packed, or each document alone) and the gradients of a fixed loss."""
    torch.manual_seed(0)
    model = UnlimitedOcrTextModel(_config(attn)).to(torch.float64).train()
    ids = torch.randint(1, VOCAB, (1, sum(LENS)), generator=torch.Generator().manual_seed(1))
    if packed:
        pos = torch.cat([torch.arange(n) for n in LENS]).unsqueeze(0)
        out = model(**hf_hsap.shard_batch({"input_ids": ids, "position_ids": pos}, 1))
        hidden = out.last_hidden_state[0]
    else:
        pieces = [model(input_ids=piece, position_ids=torch.arange(piece.shape[1]).unsqueeze(0),
                        use_cache=False).last_hidden_state[0] for piece in ids.split(LENS, dim=1)]
        hidden = torch.cat(pieces)
    weights = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (hidden * weights).sum().backward()
    return hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_reference_sliding_layers_are_causal_and_exact_on_packed_rows() -> None:
    """The layer types are read, the window is not applied, and the packed row equals each document alone."""
    assert set(_config("hsap").layer_types) == {"reference_sliding_attention"}
    ref_hidden, ref_grads = _run("sdpa", packed=False)
    hidden, grads = _run("hsap", packed=True)
    assert rel_err(hidden, ref_hidden) < 1e-10
    assert set(grads) == set(ref_grads)
    floor = 1e-6 * max(float(g.abs().max()) for g in ref_grads.values())
    worst = max(rel_err(grads[n], g, floor=floor) for n, g in ref_grads.items())
    assert worst < 1e-8, worst


def test_reference_sliding_decode_of_several_tokens_is_refused() -> None:
    """A decode step of two new tokens (each would need its own window) is refused naming SDPA."""
    config = _config("hsap")
    with pytest.raises(UnsupportedModelError, match="sdpa"):
        hsap_mask_function(1, 2, 6, q_offset=6, kv_offset=2, mask_function=lambda *a: True, config=config,
                           use_vmap=True)
