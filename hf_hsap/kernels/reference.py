"""Float64 single-process reference of document-masked causal attention (for tests and checks)."""
from __future__ import annotations

import torch


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor | list[int],
    softmax_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense document-masked causal attention in float64, differentiable by autograd.

    Args:
        q: ``[T, Hq, D]`` queries of the whole packed sequence, in global order.
        k: ``[T, Hkv, D]`` keys; ``Hq % Hkv == 0`` (GQA by repeating heads: fine for a reference).
        v: ``[T, Hkv, D]`` values.
        cu_seqlens: ``[n_docs + 1]`` document boundaries, from 0 to T.
        softmax_scale: defaults to ``D ** -0.5``.

    Returns:
        ``(out [T, Hq, D], lse [T, Hq])`` in float64.
    """
    cu = [int(x) for x in (cu_seqlens.tolist() if torch.is_tensor(cu_seqlens) else cu_seqlens)]
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    qd, kd, vd = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    kd = kd.repeat_interleave(g, dim=1)  # [T, Hq, D]
    vd = vd.repeat_interleave(g, dim=1)
    outs, lses = [], []
    for a, b in zip(cu, cu[1:]):
        s = torch.einsum("ihd,jhd->hij", qd[a:b], kd[a:b]) * scale  # [Hq, L, L]
        mask = torch.ones(b - a, b - a, dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # [Hq, L]
        outs.append(torch.einsum("hij,jhd->ihd", torch.softmax(s, dim=-1), vd[a:b]))
        lses.append(lse.transpose(0, 1))
    return torch.cat(outs), torch.cat(lses)


def reference_varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec, softmax_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense float64 attention over the segments of a varlen call (the kernels' contract), differentiable.

    Args:
        q: ``[Nq, Hq, D]``; k, v: ``[Nk, Hkv, D]`` (any device and floating dtype).
        spec: a :class:`~hf_hsap.kernels.base.VarlenSpec`; ``causal`` is bottom-right aligned.
        softmax_scale: defaults to ``D ** -0.5``.

    Returns:
        ``(out [Nq, Hq, D], lse [Nq, Hq])`` in float64; a query that sees no key has output 0 and
        lse ``-inf``.
    """
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    qd, kd, vd = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for qa, qb, ka, kb in spec.segments():
        lq, lk = qb - qa, kb - ka
        s = torch.einsum("ihd,jhd->hij", qd[qa:qb], kd[ka:kb].repeat_interleave(g, 1)) * scale  # [Hq, Lq, Lk]
        if spec.causal:
            vis = (torch.arange(lk, device=q.device)[None, :]
                   <= torch.arange(lq, device=q.device)[:, None] + (lk - lq))  # [Lq, Lk]
            s = s.masked_fill(~vis, float("-inf"))
        lse = torch.logsumexp(s, -1)  # [Hq, Lq]
        p = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(s), torch.exp(s - lse[..., None]))
        outs.append(torch.einsum("hij,jhd->ihd", p, vd[ka:kb].repeat_interleave(g, 1)))
        lses.append(lse.transpose(0, 1))
    return torch.cat(outs), torch.cat(lses)
