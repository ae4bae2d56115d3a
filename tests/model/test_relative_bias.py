"""Inkling 2's per-query relative position bias under ``attn_implementation="hsap"``
(``hf_hsap.integrations.relative_bias``): the torch attention against a dense float64 reference of the whole packed
row (output, lse and every gradient: q, k, v, the bias table, the sinks) at SP 1 and split over 2 gloo ranks; the
bias module's table is the model's own dense bias; Inkling's row-index log scale becomes each token's document
position's on a packed row."""
from __future__ import annotations

import pytest
import torch

from hf_hsap.integrations import relative_bias as RB
from hf_hsap.integrations.biased_attention import biased_attention
from hf_hsap.integrations.relative_bias import prepare_relative_bias
from hf_hsap.model_state import RELATIVE_BIAS, ModelChanges, state_of
from hf_hsap.testing import rel_err
from workers import relative_bias as W
from workers import zoo
from workers import zoo_configs as ZC

CU = [0, 7, 19, 24]  # documents longer and shorter than the bias extent (4) and the window (5)
TOL = 1e-12


@pytest.mark.parametrize("window,sinks", [(None, True), (5, False)])
def test_biased_attention_matches_the_dense_reference(window: int | None, sinks: bool) -> None:
    x = W.draw(CU, seed=1, sinks=sinks)
    scale = W.D ** -0.5
    ref_in = {k: t.clone().requires_grad_(True) for k, t in x.items() if k != "dout"}
    ref, ref_lse = W.dense_reference(ref_in, CU, scale, window)
    (ref * x["dout"]).sum().backward()
    got_in = {k: t.clone().requires_grad_(True) for k, t in x.items() if k != "dout"}
    doc = torch.repeat_interleave(torch.arange(3), torch.diff(torch.tensor(CU)))
    pos = torch.arange(CU[-1]) - torch.tensor(CU)[doc]
    out, lse = biased_attention(got_in["q"], got_in["k"], got_in["v"], got_in["table"], q_doc=doc, q_pos=pos,
                                k_doc=doc, k_pos=pos, scale=scale, window=window, sinks=got_in.get("sinks"),
                                chunk=5)  # query blocks that cut documents
    (out * x["dout"]).sum().backward()
    assert rel_err(out, ref) <= TOL and rel_err(lse, ref_lse) <= TOL
    for k in got_in:
        assert got_in[k].grad is not None and got_in[k].grad.abs().max() > 0, k
        assert rel_err(got_in[k].grad, ref_in[k].grad) <= TOL, k
    # the bias matters: without it the output differs
    plain, _ = biased_attention(x["q"], x["k"], x["v"], torch.zeros_like(x["table"]), q_doc=doc, q_pos=pos,
                                k_doc=doc, k_pos=pos, scale=scale, window=window, sinks=x.get("sinks"))
    assert rel_err(plain, ref) > 1e-3


@pytest.mark.parametrize("ulysses", [1, 2])
def test_split_over_two_ranks_matches_the_dense_reference(pools, ulysses: int) -> None:
    cu = [0, 5, 23, 30]  # the 18-token document spans both ranks
    records = pools(2, 120).run(W.sp_check, cu, ulysses, None, True, 2)
    assert any(1 in r["docs"] for r in records) and all(1 in r["docs"] for r in records)
    for r in records:
        for name in ("out", "dq", "dk", "dv", "dtable", "dsinks"):
            assert r[name] <= TOL, (name, r)


@pytest.mark.parametrize("family", ["inkling2_text", "inkling_text"])
def test_the_table_is_the_models_own_bias(family: str) -> None:
    config = ZC.tiny_config(family)
    model = ZC.build_model(config, "eager", torch.float64, draw=torch.float64)
    layer = next(m for m in model.modules() if hasattr(m, "rel_extent") and hasattr(m, "config"))
    bias = next(c for c in layer.children() if hasattr(c, "proj"))
    n = 9
    positions = torch.arange(n)
    dist = positions[:, None] - positions[None, :]
    if family == "inkling2_text":  # (hidden_states, relative_distance, position_ids)
        args = (torch.randn(1, n, config.hidden_size, dtype=torch.float64), dist, positions[None])
    else:  # (relative_states [B, L, H, d_rel], query_positions, key_positions)
        args = (torch.randn(1, n, layer.num_heads, config.d_rel, dtype=torch.float64), positions, positions)
    dense = bias(*args)  # [1, H, n, n], the model's own
    changes = ModelChanges()
    model.config._attn_implementation = "hsap"
    assert prepare_relative_bias(model, changes) > 0 and state_of(layer, RELATIVE_BIAS) == bias.rel_extent
    table = bias(*args)
    assert table.shape == (*dense.shape[:3], bias.rel_extent)
    near = (dist >= 0) & (dist < bias.rel_extent)
    got = table.gather(-1, dist.clamp(0, bias.rel_extent - 1).expand_as(dense)).masked_fill(~near, 0.0)
    assert torch.equal(got, dense)
    model.config._attn_implementation = "eager"  # another implementation: the model's own dense bias
    assert torch.equal(bias(*args), dense)
    changes.undo()
    assert "forward" not in bias.__dict__ and state_of(layer, RELATIVE_BIAS) is None


def test_inkling_log_scale_follows_the_document_position(monkeypatch) -> None:
    """Inkling scales its full layers' queries and bias by the row index (``log_scaling_n_floor`` 4 here): on the
    zoo's packed row hf_hsap rescales them to each token's document position; without that it is not exact."""
    config = ZC.tiny_config("inkling_text")
    assert config.log_scaling_n_floor == 4
    model = ZC.build_model(config, "eager", torch.float64, draw=torch.float64)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with zoo.full_precision(config, torch.float64):
        ref = zoo.reference(config, state)
        run = zoo.packed_run(config, state, "hsap", torch.float64, via_shard=True)
        assert zoo.compare(ref, run["logits"], run["loss"], run["grads"], zoo.TOL["fp64"])["outcome"] == "exact"
        monkeypatch.setattr(RB, "_row_scaled", lambda module: False)
        off = zoo.packed_run(config, state, "hsap", torch.float64, via_shard=True)
    assert zoo.compare(ref, off["logits"], off["loss"], off["grads"], zoo.TOL["fp64"])["outcome"] == "WRONG"


def test_an_unprepared_bias_layer_is_refused_naming_prepare_model() -> None:
    config = ZC.tiny_config("inkling2_text")
    model = ZC.build_model(config, "hsap", torch.float64, draw=torch.float64)
    with pytest.raises(ValueError, match=r"prepare_model"):
        model(input_ids=torch.tensor([[3, 4, 5, 6]]))
