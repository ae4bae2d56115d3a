"""Kernels against a float64 dense reference: varlen segments with bottom-right causal masks.

The reference is dense float64 attention with autograd (``reference_varlen_attention``, independent of
every kernel): out, lse, dq, dk and dv.
Segment shapes cover ``Lq == Lk``, ``Lq < Lk`` (a chunk's queries against earlier keys), ``Lq > Lk``
(queries that see nothing), full attention and empty segments, with lengths beyond the CPU kernel's
diagonal block so that its halving of causal squares is exercised.
"""
from __future__ import annotations

import pytest
import torch

from hf_hsap.kernels import MathKernel, TorchCPUFlashKernel, VarlenSpec, reference_varlen_attention
from hf_hsap.kernels.cpu import _calls
from hf_hsap.testing import check_kernel_against_reference

SEGMENTS = [(37, 37), (300, 300), (65, 200), (200, 65), (1, 9), (9, 1), (0, 5), (5, 0), (129, 129), (128, 257)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel,dtype,tol", [
    (TorchCPUFlashKernel(block=0, few_heads_block=0), torch.float64, 1e-10),
    (TorchCPUFlashKernel(block=16), torch.float64, 1e-10),
    (TorchCPUFlashKernel(block=16, halve_forward=True), torch.float64, 1e-10),
    (TorchCPUFlashKernel(min_heads=8, few_heads_block=32, halve_forward=True), torch.float64, 1e-10),
    (TorchCPUFlashKernel(), torch.float64, 1e-10),
    (TorchCPUFlashKernel(block=16, halve_forward=True), torch.float32, 2e-5),
    (TorchCPUFlashKernel(block=16, halve_forward=True), torch.bfloat16, 3e-2),
    (MathKernel(), torch.float32, 2e-5),
])
def test_kernel_matches_float64_reference(kernel, dtype, tol, causal) -> None:
    check_kernel_against_reference(kernel, dtype, SEGMENTS, causal, tol)


@pytest.mark.parametrize("lq,lk", [(300, 300), (65, 200), (200, 65), (128, 257), (1, 1), (7, 3)])
@pytest.mark.parametrize("block", [0, 1, 8, 128])
def test_cpu_calls_cover_each_visible_pair_once(lq: int, lk: int, block: int) -> None:
    """The calls of one causal segment cover exactly its visible (query, key) pairs, each once, and
    only squares of at most ``block`` rows carry a causal mask."""
    count = torch.zeros(lq, lk, dtype=torch.int64)
    for ql, qh, kl, kh, causal in _calls(lq, lk, True, block):
        assert 0 <= ql < qh <= lq and 0 <= kl < kh <= lk
        if causal:
            assert qh - ql == kh - kl and (block == 0 or qh - ql <= block)
            count[ql:qh, kl:kh] += torch.ones(qh - ql, kh - kl, dtype=torch.int64).tril()
        else:
            count[ql:qh, kl:kh] += 1
    want = (torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + (lk - lq)).long()
    assert torch.equal(count, want)


def test_varlen_reference_agrees_with_the_document_reference() -> None:
    """Square causal segments: the general varlen reference equals ``reference_attention``."""
    from hf_hsap.kernels import reference_attention

    g = torch.Generator().manual_seed(3)
    lens = [5, 1, 40, 17]
    q = torch.randn(sum(lens), 4, 8, generator=g)
    k, v = (torch.randn(sum(lens), 2, 8, generator=g) for _ in range(2))
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    a_out, a_lse = reference_varlen_attention(q, k, v, VarlenSpec.from_lengths(lens, lens, True), 0.4)
    b_out, b_lse = reference_attention(q, k, v, cu, 0.4)
    assert torch.allclose(a_out, b_out, rtol=0, atol=1e-12) and torch.allclose(a_lse, b_lse, rtol=0, atol=1e-12)
