"""Hybrid models off the training path: an evaluation-style forward of packed rows (``use_cache`` on, as
``model.eval()`` gives) and a call of the base model itself are exact against each document alone, in float64, and
the cache holds every row's last document's state, as if that document had run alone (what generation continues)."""
from __future__ import annotations

import pytest
import torch

import hf_hsap
from workers import zoo_configs as ZC

LENS = [9, 14, 6]
# delta rule, Mamba2, Mamba, lightning attention, short convolution (Bamba's and Jamba's tiny configs have no attention
# layer, and Transformers' own cached forward then fails on their mask)
FAMILIES = ["qwen3_5_text", "nemotron_h", "falcon_mamba", "minimax", "lfm2", "granitemoehybrid"]


def _model(family: str) -> torch.nn.Module:
    config = ZC.tiny_config(family)
    model = ZC.build_model(config, "hsap", torch.float64, draw=torch.float64).eval()
    hf_hsap.prepare_model(model)
    return model


def _row(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, vocab, (1, sum(LENS)), generator=torch.Generator().manual_seed(0))
    return ids, torch.cat([torch.arange(n) for n in LENS]).unsqueeze(0)


def _states(cache: object, layers: int) -> list[torch.Tensor]:
    """Every state the cache holds: the layers' running ``state``, MiniMax's ``K^T V``, a convolution's last inputs."""
    out = []
    for i in range(layers):
        for get in ("get_recurrent_state", "get_linear_cache", "get_conv_state"):
            try:
                s = getattr(cache, get)(i)
            except Exception:  # noqa: BLE001 - an attention layer, or the other kind of state
                continue
            if torch.is_tensor(s):
                out.append(s)
                break
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_eval_forward_and_its_cache(family: str) -> None:
    model = _model(family)
    ids, pos = _row(model.config.get_text_config().vocab_size)
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=True)
        alone, start = [], 0
        for n in LENS:
            last = model(input_ids=ids[:, start:start + n], use_cache=True)
            alone.append(last.logits)
            start += n
    torch.testing.assert_close(packed.logits, torch.cat(alone, 1), rtol=1e-9, atol=1e-9)
    layers = ZC.num_layers(model.config)
    got, want = _states(packed.past_key_values, layers), _states(last.past_key_values, layers)
    assert got and len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("family", ["qwen3_5_text", "granitemoehybrid"])
def test_base_model_called_directly_keeps_documents_apart(family: str) -> None:
    model = _model(family)
    ids, pos = _row(model.config.vocab_size)
    with torch.no_grad():
        packed = model.model(input_ids=ids, position_ids=pos).last_hidden_state
        alone = torch.cat([model.model(input_ids=d).last_hidden_state for d in ids.split(LENS, dim=1)], 1)
    torch.testing.assert_close(packed, alone, rtol=1e-9, atol=1e-9)


def test_documents_reach_an_attention_its_model_gives_no_positions() -> None:
    """The Granite-4 hybrid hands position_ids neither to its attention nor to its mask: the preparation's probe
    finds that layer and relays a direct packed call's documents to it (cu_seq_lens_q too); the SP-1 plan carries
    them anyway. Each is exact against the documents alone."""
    model = _model("granitemoehybrid")
    assert hf_hsap.prepare_model(model).check.no_positions_layers == ("GraniteMoeHybridAttention",)
    ids, pos = _row(model.config.vocab_size)
    cu = torch.tensor([0, *torch.tensor(LENS).cumsum(0).tolist()], dtype=torch.int32)
    with torch.no_grad():
        alone = torch.cat([model(input_ids=d).logits for d in ids.split(LENS, dim=1)], 1)
        for packed in (model(input_ids=ids, position_ids=pos),
                       model(input_ids=ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(LENS),
                             max_length_k=max(LENS)),
                       model(**hf_hsap.shard_batch({"input_ids": ids, "position_ids": pos}, 1))):
            torch.testing.assert_close(packed.logits, alone, rtol=1e-9, atol=1e-9)
