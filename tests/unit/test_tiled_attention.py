"""Tiled attention (:mod:`hf_hsap.kernels.tiled`, the ``tiled_attention`` lever) against the float64 dense reference:
out, lse, dq, dk, dv of packed rows whose documents cross tile boundaries, GQA, tiles smaller and larger than the
documents, ``Lq != Lk``, causal windows, soft-capping, sinks through ``varlen_attention``; and its plan pair by pair
(each visible pair in exactly one backward call, in its tile's forward call; no hidden pair in any)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import TOL, rel_err
from hf_hsap.kernels import (MathKernel, TiledKernel, TorchCPUFlashKernel, VarlenSpec, reference_varlen_attention,
                             varlen_attention)
from hf_hsap.kernels.tiled import plan_tiles

FTOL = {torch.float64: TOL["float64"], torch.float32: 1e-4}
ROWS = {  # (q lengths, k lengths): packed rows
    "docs": ([13, 1, 30, 7, 21], [13, 1, 30, 7, 21]),  # documents crossing tiles, one of a single token
    "one-doc": ([64], [64]),
    "lq<lk": ([5, 9, 12], [20, 9, 31]),  # a KV cache before each document's queries
    "lq>lk": ([9, 12], [4, 12]),  # the first queries see nothing
}


def _visible(spec: VarlenSpec) -> set[tuple[int, int]]:
    """Every (query row, key row) pair the spec's mask shows (bottom-right aligned)."""
    pairs, w = set(), spec.window_left
    for qa, qb, ka, kb in spec.segments():
        off = (kb - ka) - (qb - qa)
        for i in range(qb - qa):
            for j in range(kb - ka):
                if (not spec.causal or j <= i + off) and (w is None or j >= i + off - w):
                    pairs.add((qa + i, ka + j))
    return pairs


def _call_pairs(call) -> list[tuple[int, int]]:
    """The pairs one call's mask shows, in the whole call's rows."""
    sub = call.spec()
    out = []
    for (qa, _, ka, _), (sqa, sqb, ska, skb) in zip(call.pieces, sub.segments()):
        part = VarlenSpec((0, sqb - sqa), (0, skb - ska), sub.causal, sub.window_left)
        out += [(qa + i, ka + j) for i, j in _visible(part)]
    return out


@settings(max_examples=150, deadline=None)
@given(lens=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=4),
       causal=st.booleans(), w=st.one_of(st.none(), st.integers(0, 9)), tile=st.integers(1, 17))
def test_plan_covers_each_visible_pair_once(lens, causal: bool, w: int | None, tile: int) -> None:
    if w is not None and not causal:
        w = None  # refused: see test_refuses_a_bidirectional_window
    spec = VarlenSpec.from_lengths([a for a, _ in lens], [b for _, b in lens], causal, w)
    want = _visible(spec)
    back: list[tuple[int, int]] = []
    for plan in plan_tiles(spec, tile):
        assert plan.q_hi - plan.q_lo <= tile
        fwd = _call_pairs(plan.forward) if plan.forward else []
        assert len(fwd) == len(set(fwd)) and set(fwd) == {p for p in want if plan.q_lo <= p[0] < plan.q_hi}
        for call in plan.backward:
            assert all(d - c <= tile + (w or 0) for _, _, c, d in call.pieces)  # at most a tile (and the window)
            back += _call_pairs(call)
    assert len(back) == len(set(back)) and set(back) == want


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    """:func:`rel_err`, or the absolute error where the reference is ~0 (dq under a window of 0)."""
    if want.numel() and want.abs().max().item() < 1e-3:
        return (got.double() - want.double()).abs().max().item()
    return rel_err(got, want)


def _check(kernel, dtype, q_lens, k_lens, *, causal=True, w=None, softcap=None, heads=(4, 2, 8)) -> None:
    spec = VarlenSpec.from_lengths(q_lens, k_lens, causal, w)
    g = torch.Generator().manual_seed(3)
    hq, hkv, d = heads
    q, dout = (torch.randn(spec.total_q, hq, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(spec.total_k, hkv, d, generator=g, dtype=torch.float64) for _ in range(2))
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    ref_out, ref_lse = reference_varlen_attention(qr, kr, vr, spec, 0.6, softcap=softcap)
    ref = torch.autograd.grad(ref_out, (qr, kr, vr), dout)
    q, k, v, dout = (x.to(dtype) for x in (q, k, v, dout))
    out, lse = kernel.forward(q, k, v, spec, 0.6, softcap=softcap)
    grads = kernel.backward(dout, q, k, v, out, lse, spec=spec, scale=0.6, softcap=softcap)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen) and not bool(out[~seen].abs().any())
    assert rel_err(lse[seen], ref_lse[seen]) < FTOL[dtype]
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref_out, *ref)):
        assert got.dtype == dtype and got.shape == want.shape, name
        assert _err(got, want) < FTOL[dtype], f"{name}: {_err(got, want):.2e}"


@pytest.mark.parametrize("row", list(ROWS))
@pytest.mark.parametrize("tile", [1, 5, 16, 100])  # smaller than most documents ... larger than the row
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_tiled_kernel_matches_the_reference(row: str, tile: int, dtype: torch.dtype) -> None:
    q_lens, k_lens = ROWS[row]
    _check(TiledKernel(TorchCPUFlashKernel(), tile), dtype, q_lens, k_lens)


@pytest.mark.parametrize("causal,w,softcap", [(True, 3, None), (True, 0, None), (False, None, None),
                                              (True, None, 5.0), (True, 6, 5.0)],
                         ids=["window", "window0", "bidirectional", "softcap", "window+softcap"])
@pytest.mark.parametrize("inner", [TorchCPUFlashKernel(), MathKernel()], ids=["cpu", "math"])
def test_tiled_kernel_variants_match_the_reference(causal: bool, w, softcap, inner) -> None:
    for q_lens, k_lens in (ROWS["docs"], ROWS["lq<lk"]):
        _check(TiledKernel(inner, 6), torch.float64, q_lens, k_lens, causal=causal, w=w, softcap=softcap,
               heads=(6, 2, 8))


def test_varlen_attention_tiles_with_sinks() -> None:
    """Through ``varlen_attention``'s autograd (sinks applied to the final out / lse): output and every gradient
    equal to the untiled call's."""
    g = torch.Generator().manual_seed(0)
    cu = [0, 11, 12, 40]
    q, k, v = (torch.randn(40, h, 8, generator=g, dtype=torch.float64, requires_grad=True) for h in (4, 2, 2))
    sinks = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(40, 4, 8, generator=g, dtype=torch.float64)
    res = []
    for tile in (None, 7):
        out = varlen_attention(q, k, v, cu, sinks=sinks, tile_tokens=tile)
        res.append((out, *torch.autograd.grad(out, (q, k, v, sinks), dout)))
    for a, b in zip(*res):
        assert rel_err(a, b) < FTOL[torch.float64]


def test_refuses_a_bidirectional_window() -> None:
    q = torch.randn(8, 2, 4)
    with pytest.raises(ValueError, match="tiled_attention off"):
        varlen_attention(q, q, q, [0, 8], causal=False, window=3, tile_tokens=4)
    with pytest.raises(ValueError, match="tile_tokens"):
        TiledKernel(MathKernel(), 0)
