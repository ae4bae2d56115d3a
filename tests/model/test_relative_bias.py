"""Inkling 2's per-query relative position bias under ``attn_implementation="hsap"``
(``hf_hsap.integrations.relative_bias``): the torch attention against a dense float64 reference of the whole packed
row (output, lse and every gradient: q, k, v, the bias table, the sinks) at SP 1 and split over 2 gloo ranks; the
bias module's table is the model's own dense bias; Inkling (v1) stays refused, naming why."""
from __future__ import annotations

import pytest
import torch

from hf_hsap.integrations import UnsupportedModelError
from hf_hsap.integrations.model_check import check_config
from hf_hsap.integrations.relative_bias import RelativeLogits, biased_attention, prepare_relative_bias
from hf_hsap.model_state import ModelChanges
from hf_hsap.testing import rel_err
from workers import relative_bias as W
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


def test_the_table_is_the_models_own_bias() -> None:
    config = ZC.tiny_config("inkling2_text")
    config._attn_implementation = "hsap"
    model = ZC.build_model(config, "eager", torch.float64, draw=torch.float64)
    bias = next(m for m in model.modules() if type(m).__name__.endswith("RelativePositionBias"))
    hidden = torch.randn(1, 9, config.hidden_size, dtype=torch.float64)
    positions = torch.arange(9)[None]
    dist = positions[0, :, None] - positions[0, None, :]
    dense = bias(hidden, dist, positions)  # [1, H, 9, 9], the model's own
    changes = ModelChanges()
    model.config._attn_implementation = "hsap"
    assert prepare_relative_bias(model, changes) > 0
    table = bias(hidden, dist, positions)
    assert isinstance(table, RelativeLogits) and table.extent == bias.rel_extent
    near = (dist >= 0) & (dist < table.extent)
    got = table.logits.gather(-1, dist.clamp(0, table.extent - 1).expand_as(dense)).masked_fill(~near, 0.0)
    assert torch.equal(got, dense)
    model.config._attn_implementation = "eager"  # another implementation: the model's own dense bias
    assert torch.equal(bias(hidden, dist, positions), dense)
    changes.undo()
    assert "forward" not in bias.__dict__


def test_inkling_v1_is_refused_naming_its_row_index_positions() -> None:
    with pytest.raises(UnsupportedModelError, match=r"torch\.arange.*not position_ids"):
        check_config(ZC.tiny_config("inkling_text"), packed=True)
