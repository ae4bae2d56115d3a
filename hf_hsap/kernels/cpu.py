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
(``run_kernel_shapes`` in ``benchmarks/suites/measured.py``).

Sliding windows (``window_left``) are exact too: :mod:`hf_hsap.kernels.bands` cuts a windowed segment
into full rectangles, causal squares and anti-causal squares (the op's causal mask on row-flipped q and
k/v, flipped back), halved like causal squares. A window that hides nothing in a segment
(``window_left >= Lk - 1``) runs exactly the unwindowed calls. Causal windows narrower than
``small_window`` keys (about ``2 Lk / w`` op calls) and every segment with a ``softcap`` (the op has none)
run the blocked math of :mod:`hf_hsap.kernels.math` instead, in the same methods, forward and backward.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .bands import ANTI, Call, band_calls, effective_window, plain_calls
from .base import RowsWritten, Segment, VarlenSpec, check_shapes, lse_dtype, store_rows
from .math import backward_segment, forward_segment

_FWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

_calls = plain_calls  # the unwindowed cut (its historical name here; tests import it)


def _bhld(x: torch.Tensor) -> torch.Tensor:
    """``[L, H, D] -> [1, H, L, D]`` as a view (the op accepts this strided layout)."""
    return x.transpose(0, 1).unsqueeze(0)


def _rows(x: torch.Tensor, lo: int, hi: int, flip: bool) -> torch.Tensor:
    """Rows ``lo:hi`` of ``x [L, H, D]`` as ``[1, H, n, D]``, in reverse order when ``flip`` (an ANTI call)."""
    x = x[lo:hi]
    return _bhld(x.flip(0) if flip else x)


def _back(x: torch.Tensor, flip: bool) -> torch.Tensor:
    """An op result ``[1, H, n, D]`` (or ``[1, H, n]``) as ``[n, H, D]`` (``[n, H]``), unflipped."""
    x = x[0].transpose(0, 1)  # [1, H, n, ...] -> [n, H, ...]
    return x.flip(0) if flip else x


class TorchCPUFlashKernel:
    """Varlen attention on CPU via ``aten._scaled_dot_product_flash_attention_for_cpu``.

    Args:
        block: the backward halves causal (and anti-causal) squares down to this many rows (0: one call per
            square) in calls with at least ``min_heads`` query heads.
        min_heads: see ``block``; calls with fewer query heads halve down to ``few_heads_block`` rows.
        few_heads_block: the halving block of calls with fewer than ``min_heads`` query heads.
        halve_forward: halve in the forward too (same blocks); off by default (slower, see above).
        small_window: causal windows with ``window_left`` below this run the blocked math (0: never, except
            ``window_left == 0``, which the op cuts into one call per query row).
        math_budget: about the most scores one block of the blocked math materialises.
    """

    name = "torch-cpu-flash"
    supports_window = True
    supports_softcap = True

    def __init__(self, block: int = 128, min_heads: int = 4, few_heads_block: int = 256,
                 halve_forward: bool = False, small_window: int = 32, math_budget: int = 1 << 22) -> None:
        self.block, self.min_heads, self.few_heads_block = block, min_heads, few_heads_block
        self.halve_forward = halve_forward
        self.small_window, self.math_budget = small_window, math_budget

    def _block(self, q: torch.Tensor) -> int:
        """The halving block for queries ``q [N, Hq, D]`` (0: no halving)."""
        return self.block if q.shape[1] >= self.min_heads else self.few_heads_block

    def _by_math(self, causal: bool, w: int | None, softcap: float | None) -> bool:
        """Whether a segment (effective window ``w``) runs the blocked math rather than the op."""
        return softcap is not None or (causal and w is not None and (w == 0 or w < self.small_window))

    def _cut(self, lq: int, lk: int, causal: bool, w: int | None, block: int) -> list[Call]:
        """The op calls of one segment (``w``: its effective window)."""
        return plain_calls(lq, lk, causal, block) if w is None else band_calls(lq, lk, causal, w, block)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: VarlenSpec, scale: float, *,
        softcap: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :class:`hf_hsap.kernels.base.AttentionKernel`. Shapes: q ``[Nq, Hq, D]``, k/v
        ``[Nk, Hkv, D]`` -> out ``[Nq, Hq, D]``, lse ``[Nq, Hq]``."""
        check_shapes(q, k, v, spec)
        acc = lse_dtype(q.dtype)
        out = torch.zeros(q.shape, dtype=acc)  # rows of no segment stay 0 / -inf
        lse = torch.full(q.shape[:2], float("-inf"), dtype=acc)
        self.forward_into(q, k, v, segments=spec.segments(), causal=spec.causal, scale=scale, out=out, lse=lse,
                          fresh=True, window_left=spec.window_left, softcap=softcap)
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
        """See :class:`hf_hsap.kernels.base.AttentionKernel`; ``out``/``lse`` are the final merged
        values. Returns dq ``[Nq, Hq, D]``, dk/dv ``[Nk, Hkv, D]`` (summed in fp32, or fp64 for fp64)."""
        acc = lse_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=acc)
        dk = torch.zeros(k.shape, dtype=acc)
        dv = torch.zeros(v.shape, dtype=acc)
        self.backward_into(dout, q, k, v, out, lse, segments=spec.segments(), causal=spec.causal, scale=scale,
                           dq=dq, dk=dk, dv=dv, window_left=spec.window_left, softcap=softcap)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

    def forward_into(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, segments: Sequence[Segment], causal: bool,
        scale: float, out: torch.Tensor, lse: torch.Tensor, fresh: bool = False,
        window_left: int | None = None, softcap: float | None = None,
    ) -> None:
        """See :class:`hf_hsap.kernels.base.InPlaceKernel`. Shapes: q ``[Nq, Hq, D]``, k/v ``[Nk, Hkv, D]``,
        out ``[Nq, Hq, D]``, lse ``[Nq, Hq]`` (accumulators, updated in place)."""
        block = self._block(q) if self.halve_forward else 0
        written = RowsWritten() if fresh else None  # rows holding a result: merge into them, write the others
        for seg in segments:
            qa, qb, ka, kb = seg
            w = effective_window(kb - ka, window_left)
            if self._by_math(causal, w, softcap):
                for a, b, o, l in forward_segment(q, k, v, seg, causal, scale, window_left=w, softcap=softcap,
                                                  budget=self.math_budget):
                    store_rows(out, lse, a, b, o, l, written=written)
                continue
            for ql, qh, kl, kh, kind in self._cut(qb - qa, kb - ka, causal, w, block):
                qs, qe, ks, ke = qa + ql, qa + qh, ka + kl, ka + kh
                flip = kind == ANTI
                o, l = _FWD(_rows(q, qs, qe, flip), _rows(k, ks, ke, flip), _rows(v, ks, ke, flip), 0.0,
                            bool(kind), scale=scale)[:2]
                store_rows(out, lse, qs, qe, _back(o, flip), _back(l, flip), written=written)

    def backward_into(
        self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
        lse: torch.Tensor, *, segments: Sequence[Segment], causal: bool, scale: float,
        dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
        window_left: int | None = None, softcap: float | None = None,
    ) -> None:
        """See :class:`hf_hsap.kernels.base.InPlaceKernel`. Shapes: dout/q/out/dq ``[Nq, Hq, D]``,
        k/v/dk/dv ``[Nk, Hkv, D]``, lse ``[Nq, Hq]``; the gradients are added in place."""
        op_lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        block = self._block(q)
        cast = None  # dout / out in q's dtype, made once when an op call needs them
        for seg in segments:
            qa, qb, ka, kb = seg
            w = effective_window(kb - ka, window_left)
            if self._by_math(causal, w, softcap):
                backward_segment(dout, q, k, v, out, lse, segment=seg, causal=causal, scale=scale, dq=dq, dk=dk,
                                 dv=dv, window_left=w, softcap=softcap, budget=self.math_budget)
                continue
            if cast is None:
                cast = dout.to(q.dtype), out.to(q.dtype)
            d_o, o_q = cast
            for ql, qh, kl, kh, kind in self._cut(qb - qa, kb - ka, causal, w, block):
                qs, qe, ks, ke = qa + ql, qa + qh, ka + kl, ka + kh
                flip = kind == ANTI
                l = lse[qs:qe].to(op_lse_dtype).transpose(0, 1).unsqueeze(0)  # [1, H, Lq]
                l = (l.flip(-1) if flip else l).contiguous()
                gq, gk, gv = _BWD(_rows(d_o, qs, qe, flip), _rows(q, qs, qe, flip), _rows(k, ks, ke, flip),
                                  _rows(v, ks, ke, flip), _rows(o_q, qs, qe, flip), l, 0.0, bool(kind),
                                  scale=scale)
                dq[qs:qe] += _back(gq, flip)  # [1, H, L, D] -> [L, H, D]
                dk[ks:ke] += _back(gk, flip)
                dv[ks:ke] += _back(gv, flip)
