"""CPU kernel: PyTorch's CPU flash attention, called per varlen segment (per block of one).

PyTorch has no varlen attention on CPU, and flash-attn is CUDA only, so this file loops over the
segments of a varlen call and runs ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its
``_backward``) on each. That op is exact (it matches a float64 dense reference to round-off),
supports float32/float64/bfloat16, returns the log-sum-exp and takes GQA key/value heads natively,
so no key/value head is ever repeated. Its causal mask is top-left aligned, so a bottom-right causal
segment with fewer queries than keys is run as a full part plus a square causal part, merged by LSE.
The op crashes on zero-length keys, so empty segments are skipped (output 0, lse -inf).

Causal squares are halved recursively in the backward: ``causal(n) = causal(n/2) + full(n/2 x n/2) +
causal(n/2)`` down to squares of ``block`` rows. The op walks keys in blocks of up to 512 and
computes a whole key block even where the causal mask hides most of it, so one call on a causal
square computes about 256 masked keys per query row; after halving only the small diagonal squares
carry masked keys (``block / 2`` per row) and the rest runs as large full rectangles. That pays in
the backward; with few heads 128-row squares are too light to pay for the extra calls, so calls with
fewer than ``min_heads`` query heads halve down to ``few_heads_block`` (256) rows instead. The forward
is not halved by default: its LSE merges cost more than the masked keys they save, so it runs one call
per causal square (``halve_forward=True`` halves it too). The measured figures (one call / halved /
default, by shape and head count) are the CPU kernel table of ``BENCHMARKS.md``
(``run_kernel_shapes`` in ``benchmarks/measured.py``).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .base import Segment, VarlenSpec, check_shapes, lse_dtype, merge_partial

_FWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

Call = tuple[int, int, int, int, bool]  # (q_lo, q_hi, k_lo, k_hi, top-left causal)


def _bhld(x: torch.Tensor) -> torch.Tensor:
    """``[L, H, D] -> [1, H, L, D]`` as a view (the op accepts this strided layout)."""
    return x.transpose(0, 1).unsqueeze(0)


def _halve(q0: int, k0: int, n: int, block: int, out: list[Call]) -> None:
    """Append the calls of the causal square ``q[q0:q0+n] x k[k0:k0+n]``, halved down to ``block``."""
    if block <= 0 or n <= block:
        out.append((q0, q0 + n, k0, k0 + n, True))
        return
    h = n // 2
    _halve(q0, k0, h, block, out)
    out.append((q0 + h, q0 + n, k0, k0 + h, False))
    _halve(q0 + h, k0 + h, n - h, block, out)


def _calls(lq: int, lk: int, causal: bool, block: int = 0) -> list[Call]:
    """Split one bottom-right causal segment into calls the top-left causal op can run.

    Args:
        lq, lk: queries and keys of the segment.
        causal: bottom-right aligned causal mask, else full attention.
        block: halve causal squares down to this many rows (0: one call per square).

    Returns:
        ``(q_lo, q_hi, k_lo, k_hi, causal)`` relative to the segment; calls sharing queries are merged by
        LSE. Queries that see no key (``lq > lk``: the first ``lq - lk``) are in no call.
    """
    if lq == 0 or lk == 0:
        return []
    if not causal:
        return [(0, lq, 0, lk, False)]
    off = lk - lq  # query i sees keys j <= i + off
    calls: list[Call] = [(0, lq, 0, off, False)] if off > 0 else []
    _halve(max(0, -off), max(0, off), min(lq, lk), block, calls)
    return calls


class TorchCPUFlashKernel:
    """Varlen attention on CPU via ``aten._scaled_dot_product_flash_attention_for_cpu``.

    Args:
        block: the backward halves causal squares down to this many rows (0: one call per square) in
            calls with at least ``min_heads`` query heads.
        min_heads: see ``block``; calls with fewer query heads halve down to ``few_heads_block`` rows.
        few_heads_block: the halving block of calls with fewer than ``min_heads`` query heads.
        halve_forward: halve in the forward too (same blocks); off by default (slower, see above).
    """

    name = "torch-cpu-flash"

    def __init__(self, block: int = 128, min_heads: int = 4, few_heads_block: int = 256,
                 halve_forward: bool = False) -> None:
        self.block, self.min_heads, self.few_heads_block = block, min_heads, few_heads_block
        self.halve_forward = halve_forward

    def _block(self, q: torch.Tensor) -> int:
        """The halving block for queries ``q [N, Hq, D]`` (0: no halving)."""
        return self.block if q.shape[1] >= self.min_heads else self.few_heads_block

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: VarlenSpec, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :class:`hf_hsap.kernels.base.AttentionKernel`. Shapes: q ``[Nq, Hq, D]``, k/v
        ``[Nk, Hkv, D]`` -> out ``[Nq, Hq, D]``, lse ``[Nq, Hq]``."""
        check_shapes(q, k, v, spec)
        acc = lse_dtype(q.dtype)
        out = torch.zeros(q.shape, dtype=acc)  # rows of no segment stay 0 / -inf
        lse = torch.full(q.shape[:2], float("-inf"), dtype=acc)
        self.forward_into(q, k, v, spec.segments(), spec.causal, scale, out, lse, fresh=True)
        return out.to(q.dtype), lse

    def backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        spec: VarlenSpec,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """See :class:`hf_hsap.kernels.base.AttentionKernel`; ``out``/``lse`` are the final merged
        values. Returns dq ``[Nq, Hq, D]``, dk/dv ``[Nk, Hkv, D]`` (summed in fp32, or fp64 for fp64)."""
        acc = lse_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=acc)
        dk = torch.zeros(k.shape, dtype=acc)
        dv = torch.zeros(v.shape, dtype=acc)
        self.backward_into(dout, q, k, v, out, lse, spec.segments(), spec.causal, scale, dq, dk, dv)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

    def forward_into(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Sequence[Segment], causal: bool,
        scale: float, out: torch.Tensor, lse: torch.Tensor, fresh: bool = False,
    ) -> None:
        """See :class:`hf_hsap.kernels.base.InPlaceKernel`. Shapes: q ``[Nq, Hq, D]``, k/v ``[Nk, Hkv, D]``,
        out ``[Nq, Hq, D]``, lse ``[Nq, Hq]`` (accumulators, updated in place)."""
        block = self._block(q) if self.halve_forward else 0
        for qa, qb, ka, kb in segments:
            # Rows below ``written`` hold a result (merge into it), rows from it on are empty (write).
            # The calls of one segment either lie below it or start at it (see ``_halve``).
            written = qa if fresh else qb
            for ql, qh, kl, kh, c in _calls(qb - qa, kb - ka, causal, block):
                qs, qe, ks, ke = qa + ql, qa + qh, ka + kl, ka + kh
                o, l = _FWD(_bhld(q[qs:qe]), _bhld(k[ks:ke]), _bhld(v[ks:ke]), 0.0, c, scale=scale)[:2]
                o = o[0].transpose(0, 1)  # [1, H, Lq, D] -> [Lq, H, D]
                l = l[0].transpose(0, 1)  # [1, H, Lq] -> [Lq, H]
                if qs >= written:
                    out[qs:qe], lse[qs:qe], written = o, l, qe
                else:
                    out[qs:qe], lse[qs:qe] = merge_partial(out[qs:qe], lse[qs:qe], o, l)

    def backward_into(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
        lse: torch.Tensor, segments: Sequence[Segment], causal: bool, scale: float,
        dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
    ) -> None:
        """See :class:`hf_hsap.kernels.base.InPlaceKernel`. Shapes: dout/q/out/dq ``[Nq, Hq, D]``,
        k/v/dk/dv ``[Nk, Hkv, D]``, lse ``[Nq, Hq]``; the gradients are added in place."""
        op_lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        dout = dout.to(q.dtype)
        out = out.to(q.dtype)
        block = self._block(q)
        for qa, qb, ka, kb in segments:
            for ql, qh, kl, kh, c in _calls(qb - qa, kb - ka, causal, block):
                qs, qe, ks, ke = qa + ql, qa + qh, ka + kl, ka + kh
                l = lse[qs:qe].to(op_lse_dtype).transpose(0, 1).unsqueeze(0).contiguous()  # [1, H, Lq]
                gq, gk, gv = _BWD(_bhld(dout[qs:qe]), _bhld(q[qs:qe]), _bhld(k[ks:ke]), _bhld(v[ks:ke]),
                                  _bhld(out[qs:qe]), l, 0.0, c, scale=scale)
                dq[qs:qe] += gq[0].transpose(0, 1)  # [1, H, L, D] -> [L, H, D]
                dk[ks:ke] += gk[0].transpose(0, 1)
                dv[ks:ke] += gv[0].transpose(0, 1)
