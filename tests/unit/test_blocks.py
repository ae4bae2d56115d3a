"""Bidirectional blocks (Gemma 3's images) in causal documents: the mask rule, the placement that keeps every
block inside one part, and the kernel-level result against a dense float64 reference."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import hf_hsap
from hf_hsap.plan.blocks import Blocks, blocks_from_mask, keep_blocks_whole
from hf_hsap.plan.planner import plan_sequence as plan_offline


def test_blocks_are_runs_inside_documents() -> None:
    flag = torch.tensor([0, 1, 1, 1, 0, 1, 0, 1, 1, 1, 1], dtype=torch.bool)
    # documents [0, 9) and [9, 11): the run 7..10 is cut at the document start 9; one-token runs are dropped
    blocks = blocks_from_mask(flag, torch.tensor([0, 9, 11]))
    assert blocks == Blocks((1, 7, 9), (4, 9, 11))


def test_prefix_blocks_are_each_documents_type0_run() -> None:
    from hf_hsap.multimodal.shard import prefix_blocks

    # PaliGemma's token types: 0 = image and prompt (one bidirectional group per document), 1 = causal suffix
    types = torch.tensor([[0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]])
    assert prefix_blocks(types, torch.tensor([0, 5, 8, 12])) == Blocks((0, 5), (3, 7))  # [8] is one token
    with pytest.raises(ValueError, match="document 1 .* 2 separate runs"):  # 0 1 0: the suffix would see a prefix
        prefix_blocks(torch.tensor([[0, 0, 1, 0, 1, 0]]), torch.tensor([0, 2, 6]))


def _dense_reference(q, k, v, cu, blocks: Blocks, scale: float) -> torch.Tensor:
    """Softmax attention with the mask ``same document AND (causal OR same block)``, float64, dense."""
    n = q.shape[0]
    doc = torch.bucketize(torch.arange(n), torch.tensor(cu[1:]), right=True)
    blk = torch.full((n,), -1)
    for b, (s, e) in enumerate(zip(blocks.starts, blocks.ends)):
        blk[s:e] = b
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    mask = (doc[:, None] == doc[None, :]) & ((j <= i) | ((blk[:, None] == blk[None, :]) & (blk[:, None] >= 0)))
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("qhd,khd->hqk", q, kk) * scale
    p = s.masked_fill(~mask, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", p, vv)


def test_sp1_blocks_match_dense_reference_and_matter() -> None:
    cu = [0, 12, 20, 31]
    blocks = Blocks((2, 13, 25), (7, 17, 31))
    g = torch.Generator().manual_seed(0)
    q = torch.randn(31, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(31, 2, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(31, 2, 8, generator=g, dtype=torch.float64, requires_grad=True)
    plan = hf_hsap.plan_sequence(torch.tensor(cu), 1)
    out = hf_hsap.hsap_attn_func(q, k, v, plan, blocks=blocks)
    ref = _dense_reference(q, k, v, cu, blocks, 8 ** -0.5)
    assert float((out - ref).detach().abs().max()) < 1e-12
    w = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        assert float((a - b).abs().max()) < 1e-12
    causal = hf_hsap.hsap_attn_func(q, k, v, plan)  # the blocks change the result: the test can fail
    assert float((causal - ref).detach().abs().max()) > 1e-3


@pytest.mark.parametrize("placement", ["contiguous", "zigzag", "balanced", "auto"])
def test_keep_blocks_whole_moves_cuts_out_of_blocks(placement: str) -> None:
    cu = np.array([0, 40, 52, 80])
    blocks = Blocks((5, 18, 44, 60), (14, 30, 50, 76))
    plan = plan_offline(cu, 4, placement)
    whole = keep_blocks_whole(plan, blocks)
    pl = whole.placement
    owner = np.full(80, -1)
    for s, e, p in zip(pl.start, pl.end, pl.part):
        assert (owner[s:e] == -1).all()  # every token in exactly one part
        owner[s:e] = p
    assert (owner >= 0).all()
    for s, e in zip(blocks.starts, blocks.ends):
        assert len(set(owner[s:e].tolist())) == 1, (placement, s, e)
    for p in range(4):  # the parts' local tokens are their global ones in order
        assert np.array_equal(whole.part_token_indices(p), np.flatnonzero(owner == p))
    if placement == "contiguous":  # cuts at 20, 40, 60 fall inside blocks: the plan changed
        assert whole is not plan and pl.name == "contiguous+whole_blocks"
