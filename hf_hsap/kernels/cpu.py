"""CPU kernel: PyTorch's CPU flash attention, one call per varlen segment.

PyTorch has no varlen attention on CPU, and flash-attn is CUDA only, so this file loops over the
segments of a varlen call and runs ``aten._scaled_dot_product_flash_attention_for_cpu`` (and its
``_backward``) on each. That op is exact (it matches a float64 dense reference to round-off),
supports float32/float64/bfloat16, returns the log-sum-exp and takes GQA key/value heads natively,
so no key/value head is ever repeated. Its causal mask is top-left aligned, so a bottom-right causal
segment with fewer queries than keys is run as a full part plus a square causal part, merged by LSE.
The op crashes on zero-length keys, so empty segments are skipped (output 0, lse -inf).
"""
from __future__ import annotations

import torch

from .base import VarlenSpec, check_shapes, lse_dtype, merge_partial

_FWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _bhld(x: torch.Tensor) -> torch.Tensor:
    """``[L, H, D] -> [1, H, L, D]`` as a view (the op accepts this strided layout)."""
    return x.transpose(0, 1).unsqueeze(0)


def _pieces(lq: int, lk: int, causal: bool) -> list[tuple[int, int, int, int, bool]]:
    """Split one bottom-right causal segment into calls the top-left causal op can run.

    Returns ``(q_lo, q_hi, k_lo, k_hi, causal)`` relative to the segment. For ``lq > lk`` the first
    ``lq - lk`` queries see no key and are not listed.
    """
    if lq == 0 or lk == 0:
        return []
    if not causal:
        return [(0, lq, 0, lk, False)]
    if lq == lk:
        return [(0, lq, 0, lk, True)]
    if lq < lk:
        return [(0, lq, 0, lk - lq, False), (0, lq, lk - lq, lk, True)]
    return [(lq - lk, lq, 0, lk, True)]


class TorchCPUFlashKernel:
    """Varlen attention on CPU via ``aten._scaled_dot_product_flash_attention_for_cpu``."""

    name = "torch-cpu-flash"

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: VarlenSpec, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """See :class:`hf_hsap.kernels.base.AttentionKernel`. Shapes: q ``[Nq, Hq, D]``, k/v
        ``[Nk, Hkv, D]`` -> out ``[Nq, Hq, D]``, lse ``[Nq, Hq]``."""
        check_shapes(q, k, v, spec)
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:2], float("-inf"), dtype=lse_dtype(q.dtype))
        for qa, qb, ka, kb in spec.segments():
            parts = _pieces(qb - qa, kb - ka, spec.causal)
            acc_o = acc_l = None
            for ql, qh, kl, kh, causal in parts:
                o, l = _FWD(_bhld(q[qa + ql:qa + qh]), _bhld(k[ka + kl:ka + kh]),
                            _bhld(v[ka + kl:ka + kh]), 0.0, causal, scale=scale)
                o = o[0].transpose(0, 1)  # [1, H, Lq, D] -> [Lq, H, D]
                l = l[0].transpose(0, 1).to(lse.dtype)  # [1, H, Lq] -> [Lq, H]
                if len(parts) == 1:
                    out[qa + ql:qa + qh] = o
                    lse[qa + ql:qa + qh] = l
                elif acc_o is None:
                    acc_o, acc_l = o.to(lse.dtype), l
                else:
                    acc_o, acc_l = merge_partial(acc_o, acc_l, o, l)
            if acc_o is not None:
                out[qa:qb] = acc_o.to(q.dtype)
                lse[qa:qb] = acc_l
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
        for qa, qb, ka, kb in spec.segments():
            for ql, qh, kl, kh, causal in _pieces(qb - qa, kb - ka, spec.causal):
                qs, qe, ks, ke = qa + ql, qa + qh, ka + kl, ka + kh
                l = lse[qs:qe].to(op_lse_dtype).transpose(0, 1).unsqueeze(0).contiguous()  # [1, H, Lq]
                gq, gk, gv = _BWD(_bhld(dout[qs:qe]), _bhld(q[qs:qe]), _bhld(k[ks:ke]), _bhld(v[ks:ke]),
                                  _bhld(out[qs:qe]), l, 0.0, causal, scale=scale)
                dq[qs:qe] += gq[0].transpose(0, 1)  # [1, H, L, D] -> [L, H, D]
                dk[ks:ke] += gk[0].transpose(0, 1)
                dv[ks:ke] += gv[0].transpose(0, 1)
        return dq, dk, dv
