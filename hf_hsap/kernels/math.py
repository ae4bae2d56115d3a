"""Portable kernel in plain PyTorch ops: any device, any floating dtype, windows and soft-capping.

Used where no flash kernel applies (other devices; on CUDA only on request, ``prefer="math"``) and, inside the CPU kernel, for what
PyTorch's CPU flash op cannot do (soft-capping, very narrow causal windows). A segment runs in blocks of
query rows: each block materialises the scores ``[Hkv, g, rows, keys]`` of only the keys its rows can see
(a window's band, not the whole segment), with at most about ``budget`` scores per block, so memory stays
bounded for long segments. GQA is handled by viewing the query heads as ``[Hkv, group]``: key/value heads
are broadcast, not copied. Results are exact (round-off of the accumulator dtype, fp32 or fp64).

The block functions (:func:`forward_segment`, :func:`backward_segment`) take un-gathered q, k, v and one
:data:`~hf_hsap.kernels.base.Segment`, like the in-place kernel methods.
"""
from __future__ import annotations

import math
from typing import Iterator

import torch

from .base import RowsWritten, Segment, VarlenSpec, check_shapes, lse_dtype, store_rows

DEFAULT_BUDGET = 1 << 26  # scores per block of the math kernel (256 MiB in fp32): one block per usual segment


def _block_rows(lq: int, lk: int, hq: int, causal: bool, window_left: int | None, budget: int) -> int:
    """Query rows per block so that ``hq * rows * keys <= budget`` (at least 1 row).

    A block of ``r`` rows sees ``lk`` keys, or ``r + window_left`` under a causal window; there blocks of
    about ``max(64, window_left + 1)`` rows compute at most about twice the visible pairs; the floor of 64 rows
    keeps the number of calls small for narrow windows."""
    per_row = max(1, budget // max(hq, 1))  # scores per head-row budget: rows * keys <= per_row
    if causal and window_left is not None:
        c = window_left + 1  # r * (r + c) <= per_row
        r = min(int((math.sqrt(c * c + 4 * per_row) - c) / 2), max(64, c))
    else:
        r = per_row // max(lk, 1)
    return max(1, min(lq, r))


def _key_span(r0: int, r1: int, off: int, lk: int, causal: bool, w: int | None) -> tuple[int, int]:
    """Keys ``[lo, hi)`` (relative to the segment) seen by any of the query rows ``[r0, r1)``."""
    lo = 0 if w is None else max(0, r0 + off - w)
    hi = min(lk, r1 - 1 + off + 1) if causal else lk
    return lo, hi


def _visible(r0: int, r1: int, lo: int, hi: int, off: int, *, causal: bool, w: int | None,
             device: torch.device) -> torch.Tensor | None:
    """``[rows, keys]`` mask of the block of query rows ``[r0, r1)`` and keys ``[lo, hi)`` of a segment whose keys
    start ``off`` rows before its queries' aligned positions (True = visible), ``None`` when every pair is visible."""
    p_first, p_last = r0 + off, r1 - 1 + off
    needs_causal = causal and p_first < hi - 1  # some row sees fewer than all keys up to hi
    needs_window = w is not None and p_last - w > lo
    if not (needs_causal or needs_window):
        return None
    p = torch.arange(r0, r1, device=device).unsqueeze(1) + off  # [rows, 1]
    j = torch.arange(lo, hi, device=device).unsqueeze(0)  # [1, keys]
    vis = torch.ones(r1 - r0, hi - lo, dtype=torch.bool, device=device)
    if needs_causal:
        vis &= j <= p
    if needs_window:
        vis &= j >= p - w
    return vis


def _heads(x: torch.Tensor, hkv: int, acc: torch.dtype) -> torch.Tensor:
    """``[L, Hq, D] -> [Hkv, g, L, D]`` in ``acc`` dtype."""
    n, hq, d = x.shape
    return x.to(acc).reshape(n, hkv, hq // hkv, d).permute(1, 2, 0, 3)


def _kv_heads(x: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """``[L, Hkv, D] -> [Hkv, 1, L, D]`` in ``acc`` dtype (broadcast over the query group)."""
    return x.to(acc).permute(1, 0, 2).unsqueeze(1)


def _scores(qg: torch.Tensor, kg: torch.Tensor, scale: float,
            softcap: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scores ``[Hkv, g, Lq, Lk]`` from ``qg [Hkv, g, Lq, D]``, ``kg [Hkv, 1, Lk, D]``: ``scale * q.k``, or
    ``softcap * tanh(scale * q.k / softcap)`` (then also the tanh, for the backward; else ``None``)."""
    s = torch.matmul(qg, kg.transpose(-1, -2)) * scale  # [Hkv, g, Lq, Lk]
    if softcap is None:
        return s, None
    t = torch.tanh(s / softcap)
    return t * softcap, t


def _blocks(lq: int, lk: int, hq: int, causal: bool, w: int | None,
            budget: int) -> Iterator[tuple[int, int, int, int]]:
    """``(r0, r1, lo, hi)``: blocks of query rows that see a key, with the keys they see."""
    off = lk - lq
    if lq == 0 or lk == 0:
        return
    first = max(0, -off) if causal else 0  # causal rows with p < 0 see nothing
    rows = _block_rows(lq - first, lk, hq, causal, w, budget)
    for r0 in range(first, lq, rows):
        r1 = min(lq, r0 + rows)
        lo, hi = _key_span(r0, r1, off, lk, causal, w)
        yield r0, r1, lo, hi


def forward_segment(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segment: Segment, causal: bool, scale: float, *,
    window_left: int | None = None, softcap: float | None = None, budget: int = DEFAULT_BUDGET,
) -> Iterator[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """The attention of one segment, block by block of query rows.

    Args:
        q ``[Nq, Hq, D]``, k/v ``[Nk, Hkv, D]``: un-gathered sources; segment: ``(q_lo, q_hi, k_lo, k_hi)``.
        causal, window_left: the segment's mask (bottom-right aligned); softcap: ``None`` or the cap.
        budget: about the most scores one block materialises.

    Yields:
        ``(a, b, out [b - a, Hq, D], lse [b - a, Hq])`` for rows ``a:b`` of q (accumulator dtype); rows that
        see no key are in no block.
    """
    qa, qb, ka, kb = segment
    lq, lk = qb - qa, kb - ka
    hq, hkv = q.shape[1], k.shape[1]
    acc = lse_dtype(q.dtype)
    for r0, r1, lo, hi in _blocks(lq, lk, hq, causal, window_left, budget):
        s, _ = _scores(_heads(q[qa + r0:qa + r1], hkv, acc), _kv_heads(k[ka + lo:ka + hi], acc), scale, softcap)
        vis = _visible(r0, r1, lo, hi, lk - lq, causal=causal, w=window_left, device=q.device)
        if vis is not None:
            s = s.masked_fill(~vis, float("-inf"))
        l = torch.logsumexp(s, dim=-1)  # [Hkv, g, rows]: finite, every row sees a key
        p = torch.exp(s - l.unsqueeze(-1))
        o = torch.matmul(p, _kv_heads(v[ka + lo:ka + hi], acc))  # [Hkv, g, rows, D]
        n = r1 - r0
        yield qa + r0, qa + r1, o.permute(2, 0, 1, 3).reshape(n, hq, -1), l.permute(2, 0, 1).reshape(n, hq)


def backward_segment(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, *, segment: Segment, causal: bool, scale: float,
    dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
    window_left: int | None = None, softcap: float | None = None, budget: int = DEFAULT_BUDGET,
) -> None:
    """Add one segment's gradients to ``dq``, ``dk``, ``dv`` (in place), flash style from the FINAL
    ``out``/``lse``: ``P = exp(S - lse)``, ``dS = P * (dO V^T - rowsum(dO * O))``, times ``1 - tanh^2``
    under a softcap.

    Shapes: dout/q/out/dq ``[Nq, Hq, D]``, k/v/dk/dv ``[Nk, Hkv, D]``, lse ``[Nq, Hq]``; other arguments as
    :func:`forward_segment`.
    """
    qa, qb, ka, kb = segment
    lq, lk = qb - qa, kb - ka
    hq, hkv = q.shape[1], k.shape[1]
    g = hq // hkv
    acc = lse_dtype(q.dtype)
    for r0, r1, lo, hi in _blocks(lq, lk, hq, causal, window_left, budget):
        n, rows, keys = r1 - r0, slice(qa + r0, qa + r1), slice(ka + lo, ka + hi)
        qg = _heads(q[rows], hkv, acc)  # [Hkv, g, n, D]
        kg, vg = _kv_heads(k[keys], acc), _kv_heads(v[keys], acc)  # [Hkv, 1, keys, D]
        s, t = _scores(qg, kg, scale, softcap)
        vis = _visible(r0, r1, lo, hi, lk - lq, causal=causal, w=window_left, device=q.device)
        if vis is not None:
            s = s.masked_fill(~vis, float("-inf"))
        l = lse[rows].to(acc).reshape(n, hkv, g).permute(1, 2, 0)  # [Hkv, g, n]
        p = torch.exp(s - l.unsqueeze(-1))  # [Hkv, g, n, keys]; hidden pairs exp(-inf) = 0
        do = _heads(dout[rows], hkv, acc)  # [Hkv, g, n, D]
        delta = (do * _heads(out[rows], hkv, acc)).sum(-1, keepdim=True)  # [Hkv, g, n, 1]
        ds = p * (torch.matmul(do, vg.transpose(-1, -2)) - delta)  # [Hkv, g, n, keys]
        if t is not None:
            ds = ds * (1 - t * t)  # d capped / d raw
        ds = ds * scale
        dq[rows] += torch.matmul(ds, kg).permute(2, 0, 1, 3).reshape(n, hq, -1)  # -> [n, Hq, D]
        dk[keys] += torch.matmul(ds.transpose(-1, -2), qg).sum(1).permute(1, 0, 2)  # -> [keys, Hkv, D]
        dv[keys] += torch.matmul(p.transpose(-1, -2), do).sum(1).permute(1, 0, 2)  # -> [keys, Hkv, D]


class MathKernel:
    """Reference-quality varlen attention with explicit matmuls (see module docstring).

    Args:
        budget: about the most scores (``Hq x rows x keys``) one block of query rows materialises.
    """

    name = "math"
    supports_window = True
    supports_softcap = True

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = budget

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: VarlenSpec, scale: float, *,
        softcap: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes: q ``[Nq, Hq, D]``, k/v ``[Nk, Hkv, D]`` -> out ``[Nq, Hq, D]`` (q's dtype), lse ``[Nq, Hq]``."""
        check_shapes(q, k, v, spec)
        acc = lse_dtype(q.dtype)
        out = torch.zeros(q.shape, dtype=acc, device=q.device)  # rows that see nothing stay 0 / -inf
        lse = torch.full(q.shape[:2], float("-inf"), dtype=acc, device=q.device)
        written = RowsWritten()
        for seg in spec.segments():
            for a, b, o, l in forward_segment(q, k, v, seg, spec.causal, scale, window_left=spec.window_left,
                                              softcap=softcap, budget=self.budget):
                store_rows(out, lse, a, b, o, l, written=written)
        return out.to(q.dtype), lse

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        *,
        spec: VarlenSpec,
        scale: float,
        softcap: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gradients from the final ``out``/``lse`` (see :func:`backward_segment`). Returns dq ``[Nq, Hq, D]``,
        dk/dv ``[Nk, Hkv, D]`` in the inputs' dtypes."""
        acc = lse_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        for seg in spec.segments():
            backward_segment(dout, q, k, v, out, lse, segment=seg, causal=spec.causal, scale=scale, dq=dq, dk=dk,
                             dv=dv, window_left=spec.window_left, softcap=softcap, budget=self.budget)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
