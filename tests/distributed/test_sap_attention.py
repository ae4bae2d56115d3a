"""SAP attention across spawned gloo ranks equals the float64 single-process reference.

Every case draws fresh random q, k, v, dout, runs hf_hsap.hsap_attn_func forward + backward on every
rank, and compares out, lse, dq, dk, dv of the rank's tokens with the reference. It also checks that
the bytes the executor really received in the forward pass equal the planner's minimum.
"""
import dataclasses

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hf_hsap import CostModel
from helpers import assert_exact, ci_examples, cu_of, rel_err
from workers.sap import check_attention, check_mismatched_layouts, check_one_rank_with_a_bad_layout

PLACEMENTS = ["contiguous", "zigzag", "balanced", "density", "auto"]


lengths_st = st.lists(st.integers(1, 40), min_size=1, max_size=10)
heads_st = st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)])


@pytest.mark.parametrize("world", [2, 3, 4])
@settings(max_examples=ci_examples(12), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=lengths_st, placement=st.sampled_from(PLACEMENTS), heads=heads_st,
       dtype=st.sampled_from(["float64", "float32"]), seed=st.integers(0, 2**31 - 1))
@example(lengths=[1, 1, 1, 1, 1], placement="balanced", heads=(2, 1), dtype="float64", seed=1)  # 1-token docs
@example(lengths=[97], placement="zigzag", heads=(4, 2), dtype="float64", seed=2)  # one doc over every rank
@example(lengths=[3, 61, 2, 1], placement="contiguous", heads=(4, 4), dtype="float64", seed=3)  # doc > shard
@example(lengths=[2, 3, 1, 2, 3, 1, 2], placement="auto", heads=(1, 1), dtype="float32", seed=4)  # short only
@example(lengths=[13, 1, 9], placement="balanced", heads=(4, 1), dtype="float64", seed=5)  # T=23, not divisible
def test_sap_matches_reference(pools, world, lengths, placement, heads, dtype, seed):
    if sum(lengths) < world:
        lengths = lengths + [world]
    hq, hkv = heads
    res = pools(world).run(check_attention, cu_of(lengths), world, 1, placement, hq, hkv, 8, dtype, seed)
    assert_exact(res, dtype)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_every_placement_long_and_short_docs(pools, placement):
    lengths = [1, 70, 5, 1, 33, 2, 120, 7]  # 1-token docs, docs longer than a shard, T=239 (prime)
    res = pools(4).run(check_attention, cu_of(lengths), 4, 1, placement, 4, 2, 16, "float64", 11)
    assert_exact(res, "float64")
    assert any(r["fwd_rows"] > 0 for r in res), "a layout with long documents must move some KV"


NETWORK = dataclasses.asdict(CostModel.for_link("network"))  # the fields of the network-priced model


@pytest.mark.parametrize("lengths,polished", [([161, 34, 165, 197, 137], "balanced+polish"),
                                              ([352, 338, 111, 77, 34], "density+polish"),
                                              ([386, 335, 344, 562], "contiguous+polish"),
                                              ([82, 129, 552], "contiguous-priced"),
                                              ([442, 28], "sliced"),
                                              ([276, 535, 272], "sliced")])
def test_polished_auto_placement_is_exact(pools, lengths, polished):
    """Every refinement of auto's search (plan.auto) stays exact: the local search (local_search.polish moves pieces
    of segments between parts) from each kind of winner, the priced contiguous cuts (plan.cutting) and the sliced
    cuts (plan.slicing: a part holds a range of the long documents and a range of the short ones)."""
    res = pools(4).run(check_attention, cu_of(lengths), 4, 1, "auto", 4, 2, 8, "float64", 17, None, None, None,
                       "auto", None, None, False, True, NETWORK)
    assert_exact(res, "float64")
    assert all(r["placement"] == polished for r in res)


@pytest.mark.parametrize("budget", [1, 7, 40])
def test_receive_budget_rounds(pools, budget):
    lengths = [150, 3, 60, 31]
    res = pools(4).run(check_attention, cu_of(lengths), 4, 1, "zigzag", 2, 1, 8, "float64", 5, budget)
    assert_exact(res, "float64")
    assert res[0]["rounds"] > 1


@pytest.mark.parametrize("grad_comm", [None, "float32"])
def test_bfloat16_grad_return_dtype(pools, grad_comm):
    """bf16 inputs: dK/dV partials travel back in bf16 by default (half the bytes of fp32) and the
    result stays within bf16 round-off of the float64 reference either way."""
    lengths = [150, 3, 60, 31, 9]
    res = pools(3).run(check_attention, cu_of(lengths), 3, 1, "zigzag", 4, 2, 16, "bfloat16", 21, None, None,
                       grad_comm)
    elem = 4 if grad_comm == "float32" else 2
    for r in res:
        for key in ("out", "dq", "dk", "dv"):
            assert r[key] <= 2e-2, (key, r)
        assert r["fwd_rows"] == r["plan_recv"]
        # the rows this rank sent come back as dK|dV: [rows, 2*Hkv, D] in the return dtype
        assert r["bwd_bytes"] == r["plan_send"] * 2 * 2 * 16 * elem, r
    assert sum(r["plan_send"] for r in res) > 0


@pytest.mark.parametrize("budget", [None, 9])
@pytest.mark.parametrize("placement", ["zigzag", "balanced"])
def test_by_peer_rounds_match_reference(pools, placement, budget):
    """One ring distance per round: still exact, still the minimum bytes; without a budget the KV is
    kept for the backward (only dK/dV come back) and every return is collected at the end."""
    lengths = [150, 3, 60, 31, 1, 47]
    res = pools(4).run(check_attention, cu_of(lengths), 4, 1, placement, 4, 2, 8, "float64", 17, budget, None,
                       None, "by_peer")
    assert_exact(res, "float64")
    assert all(r["round_order"] == "by_peer" for r in res)
    assert res[0]["rounds"] > 1, "a zigzag / balanced layout with long documents needs several peers"
    for r in res:
        if budget is None:  # backward receives exactly the dK/dV of the rows it sent
            assert r["bwd_rows"] == r["plan_send"], r
        else:  # refetch: KV again plus the returns
            assert r["bwd_rows"] == r["plan_recv"] + r["plan_send"], r
            assert r["max_recv_rows"] <= budget, r


def test_world_one_in_process():
    res = check_attention_local(cu_of([5, 1, 17, 9]), "float64")
    assert max(res.values()) <= 1e-9



def test_lse_output_gets_no_zero_gradient(monkeypatch):
    """The lse output is not differentiable: the backward gets None for it (autograd fills no zero [T, Hq] tensor,
    live through the backward at its memory peak) and stays exact; with no output gradient at all it returns
    none."""
    from hf_hsap import attention

    seen = []
    backward = attention._SAPAttention.backward

    def spy(ctx, dout, dlse):
        seen.append(dlse)
        return backward(ctx, dout, dlse)

    monkeypatch.setattr(attention._SAPAttention, "backward", staticmethod(spy))
    res = check_attention_local(cu_of([5, 1, 17, 9]), "float64")
    assert seen == [None]
    assert max(res.values()) <= 1e-9
    assert backward(None, None, None) == (None,) * 5  # q, k, v, sinks and the call

def check_attention_local(cu, dtype):
    import torch

    import hf_hsap
    from hf_hsap.kernels import reference_attention

    g = torch.Generator().manual_seed(7)
    T = cu[-1]
    q, k, v, do = (torch.randn(T, h, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4))
    plan = hf_hsap.plan_sequence(cu, 1)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out, lse = hf_hsap.hsap_attn_func(*leaves, plan, return_lse=True)
    out.backward(do)
    refs = [x.clone().requires_grad_(True) for x in (q, k, v)]
    ref, ref_lse = reference_attention(*refs, cu)
    ref.backward(do)
    errs = {"out": rel_err(out, ref), "lse": float((lse - ref_lse).detach().abs().max())}  # lse: absolute
    for name, a, b in zip("qkv", leaves, refs):
        errs["d" + name] = rel_err(a.grad, b.grad)
    return errs


def test_different_layouts_fail_on_every_rank(pools):
    msgs = pools(3).run(check_mismatched_layouts)
    assert all("different packed batches" in m for m in msgs), msgs


def test_an_invalid_layout_on_one_rank_fails_on_every_rank(pools):
    """The pool's task timeout (60 s here) is far below the group timeout: a rank left waiting would time out."""
    msgs = pools(3, 60.0).run(check_one_rank_with_a_bad_layout)
    assert "different packed batches" in msgs[0] and "different packed batches" in msgs[1], msgs
    assert "cu_seqlens" in msgs[2] and "different packed batches" not in msgs[2], msgs[2]
