"""A rank's runs of one recurrent kernel go through as few kernel calls as padding allows
(``hf_hsap.mixers.calls.buckets``): runs of similar lengths share one call, padded with zeros where the kernel's state
stays put (after the tokens for the delta rule and the convolution, before them for the scans); outputs and every
input gradient equal one call per document, in float64, for Transformers' torch kernels."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_hsap.mixers.calls import buckets
from hf_hsap.mixers.ops import OPS
from hf_hsap.plan.chain import document_chain
from workers.heads import kernel_case
from workers.zoo import float64_casts_kept

LENS = [20, 17, 18, 16, 3, 1]  # four runs in one call, the two short ones in a call each
KERNELS = ["chunk_gated_delta_rule", "chunk_kda", "mamba_chunk_scan_combined", "selective_scan_fn", "causal_conv1d_fn"]


def test_buckets_bound_the_padding_and_cover_every_run() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        lens = rng.integers(1, 50, size=rng.integers(1, 12)).tolist()
        calls = buckets(lens)
        assert sorted(i for c in calls for i in c) == list(range(len(lens)))
        for c in calls:
            assert len(c) == 1 or len(c) * max(lens[i] for i in c) <= 1.25 * sum(lens[i] for i in c)
    assert buckets(LENS) == [[0, 2, 1, 3], [4], [5]]


@pytest.mark.parametrize("kernel", KERNELS)
def test_batched_runs_equal_one_call_per_document(kernel: str) -> None:
    cu = np.concatenate([[0], np.cumsum(LENS)])
    with float64_casts_kept():
        case = kernel_case(kernel, int(cu[-1]), torch.float64)
        leaves = {n: t.detach().clone().requires_grad_() for n, (t, _) in case.tensors.items()}
        calls = []

        def counted(*args, **kwargs):
            calls.append(1)
            return case.orig(*args, **kwargs)

        args, kwargs = case.call(leaves)
        out = OPS[kernel](counted, args, kwargs, document_chain(cu), None)
        out = out[0] if isinstance(out, tuple) else out
        assert len(calls) == 3  # the buckets, not one call per document
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
        grads = torch.autograd.grad((out * w).sum(), list(leaves.values()))

        ref_leaves = {n: t.detach().clone().requires_grad_() for n, t in leaves.items()}
        pieces = []
        for a, b in zip(cu[:-1], cu[1:]):
            doc = {n: (t if case.tensors[n][1] is None else t.narrow(case.tensors[n][1], int(a), int(b - a)))
                   for n, t in ref_leaves.items()}
            d_args, d_kwargs = case.call(doc)
            y = case.orig(*d_args, **d_kwargs)
            pieces.append(y[0] if isinstance(y, tuple) else y)
        ref = torch.cat(pieces, dim=case.out_dim)
        ref_grads = torch.autograd.grad((ref * w).sum(), list(ref_leaves.values()))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for name, g, r in zip(leaves, grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12, msg=name)
