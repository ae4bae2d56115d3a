"""Indexed-attention layers that build their attention mask themselves, and Qwen4-Exp's per-layer n-gram embeddings
(``hf_hsap.integrations.indexed_masks``, ``hf_hsap.mixers.ple``).

A tiny Qwen4-Exp (gated delta rule layers; a QSA layer whose indexer returns a selection mask, 2 blocks of 4 keys and
the incomplete tail per query; PLE on two layers: a hashed n-gram embedding of each token's previous ids and a dilated
causal convolution) on the zoo's row of five documents (7, 30, 1, 19 and 15 tokens), against each document run alone
with Transformers' eager attention, in float64: logits and every parameter gradient, at SP 1 and at SP 2 (the 30-token
document split across both ranks). GLM-5-Next (KDA layers; pools of 4 keys, the best 2 and the incomplete tail turned
into a mask by the layer, and a layer reusing that top-k) has no text-only causal LM: it runs through the multimodal
zoo's harness at SP 1 and 2."""
from __future__ import annotations

import pytest
import torch
from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextAttention
from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextAttention

from hf_hsap.integrations.indexed_layers import (KIND_INDICES, KIND_SELECT_MASK, KIND_TOPK_MASK, indexed_kind,
                                                 other_indexed_layers)
from hf_hsap.integrations.indexed_masks import check_padding
from hf_hsap.mixers import ple
from workers import indexed_masks as W
from workers import vlm_zoo_run
from workers import zoo
from workers import zoo_configs as ZC

TIMEOUT_S = 300


def test_kinds_of_indexed_layers() -> None:
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Attention

    assert indexed_kind(DeepseekV32Attention) == KIND_INDICES
    assert indexed_kind(Glm5NextTextAttention) == KIND_TOPK_MASK
    assert indexed_kind(Qwen4ExpTextAttention) == KIND_SELECT_MASK

    class OwnSelection(torch.nn.Module):  # selects keys some other way: refused by the model check
        def __init__(self) -> None:
            super().__init__()
            self.config, self.layer_idx, self.indexer = type("C", (), {"layer_types": ["indexed_attention"]})(), 0, None

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return hidden_states

    assert indexed_kind(OwnSelection) is None and other_indexed_layers(OwnSelection()) == ["OwnSelection"]


def test_own_mask_layers_refuse_other_masks_and_split_padding() -> None:
    layer = torch.nn.Linear(1, 1)
    check_padding(layer, torch.ones(1, 6, dtype=torch.bool), None, fix="FIX")  # a padding mask: fine
    with pytest.raises(ValueError, match="bool padding mask; FIX"):
        check_padding(layer, torch.zeros(1, 1, 6, 6), None, fix="FIX")
    pad = torch.tensor([[True] * 4 + [False] * 2])
    check_padding(layer, pad, type("Plan", (), {"size": 1})(), fix="FIX")  # one rank: each document's padding cut
    with pytest.raises(ValueError, match="padding inside a row split over ranks"):
        check_padding(layer, pad, type("Plan", (), {"size": 2})(), fix="FIX")


def test_packed_row_is_exact_at_sp1(monkeypatch: pytest.MonkeyPatch) -> None:
    config, state = W.tiny_state()
    with zoo.full_precision(config, torch.float64):
        ref = zoo.reference(config, state)
        for via_shard in (False, True):
            run = zoo.packed_run(config, state, "hsap", torch.float64, via_shard=via_shard)
            res = zoo.compare(ref, run["logits"], run["loss"], run["grads"], zoo.TOL["fp64"])
            assert res["outcome"] == "exact", (via_shard, res)
        # each PLE part matters: without its document cut, the row's earlier documents leak into the next one
        for cls in list(ple.METHOD_OPS):
            with monkeypatch.context() as m:
                m.delitem(ple.METHOD_OPS, cls)
                run = zoo.packed_run(config, state, "hsap", torch.float64)
            res = zoo.compare(ref, run["logits"], run["loss"], run["grads"], zoo.TOL["fp64"])
            assert res["outcome"] == "WRONG" and res["err"]["logits"] > 1e-6, (cls, res)


@pytest.mark.parametrize("ulysses,checkpointing", [(1, False), (2, True)])
def test_document_split_over_two_ranks_is_exact(pools, ulysses: int, checkpointing: bool) -> None:
    config, state = W.tiny_state()
    with zoo.full_precision(config, torch.float64):
        ref = zoo.reference(config, state)
    records = pools(2, TIMEOUT_S).run(W.sp_run, state, 2, ulysses, checkpointing)
    res = zoo.combine_sp(ref, [{"ok": True, **r} for r in records], 2, zoo.TOL["fp64"])
    assert res["outcome"] == "exact", res
    starts = torch.tensor([0, 7, 37, 38, 57, 72])
    split = [d for d in range(5) if all(((r["index"] >= starts[d]) & (r["index"] < starts[d + 1])).any()
                                        for r in records)]
    assert split, "no document spans both ranks"


@pytest.fixture(scope="module")
def vlm_pools(pools):
    """The multimodal harness's pool manager over the session's pool of 2 ranks."""
    manager = vlm_zoo_run.PoolManager(world=2, pools=pools)
    yield manager
    manager.close()


@pytest.mark.slow  # through the VLM harness (CI runs the slow half too)
def test_glm5_next_is_exact_at_sp1_and_sp2(vlm_pools) -> None:
    rec = vlm_zoo_run.run_family("glm5_next", vlm_pools, modes=("sp1", "sp2_u2"))
    assert rec["status"] == "run" and rec["spec"] == {"outcome": "accepted"}, rec.get("spec")
    for mode, res in rec["results"].items():
        assert res["outcome"] == "exact", (mode, res)
    assert rec["native"]["outcome"] == "WRONG"  # Transformers alone on the packed row mixes the documents
