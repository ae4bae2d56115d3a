"""The heads all-to-all mode of the recurrent kernels (``hf_hsap.mixers.heads.run_heads``): for each kernel of
``hf_hsap.mixers.ops.OPS``, run on every rank's tokens of a planned packed row (a document over every rank, documents
shorter than the convolution's kernel), the output and the gradients of every input and parameter equal the kernel's
document-cut op over the whole row in one process, in float64 (and float32), at SP 2 and 4, contiguous and zigzag
placements; and the bytes each rank sends equal ``heads_bytes``."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import hf_hsap
from hf_hsap.mixers.heads import HeadsRoute, heads_bytes, heads_fit, heads_route, run_heads
from workers import heads as W

TIMEOUT_S = 120
# float64: both runs are Transformers' own torch kernels kept in float64 (workers.zoo.float64_casts_kept) on the same
# documents; the heads mode changes only which heads a process computes and the order of the row's tokens, so they
# agree to float64 rounding. float32 (and "mixed": dt in float64, the rest float32), the kernels computing in float32
# as in training: the same sums taken in another order (a batch of fewer heads, the parameters' gradients summed over
# the ranks), so float32 rounding: a bound of about 100 ulps
TOL = {"float64": 1e-12, "float32": 1e-5, "mixed": 1e-5}
RUNS = (("contiguous", "float64"), ("zigzag", "float64"), ("zigzag", "float32"))  # (placement, dtype)
KERNELS = ("chunk_gated_delta_rule", "chunk_kda", "mamba_chunk_scan_combined", "selective_scan_fn",
           "causal_conv1d_fn")


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kernel", KERNELS)
def test_heads_mode_matches_one_process(pools, kernel: str, world: int) -> None:
    # a dt in float64 beside float32 tensors: one all-to-all per dtype
    mixed = (("zigzag", "mixed"),) if kernel in ("mamba_chunk_scan_combined", "selective_scan_fn") else ()
    for placement, dtype in RUNS + mixed:
        results = pools(world, TIMEOUT_S).run(W.heads_errors, kernel, placement, dtype)
        if placement == "contiguous":
            assert results[0]["spans"] == world  # the long document lies on every rank
        for res in results:
            assert res["fit"], res
            assert res["out"] < TOL[dtype], (placement, dtype, res)
            assert max(res["grads"].values()) < TOL[dtype], (placement, dtype, res)
            assert res["sent"] == res["expected"] and res["sent"][0] > 0 and res["sent"][1] > 0, (placement, res)


def _mamba2_call(heads: int, groups: int) -> tuple[tuple, dict]:
    x = torch.zeros(1, 5, heads, 2)
    B = torch.zeros(1, 5, groups, 3)
    return (x, torch.zeros(1, 5, heads), torch.zeros(heads), B, B.clone()), {"chunk_size": 4, "D": torch.zeros(heads)}


def test_heads_fit_and_bytes() -> None:
    args, kwargs = _mamba2_call(heads=6, groups=3)
    assert heads_fit("mamba_chunk_scan_combined", args, kwargs, 2)  # groups replicated, heads split
    assert heads_fit("mamba_chunk_scan_combined", args, kwargs, 3)
    assert not heads_fit("mamba_chunk_scan_combined", args, kwargs, 4)
    conv = (torch.zeros(1, 6, 5), torch.zeros(6, 4), None)
    assert heads_fit("causal_conv1d_fn", conv, {}, 3) and not heads_fit("causal_conv1d_fn", conv, {}, 4)
    # SP 2, 5 local of 12 tokens, float32, 3 groups (not split): x 12, dt 6 elements a token split; B, C 9 whole
    sent = heads_bytes("mamba_chunk_scan_combined", args, kwargs, (5, 7), 0)
    forward = 5 * 1 * (12 // 2 + 6 // 2 + 9 + 9) * 4 + 7 * (12 // 2) * 4
    assert sent == (forward, 5 * 1 * (12 // 2) * 4)  # no input requires a gradient: only the output's goes back
    # dt in float64 and requiring a gradient: its own all-to-all, whose gradient goes back
    args = (args[0], args[1].double().requires_grad_(), *args[2:])
    sent = heads_bytes("mamba_chunk_scan_combined", args, kwargs, (5, 7), 0)
    forward = 5 * 1 * (12 // 2 + 9 + 9) * 4 + 5 * 1 * (6 // 2) * 8 + 7 * (12 // 2) * 4
    assert sent == (forward, 7 * (6 // 2) * 8 + 5 * 1 * (12 // 2) * 4)


def test_heads_mode_refusals() -> None:
    q = torch.zeros(2, 5, 4, 3)
    with pytest.raises(ValueError, match="one packed row"):
        heads_fit("chunk_gated_delta_rule", (q, q, q), {"g": q[..., 0], "beta": q[..., 0]}, 2)
    q1 = q[:1]
    with pytest.raises(ValueError, match="use_cache=False"):
        heads_fit("chunk_gated_delta_rule", (q1, q1, q1), {"g": q1[..., 0], "beta": q1[..., 0],
                                                           "output_final_state": True}, 2)
    with pytest.raises(ValueError, match="use_cache=False"):
        heads_fit("chunk_kda", (q1, q1, q1), {"g": q1, "beta": q1[..., 0], "initial_state": torch.ones(1, 4, 3, 3)}, 2)
    assert heads_fit("chunk_kda", (q1, q1, q1), {"g": q1, "beta": q1[..., 0], "initial_state": None,
                                                 "output_final_state": False}, 2)
    with pytest.raises(ValueError, match="does not place"):
        heads_fit("chunk_kda", (q1, q1, q1), {"g": q1, "beta": q1[..., 0], "A_log": torch.zeros(4)}, 2)
    with pytest.raises(ValueError, match="no shard spec"):
        heads_fit("fused_recurrent_kda", (q1,), {}, 2)
    route = SimpleNamespace(size=3)
    with pytest.raises(ValueError, match="not a multiple of 3"):
        run_heads("chunk_gated_delta_rule", None, None, (q1, q1, q1), {"g": q1[..., 0], "beta": q1[..., 0]},
                  route=route)


def test_heads_route() -> None:
    plan = hf_hsap.plan_sequence([0, 5, 12], 2, placement="contiguous")
    route = heads_route(plan, SimpleNamespace(size=2, rank=1, group=None, comm_stats=None))
    tokens = torch.cat([plan.local_token_indices(0), plan.local_token_indices(1)])
    assert route.token_counts == (plan.num_local_tokens(0), plan.num_local_tokens(1)) and route.rank == 1
    assert torch.equal(tokens[route.order], torch.arange(12)) and torch.equal(route.source, tokens)
    with pytest.raises(ValueError, match="not this SP group"):
        heads_route(plan, SimpleNamespace(size=4, rank=1, group=None, comm_stats=None))
    with pytest.raises(ValueError, match="once each"):
        HeadsRoute.of([torch.arange(0, 6), torch.arange(5, 12)], [0, 5, 12], group=None, rank=0)
