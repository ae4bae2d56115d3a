"""CPU kernel: PyTorch's CPU flash attention, called per varlen segment (per block of one).

PyTorch has no varlen attention on CPU, and flash-attn is CUDA only, so this file loops over the
segments of a varlen call and runs ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its
``_backward``) on each. That op is exact (it matches a float64 dense reference to round-off),
supports float32/float64/bfloat16, returns the log-sum-exp and takes GQA key/value heads natively,
so no key/value head is ever repeated. Its causal mask is top-left aligned, so a bottom-right causal
segment with fewer queries than keys is run as a full part plus a square causal part, merged by LSE.
The op crashes on zero-length keys, so empty segments are skipped (output 0, lse -inf).

Causal squares are halved recursively: ``causal(n) = causal(n/2) + full(n/2 x n/2) + causal(n/2)``
down to squares of ``block`` rows, and the parts are merged by LSE. The op walks keys in blocks of up
to 512 and computes a whole key block even where the causal mask hides most of it, so one call on a
causal square computes about 256 masked keys per query row; after halving only the small diagonal
squares carry masked keys (``block / 2`` per row) and the rest runs as large full rectangles.
Measured fwd + bwd on one thread (4-32 query heads, 1-8 KV heads, head dim 64): 1.3-1.4x faster for
a 512-token square, 1.15-1.2x at 1024, 1.06-1.1x at 2048 and 1.02-1.07x at 4096-8192. With fewer than
``min_heads`` query heads a call is too light to pay for the extra calls, merges and gradient adds
(with 2 heads, 4 processes on 2 cores ran 5-10% slower halved), so such calls stay whole.
``run_kernel_shapes`` in ``benchmarks/measured.py`` shows the current figures.
"""
from __future__ import annotations

import torch

from .base import VarlenSpec, check_shapes, lse_dtype, merge_partial

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


def _pieces(lq: int, lk: int, causal: bool, block: int = 0) -> list[Call]:
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
        block: causal squares are halved down to this many rows (0: one call per causal square).
        min_heads: halve only calls with at least this many query heads.
    """

    name = "torch-cpu-flash"

    def __init__(self, block: int = 128, min_heads: int = 4) -> None:
        self.block, self.min_heads = block, min_heads

    def _block(self, q: torch.Tensor) -> int:
        """The halving block for queries ``q [N, Hq, D]`` (0: no halving)."""
        return self.block if q.shape[1] >= self.min_heads else 0

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: VarlenSpec, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :class:`hf_hsap.kernels.base.AttentionKernel`. Shapes: q ``[Nq, Hq, D]``, k/v
        ``[Nk, Hkv, D]`` -> out ``[Nq, Hq, D]``, lse ``[Nq, Hq]``."""
        check_shapes(q, k, v, spec)
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:2], float("-inf"), dtype=lse_dtype(q.dtype))
        block = self._block(q)
        for qa, qb, ka, kb in spec.segments():
            calls = _pieces(qb - qa, kb - ka, spec.causal, block)
            # several calls: merge in the LSE dtype over the segment's queries (rows of no call stay empty)
            acc_o = torch.zeros((qb - qa, *q.shape[1:]), dtype=lse.dtype) if len(calls) > 1 else None
            acc_l = lse[qa:qb]  # a view: merged results land in lse directly
            for ql, qh, kl, kh, causal in calls:
                o, l = _FWD(_bhld(q[qa + ql:qa + qh]), _bhld(k[ka + kl:ka + kh]), _bhld(v[ka + kl:ka + kh]),
                            0.0, causal, scale=scale)
                o = o[0].transpose(0, 1)  # [1, H, Lq, D] -> [Lq, H, D]
                l = l[0].transpose(0, 1)  # [1, H, Lq] -> [Lq, H]
                if acc_o is None:
                    out[qa + ql:qa + qh] = o
                    acc_l[ql:qh] = l
                else:
                    acc_o[ql:qh], acc_l[ql:qh] = merge_partial(acc_o[ql:qh], acc_l[ql:qh], o, l)
            if acc_o is not None:
                out[qa:qb] = acc_o.to(q.dtype)
        return out, lse

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
        values. Returns dq ``[Nq, Hq, D]``, dk/dv ``[Nk, Hkv, D]``."""
        dq = torch.zeros_like(q)
        dk = torch.zeros_like(k)
        dv = torch.zeros_like(v)
        op_lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        dout = dout.to(q.dtype)
        out = out.to(q.dtype)
        block = self._block(q)
        for qa, qb, ka, kb in spec.segments():
            for ql, qh, kl, kh, causal in _pieces(qb - qa, kb - ka, spec.causal, block):
                qs, qe, ks, ke = qa + ql, qa + qh, ka + kl, ka + kh
                l = lse[qs:qe].to(op_lse_dtype).transpose(0, 1).unsqueeze(0).contiguous()  # [1, H, Lq]
                gq, gk, gv = _BWD(_bhld(dout[qs:qe]), _bhld(q[qs:qe]), _bhld(k[ks:ke]), _bhld(v[ks:ke]),
                                  _bhld(out[qs:qe]), l, 0.0, causal, scale=scale)
                dq[qs:qe] += gq[0].transpose(0, 1)  # [1, H, L, D] -> [L, H, D]
                dk[ks:ke] += gk[0].transpose(0, 1)
                dv[ks:ke] += gv[0].transpose(0, 1)
        return dq, dk, dv
