"""Sliding windows, soft-capping and attention sinks in the kernels, against float64 dense references.

The references (``reference_varlen_attention`` / ``reference_attention``) build their masks from positions and
apply softcap / sinks as Gemma 2's / GPT-OSS's eager attention do; gradients come from autograd through them.
Covered: MathKernel and the CPU kernel (its op decomposition, forced with ``small_window=0``, halved squares
with small ``block``, and its blocked-math path), float64 and float32, causal and not, ``Lq == Lk``,
``Lq < Lk`` and ``Lq > Lk``, windows from 0 to beyond the segment, GQA, the in-place methods with segments
sharing query rows (merged, ``fresh`` or not), the unchanged op calls of the unwindowed path, and sinks
through ``varlen_attention``.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import TOL, ci_examples, rel_err
from hf_hsap.kernels import (MathKernel, TorchCPUFlashKernel, VarlenSpec, apply_sinks, reference_attention,
                             reference_varlen_attention, sinks_grad, varlen_attention, window_left)
from hf_hsap.kernels import cpu
from hf_hsap.kernels.bands import ANTI, CAUSAL, FULL, band_calls, plain_calls
from hf_hsap.kernels.base import RowsWritten
from hf_hsap.kernels.cuda import TorchCUDAFlashKernel

SHAPES = [(37, 37), (20, 50), (50, 20), (1, 9), (9, 1), (0, 5), (5, 0), (64, 64), (33, 100)]
WINDOWS = [0, 1, 2, 5, 36, 63, 1000]  # 36 = Lk - 1 of (37, 37); 63 of (64, 64); 1000 hides nothing anywhere
KERNELS = {
    "math": MathKernel(),
    "math-blocked": MathKernel(budget=300),  # several query blocks per segment
    "cpu": TorchCPUFlashKernel(),  # narrow causal windows through its blocked math
    "cpu-ops": TorchCPUFlashKernel(small_window=0, block=4, halve_forward=True),  # every window through the op
    "cpu-ops-whole": TorchCPUFlashKernel(small_window=0, block=0, few_heads_block=0),
}
FTOL = {torch.float64: TOL["float64"], torch.float32: 1e-4}


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    """:func:`rel_err`, or the absolute error where the reference is ~0 (e.g. dq under a window of 0)."""
    if want.numel() and want.abs().max().item() < 1e-3:
        return (got.double() - want.double()).abs().max().item()
    return rel_err(got, want)


def _inputs(nq: int, nk: int, heads=(4, 2, 8), seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    hq, hkv, d = heads
    q, dout = (torch.randn(nq, hq, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(nk, hkv, d, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, dout


def _check(kernel, dtype, shapes, causal: bool, w: int | None, softcap: float | None, tol: float,
           heads=(4, 2, 8), scale: float = 0.7) -> None:
    """Kernel forward (out, lse) and backward (dq, dk, dv) against the reference, on ``shapes`` segments."""
    spec = VarlenSpec.from_lengths([a for a, _ in shapes], [b for _, b in shapes], causal, w)
    q, k, v, dout = _inputs(spec.total_q, spec.total_k, heads)
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    ref_out, ref_lse = reference_varlen_attention(qr, kr, vr, spec, scale, softcap=softcap)
    ref = torch.autograd.grad(ref_out, (qr, kr, vr), dout)
    q, k, v, dout = (x.to(dtype) for x in (q, k, v, dout))
    out, lse = kernel.forward(q, k, v, spec, scale, softcap=softcap)
    grads = kernel.backward(dout, q, k, v, out, lse, spec=spec, scale=scale, softcap=softcap)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen) and not bool(out[~seen].abs().any())
    assert _err(lse[seen], ref_lse[seen]) < tol
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref_out, *ref)):
        assert got.dtype == dtype and got.shape == want.shape, name
        assert _err(got, want) < tol, f"{name}: {_err(got, want):.2e} (window {w}, causal {causal}, cap {softcap})"


def test_window_left_converts_transformers_windows() -> None:
    assert window_left(None) is None and window_left(1) == 0 and window_left(4096) == 4095
    assert window_left(np.int64(3)) == 2
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(ValueError, match="sliding window"):
            window_left(bad)
    with pytest.raises(ValueError, match="window_left"):
        VarlenSpec((0, 4), (0, 4), True, -1)
    assert VarlenSpec.from_lengths([3], [5], False, np.int64(2)).window_left == 2
    assert VarlenSpec((0, 1), (0, 1), True) == VarlenSpec((0, 1), (0, 1), True, None) != VarlenSpec((0, 1), (0, 1),
                                                                                                     True, 0)


@settings(max_examples=300)
@given(lq=st.integers(0, 24), lk=st.integers(0, 24), causal=st.booleans(), w=st.integers(0, 30),
       block=st.sampled_from([0, 1, 2, 3, 8]))
def test_band_calls_cover_each_visible_pair_once(lq: int, lk: int, causal: bool, w: int, block: int) -> None:
    """The FULL / CAUSAL / ANTI calls of a windowed segment cover exactly its visible pairs, each once; no call
    is empty and halved squares have at most ``block`` rows."""
    count = torch.zeros(lq, lk, dtype=torch.int64)
    for ql, qh, kl, kh, kind in band_calls(lq, lk, causal, w, block):
        assert 0 <= ql < qh <= lq and 0 <= kl < kh <= lk
        ones = torch.ones(qh - ql, kh - kl, dtype=torch.int64)
        if kind == FULL:
            count[ql:qh, kl:kh] += ones
        else:
            assert kind in (CAUSAL, ANTI) and qh - ql == kh - kl and (block == 0 or qh - ql <= block)
            count[ql:qh, kl:kh] += ones.tril() if kind == CAUSAL else ones.triu()
    p = torch.arange(lq)[:, None] + (lk - lq)
    j = torch.arange(lk)[None, :]
    want = (j >= p - w) & ((j <= p) if causal else True)
    assert torch.equal(count, want.long())


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", list(KERNELS))
def test_windows_match_the_reference(name: str, dtype: torch.dtype, causal: bool) -> None:
    for w in [None, *WINDOWS]:
        _check(KERNELS[name], dtype, SHAPES, causal, w, None, FTOL[dtype])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["math", "math-blocked", "cpu"])
def test_softcap_alone_and_with_windows(name: str, dtype: torch.dtype, causal: bool) -> None:
    for w in (None, 0, 2, 36):
        _check(KERNELS[name], dtype, SHAPES, causal, w, 1.5, FTOL[dtype])


def test_bfloat16_windows_on_the_cpu_kernel() -> None:
    for kernel in (KERNELS["cpu"], KERNELS["cpu-ops"]):
        for w in (1, 7):
            _check(kernel, torch.bfloat16, [(64, 64), (20, 50)], True, w, None, 3e-2)
    _check(KERNELS["cpu"], torch.bfloat16, [(64, 64)], False, 5, 2.0, 3e-2)


@settings(max_examples=ci_examples(40))
@given(lq=st.integers(1, 40), lk=st.integers(1, 40), causal=st.booleans(), w=st.integers(0, 45),
       block=st.sampled_from([0, 2, 5]), small=st.sampled_from([0, 8]), cap=st.sampled_from([None, 3.0]))
def test_random_shapes_match_the_reference(lq: int, lk: int, causal: bool, w: int, block: int, small: int,
                                           cap: float | None) -> None:
    kernel = TorchCPUFlashKernel(block=block, halve_forward=True, small_window=small)
    _check(kernel, torch.float64, [(lq, lk), (lk, lq)], causal, w, cap, TOL["float64"], heads=(2, 1, 4))


class _Recorder:
    """Wraps an op, recording ``(q rows, k rows, causal, q data pointer, k data pointer)`` of every call."""

    def __init__(self, op) -> None:
        self.op, self.calls = op, []

    def __call__(self, *args, **kw):
        bwd = len(args) >= 8  # backward: (grad_out, q, k, v, out, lse, dropout, causal)
        q, k = (args[1], args[2]) if bwd else (args[0], args[1])
        causal = args[7] if bwd else args[4]
        self.calls.append((q.shape[2], k.shape[2], bool(causal), q.data_ptr(), k.data_ptr()))
        return self.op(*args, **kw)


def _record(monkeypatch, kernel, spec, q, k, v, dout):
    fwd, bwd = _Recorder(cpu._FWD), _Recorder(cpu._BWD)
    monkeypatch.setattr(cpu, "_FWD", fwd)
    monkeypatch.setattr(cpu, "_BWD", bwd)
    out, lse = kernel.forward(q, k, v, spec, 0.3)
    grads = kernel.backward(dout, q, k, v, out, lse, spec=spec, scale=0.3)
    monkeypatch.undo()
    return fwd.calls, bwd.calls, (out, lse, *grads)


@pytest.mark.parametrize("causal", [True, False])
def test_unwindowed_cpu_path_issues_the_same_op_calls(monkeypatch, causal: bool) -> None:
    """No window, or one that hides nothing in any segment: exactly the calls of the unwindowed cut
    (``plain_calls``, the kernel's historical decomposition), on the same rows, with bit-identical results."""
    shapes = [(300, 300), (65, 200), (200, 65), (1, 9), (0, 5), (129, 129)]
    kernel = TorchCPUFlashKernel(block=16)
    q, k, v, dout = _inputs(sum(a for a, _ in shapes), sum(b for _, b in shapes), seed=4)
    plain = VarlenSpec.from_lengths([a for a, _ in shapes], [b for _, b in shapes], causal)
    fwd, bwd, res = _record(monkeypatch, kernel, plain, q, k, v, dout)
    want = {0: [], 16: []}
    for qa, qb, ka, kb in plain.segments():
        for block in want:
            want[block] += [(qh - ql, kh - kl, bool(c)) for ql, qh, kl, kh, c in plain_calls(qb - qa, kb - ka, causal,
                                                                                              block)]
    assert [c[:3] for c in fwd] == want[0] and [c[:3] for c in bwd] == want[16]
    hides_nothing = VarlenSpec(plain.cu_q, plain.cu_k, causal, max(b for _, b in shapes) - 1)
    fwd_w, bwd_w, res_w = _record(monkeypatch, kernel, hides_nothing, q, k, v, dout)
    assert fwd_w == fwd and bwd_w == bwd  # same shapes, masks and source rows
    assert all(torch.equal(a, b) for a, b in zip(res, res_w))


def test_windowed_cpu_path_op_calls(monkeypatch) -> None:
    """A causal window of ``w`` keys on an ``L``-token segment: about ``2 L / w`` forward calls (the head's causal
    square, then one causal and one anti-causal square per block of ``w`` positions; the anti squares run as
    causal calls on flipped rows) against one call without a window."""
    L, w = 1020, 255
    q, k, v, dout = _inputs(L, L, seed=5)
    kernel = TorchCPUFlashKernel()
    fwd, bwd, _ = _record(monkeypatch, kernel, VarlenSpec.from_lengths([L], [L], True, w), q, k, v, dout)
    plain_fwd, plain_bwd, _ = _record(monkeypatch, kernel, VarlenSpec.from_lengths([L], [L], True), q, k, v, dout)
    assert len(plain_fwd) == 1 and len(fwd) == len(band_calls(L, L, True, w)) == 7
    assert all(c[:3] == (w, w, True) for c in fwd)
    assert len(bwd) == len(band_calls(L, L, True, w, kernel.block)) == 21 and len(plain_bwd) == 15


def _dense_reference(q, k, v, segments, causal, w, softcap, scale):
    """Dense float64 attention of every query row over the keys of all segments that contain it (each
    segment's mask bottom-right aligned within it): the meaning of segments sharing query rows."""
    vis = torch.zeros(q.shape[0], k.shape[0], dtype=torch.bool)
    for qa, qb, ka, kb in segments:
        p = torch.arange(qb - qa)[:, None] + (kb - ka) - (qb - qa)
        j = torch.arange(kb - ka)[None, :]
        m = torch.ones(qb - qa, kb - ka, dtype=torch.bool)
        if causal:
            m &= j <= p
        if w is not None:
            m &= j >= p - w
        vis[qa:qb, ka:kb] |= m
    g = q.shape[1] // k.shape[1]
    s = torch.einsum("ihd,jhd->hij", q, k.repeat_interleave(g, 1)) * scale  # [Hq, Nq, Nk]
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(s, -1)  # [Hq, Nq]
    p = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(s), torch.exp(s - lse[..., None]))
    return torch.einsum("hij,jhd->ihd", p, v.repeat_interleave(g, 1)), lse.transpose(0, 1)


# (q_lo, q_hi, k_lo, k_hi) on q [40 rows] and k/v [100 rows]: rows 10..40 are in three segments with disjoint keys
SHARED = [(0, 40, 0, 30), (10, 40, 30, 70), (5, 40, 70, 100), (45, 50, 0, 3)]


@pytest.mark.parametrize("cap", [None, 2.0])
@pytest.mark.parametrize("w", [None, 0, 3, 12])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["cpu", "cpu-ops"])
def test_in_place_segments_sharing_query_rows(name: str, causal: bool, w: int | None, cap: float | None) -> None:
    kernel, scale = KERNELS[name], 0.6
    q, k, v, dout = _inputs(50, 100, seed=9)
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    ref_out, ref_lse = _dense_reference(qr, kr, vr, SHARED, causal, w, cap, scale)
    ref = torch.autograd.grad(ref_out, (qr, kr, vr), dout)
    seen = torch.isfinite(ref_lse)
    kw = {"window_left": w, "softcap": cap}
    # fresh: every segment at once on empty accumulators
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64)
    kernel.forward_into(q, k, v, segments=SHARED, causal=causal, scale=scale, out=out, lse=lse, fresh=True, **kw)
    assert torch.equal(torch.isfinite(lse), seen) and not bool(out[~seen].abs().any())
    assert _err(out, ref_out) < TOL["float64"] and _err(lse[seen], ref_lse[seen]) < TOL["float64"]
    # merged: the first segment fresh, the others merged into it in a second call
    out2 = torch.zeros(q.shape, dtype=torch.float64)
    lse2 = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64)
    kernel.forward_into(q, k, v, segments=SHARED[:1], causal=causal, scale=scale, out=out2, lse=lse2, fresh=True, **kw)
    kernel.forward_into(q, k, v, segments=SHARED[1:], causal=causal, scale=scale, out=out2, lse=lse2, **kw)
    assert _err(out2, ref_out) < TOL["float64"] and _err(lse2[seen], ref_lse[seen]) < TOL["float64"]
    # backward: gradients added to what the accumulators held
    base = [torch.full(x.shape, 0.25, dtype=torch.float64) for x in (q, k, v)]
    dq, dk, dv = (b.clone() for b in base)
    kernel.backward_into(dout, q, k, v, out, lse, segments=SHARED, causal=causal, scale=scale, dq=dq, dk=dk, dv=dv,
                         **kw)
    for name_, got, b, want in zip(("dq", "dk", "dv"), (dq, dk, dv), base, ref):
        assert _err(got - b, want) < TOL["float64"], name_


def test_in_place_positional_contract_unchanged() -> None:
    """The runtime's positional calls (up to ``fresh``) without window or softcap keywords."""
    q, k, v, dout = _inputs(30, 30, seed=2)
    kernel, segs = TorchCPUFlashKernel(), [(0, 30, 0, 30)]
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float64)
    kernel.forward_into(q, k, v, segments=segs, causal=True, scale=0.5, out=out, lse=lse, fresh=True)
    ref_out, ref_lse = reference_varlen_attention(q, k, v, VarlenSpec.from_lengths([30], [30], True), 0.5)
    assert rel_err(out, ref_out) < TOL["float64"] and rel_err(lse, ref_lse) < TOL["float64"]
    dq, dk, dv = (torch.zeros(x.shape, dtype=torch.float64) for x in (q, k, v))
    kernel.backward_into(dout, q, k, v, out, lse, segments=segs, causal=True, scale=0.5, dq=dq, dk=dk, dv=dv)
    assert dq.abs().sum() > 0 and dk.abs().sum() > 0 and dv.abs().sum() > 0


@given(ops=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 10)), max_size=12))
def test_rows_written_tracks_ranges(ops: list[tuple[int, int]]) -> None:
    """``RowsWritten.pieces`` agrees with a boolean row model and covers the asked range in order."""
    rw, model = RowsWritten(), np.zeros(45, dtype=bool)
    for a, n in ops:
        b = a + n
        pieces = rw.pieces(a, b)
        assert pieces[0][0] == a and pieces[-1][1] == b
        assert all(p[1] == nxt[0] and p[2] != nxt[2] for p, nxt in zip(pieces, pieces[1:]))
        for lo, hi, done in pieces:
            assert lo < hi and bool(model[lo:hi].all() if done else not model[lo:hi].any())
        rw.add(a, b)
        model[a:b] = True


def test_apply_sinks_and_its_gradient() -> None:
    g = torch.Generator().manual_seed(3)
    out, dout = torch.randn(6, 3, 4, generator=g, dtype=torch.float64), torch.randn(6, 3, 4, generator=g,
                                                                                        dtype=torch.float64)
    lse = torch.randn(6, 3, generator=g, dtype=torch.float64)
    lse[2, 1] = float("-inf")
    out[2, 1] = 0.0
    sinks = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    out_f, lse_f = apply_sinks(out, lse, sinks)
    assert lse_f[2, 1] == sinks[1] and not bool(out_f[2, 1].any())
    assert torch.allclose(lse_f, torch.logaddexp(lse, sinks.detach()), rtol=0, atol=1e-14)
    # the sink's gradient against autograd through the same formula (differentiable torch ops)
    lse_t = torch.logaddexp(lse, sinks)
    want = torch.autograd.grad((out * torch.exp(lse - lse_t).unsqueeze(-1) * dout).sum(), sinks)[0]
    assert torch.allclose(sinks_grad(dout, out_f, lse_f, sinks), want, rtol=1e-12, atol=1e-14)
    assert sinks_grad(dout, out_f, lse_f, sinks.detach().bfloat16()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="one logit per query head"):
        apply_sinks(out, lse, sinks[:2])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["math", "cpu", "cpu-ops"])
def test_sinks_through_varlen_attention(name: str, dtype: torch.dtype) -> None:
    """Out and the gradients of q, k, v and the sinks against GPT-OSS-style eager attention (sinks as an extra
    softmax column), with a window and a softcap too; the backward of the FINAL out/lse is the q/k/v gradient."""
    cu = [0, 1, 31, 38, 83]  # documents of 1, 30, 7 and 45 tokens
    q, k, v, dout = _inputs(83, 83, seed=6)
    sinks = torch.tensor([0.3, -2.0, 1.5, 4.0], dtype=torch.float64)
    for window, cap in ((None, None), (6, None), (None, 2.5), (10, 2.5)):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, sinks)]
        ref_out, ref_lse = reference_attention(*leaves[:3], cu, 0.5, window=window, softcap=cap, sinks=leaves[3])
        ref = torch.autograd.grad(ref_out, leaves, dout)
        got_leaves = [x.to(dtype).requires_grad_(True) for x in (q, k, v, sinks)]
        out = varlen_attention(*got_leaves[:3], cu, None, True, softmax_scale=0.5, kernel=KERNELS[name], window=window,
                               softcap=cap,
                               sinks=got_leaves[3])
        grads = torch.autograd.grad(out, got_leaves, dout.to(dtype))
        assert out.dtype == dtype and _err(out, ref_out) < FTOL[dtype]
        for label, got, want in zip(("dq", "dk", "dv", "dsinks"), grads, ref):
            assert got.dtype == dtype and _err(got, want) < FTOL[dtype], (label, window, cap, _err(got, want))


def test_references_agree_with_windows_softcap_and_sinks() -> None:
    """The document reference (Transformers' window) and the varlen reference (flash's left window) agree."""
    lens = [5, 1, 40, 17]
    cu = [0, 5, 6, 46, 63]
    q, k, v, _ = _inputs(63, 63, seed=3)
    sinks = torch.tensor([0.1, 0.2, -3.0, 1.0], dtype=torch.float64)
    for window in (None, 1, 4, 100):
        spec = VarlenSpec.from_lengths(lens, lens, True, window_left(window))
        a = reference_varlen_attention(q, k, v, spec, 0.4, softcap=3.0, sinks=sinks)
        b = reference_attention(q, k, v, cu, 0.4, window=window, softcap=3.0, sinks=sinks)
        assert all(torch.allclose(x, y, rtol=0, atol=1e-12) for x, y in zip(a, b))
    one = reference_attention(q, k, v, cu, 0.4, window=1)[0]
    assert torch.allclose(one, v.repeat_interleave(2, 1), rtol=0, atol=1e-12)  # window 1: each token itself


def test_old_positional_varlen_call_still_works() -> None:
    q, k, v, _ = _inputs(20, 20, seed=8)
    out = varlen_attention(q, k, v, [0, 12, 20], [0, 12, 20], True, softmax_scale=0.3, kernel=MathKernel())
    ref, _ = reference_attention(q, k, v, [0, 12, 20], 0.3)
    assert rel_err(out, ref) < TOL["float64"]


def test_torch_cuda_flash_refuses_softcap_and_missing_windows(monkeypatch) -> None:
    """PyTorch's CUDA flash op has no softcap (and old ones no windows): refused with the fix, before any CUDA call."""
    q, k, v, dout = _inputs(8, 8)
    spec = VarlenSpec.from_lengths([8], [8], True)
    kernel = TorchCUDAFlashKernel()
    with pytest.raises(ValueError, match="flash-attn >= 2.7.*prefer='math'"):
        kernel.forward(q, k, v, spec, 0.3, softcap=30.0)
    with pytest.raises(ValueError, match="flash-attn >= 2.7"):
        kernel.backward(dout, q, k, v, q, q[:, :, 0], spec=spec, scale=0.3, softcap=30.0)
    from hf_hsap.kernels import cuda

    monkeypatch.setattr(cuda, "_has_window_args", lambda op: False)
    with pytest.raises(ValueError, match="no sliding windows"):
        kernel.forward(q, k, v, VarlenSpec.from_lengths([8], [8], True, 3), 0.3)
