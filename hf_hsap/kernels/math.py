"""Portable kernel in plain PyTorch ops: any device, any floating dtype.

Used where no flash kernel applies (CUDA float32, other devices). It materialises the score matrix
of one segment at a time, ``[Hq, Lq, Lk]``, so it is meant for moderate segment lengths. GQA is
handled by viewing the query heads as ``[Hkv, group]``: key/value heads are broadcast, not copied.
"""
from __future__ import annotations

import torch

from .base import VarlenSpec, check_shapes, lse_dtype


def _mask(lq: int, lk: int, causal: bool, device: torch.device) -> torch.Tensor | None:
    """Bottom-right causal mask ``[Lq, Lk]`` (True = visible), or None for full attention."""
    if not causal:
        return None
    i = torch.arange(lq, device=device).unsqueeze(1)
    j = torch.arange(lk, device=device).unsqueeze(0)
    return j <= i + (lk - lq)


def _scores(qs: torch.Tensor, ks: torch.Tensor, scale: float, acc: torch.dtype) -> torch.Tensor:
    """``[Lq, Hq, D] x [Lk, Hkv, D] -> [Hkv, g, Lq, Lk]`` scaled scores in ``acc`` dtype."""
    lq, hq, d = qs.shape
    hkv = ks.shape[1]
    qg = qs.to(acc).reshape(lq, hkv, hq // hkv, d).permute(1, 2, 0, 3)  # [Hkv, g, Lq, D]
    kg = ks.to(acc).permute(1, 0, 2).unsqueeze(1)  # [Hkv, 1, Lk, D]
    return torch.matmul(qg, kg.transpose(-1, -2)) * scale  # [Hkv, g, Lq, Lk]


class MathKernel:
    """Reference-quality varlen attention with explicit matmuls (see module docstring)."""

    name = "math"

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: VarlenSpec, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes: q ``[Nq, Hq, D]``, k/v ``[Nk, Hkv, D]`` -> out ``[Nq, Hq, D]``, lse ``[Nq, Hq]``."""
        check_shapes(q, k, v, spec)
        acc = lse_dtype(q.dtype)
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:2], float("-inf"), dtype=acc, device=q.device)
        hq = q.shape[1]
        for qa, qb, ka, kb in spec.segments():
            lq, lk = qb - qa, kb - ka
            if lq == 0 or lk == 0:
                continue
            s = _scores(q[qa:qb], k[ka:kb], scale, acc)  # [Hkv, g, Lq, Lk]
            m = _mask(lq, lk, spec.causal, q.device)
            if m is not None:
                s = s.masked_fill(~m, float("-inf"))
            l = torch.logsumexp(s, dim=-1)  # [Hkv, g, Lq]
            p = torch.exp(s - torch.where(torch.isinf(l), torch.zeros_like(l), l).unsqueeze(-1))
            vg = v[ka:kb].to(acc).permute(1, 0, 2).unsqueeze(1)  # [Hkv, 1, Lk, D]
            o = torch.matmul(p, vg)  # [Hkv, g, Lq, D]
            out[qa:qb] = o.permute(2, 0, 1, 3).reshape(lq, hq, -1).to(q.dtype)  # -> [Lq, Hq, D]
            lse[qa:qb] = l.permute(2, 0, 1).reshape(lq, hq)  # -> [Lq, Hq]
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
        """Flash-style backward from the final ``out``/``lse``: ``P = exp(S - lse)``,
        ``dS = P * (dO V^T - rowsum(dO * O))``."""
        acc = lse_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        hq, hkv = q.shape[1], k.shape[1]
        g = hq // hkv
        for qa, qb, ka, kb in spec.segments():
            lq, lk = qb - qa, kb - ka
            if lq == 0 or lk == 0:
                continue
            s = _scores(q[qa:qb], k[ka:kb], scale, acc)  # [Hkv, g, Lq, Lk]
            l = lse[qa:qb].to(acc).reshape(lq, hkv, g).permute(1, 2, 0)  # [Hkv, g, Lq]
            p = torch.exp(s - l.unsqueeze(-1))
            m = _mask(lq, lk, spec.causal, q.device)
            if m is not None:
                p = p.masked_fill(~m, 0.0)
            do = dout[qa:qb].to(acc).reshape(lq, hkv, g, -1).permute(1, 2, 0, 3)  # [Hkv, g, Lq, D]
            o = out[qa:qb].to(acc).reshape(lq, hkv, g, -1).permute(1, 2, 0, 3)  # [Hkv, g, Lq, D]
            vg = v[ka:kb].to(acc).permute(1, 0, 2).unsqueeze(1)  # [Hkv, 1, Lk, D]
            kg = k[ka:kb].to(acc).permute(1, 0, 2).unsqueeze(1)  # [Hkv, 1, Lk, D]
            qg = q[qa:qb].to(acc).reshape(lq, hkv, g, -1).permute(1, 2, 0, 3)  # [Hkv, g, Lq, D]
            dp = torch.matmul(do, vg.transpose(-1, -2))  # [Hkv, g, Lq, Lk]
            delta = (do * o).sum(-1, keepdim=True)  # [Hkv, g, Lq, 1]
            ds = p * (dp - delta) * scale
            dq[qa:qb] += torch.matmul(ds, kg).permute(2, 0, 1, 3).reshape(lq, hq, -1)  # -> [Lq, Hq, D]
            dk[ka:kb] += torch.matmul(ds.transpose(-1, -2), qg).sum(1).permute(1, 0, 2)  # -> [Lk, Hkv, D]
            dv[ka:kb] += torch.matmul(p.transpose(-1, -2), do).sum(1).permute(1, 0, 2)  # -> [Lk, Hkv, D]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
