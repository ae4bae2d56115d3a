"""Float64 single-process references of document-masked attention (for tests and checks).

Both are dense and differentiable by autograd, and written independently of the kernels: masks from
positions, soft-capping as Gemma 2's eager attention (divide by the cap, tanh, multiply), sinks as GPT-OSS's
eager attention (one extra softmax column per head, dropped after the softmax).
"""
from __future__ import annotations

import torch


def _softmax_parts(s: torch.Tensor, vis: torch.Tensor | None, softcap: float | None,
                   sinks: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities and lse of scaled scores ``s [H, Lq, Lk]`` (float64) under mask ``vis [Lq, Lk]``.

    Returns:
        ``p [H, Lq, Lk]`` (0 for a row that sees nothing and has no sink) and ``lse [H, Lq]`` (sink included).
    """
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    if vis is not None:
        s = s.masked_fill(~vis, float("-inf"))
    if sinks is not None:
        col = sinks.double().reshape(-1, 1, 1).expand(s.shape[0], s.shape[1], 1)  # [H, Lq, 1]
        s = torch.cat([s, col], dim=-1)  # [H, Lq, Lk + 1]
    lse = torch.logsumexp(s, dim=-1)  # [H, Lq]
    p = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(s), torch.exp(s - lse[..., None]))
    return (p[..., :-1] if sinks is not None else p), lse


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor | list[int],
    softmax_scale: float | None = None,
    *,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense document-masked causal attention in float64, differentiable by autograd.

    Args:
        q: ``[T, Hq, D]`` queries of the whole packed sequence, in global order.
        k: ``[T, Hkv, D]`` keys; ``Hq % Hkv == 0`` (GQA by repeating heads: fine for a reference).
        v: ``[T, Hkv, D]`` values.
        cu_seqlens: ``[n_docs + 1]`` document boundaries, from 0 to T.
        softmax_scale: defaults to ``D ** -0.5``.
        window: Transformers' ``sliding_window``: a query at position ``i`` of its document sees the keys
            ``i - window < j <= i``; ``None``: all ``j <= i``.
        softcap: scores ``softcap * tanh(score / softcap)``; ``None``: none.
        sinks: ``[Hq]`` sink logits (an extra softmax column per head); ``None``: none.

    Returns:
        ``(out [T, Hq, D], lse [T, Hq])`` in float64 (lse with the sink).
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
        pos = torch.arange(b - a, device=q.device)
        q_idx, kv_idx = pos[:, None], pos[None, :]
        vis = kv_idx <= q_idx
        if window is not None:
            vis = vis & (kv_idx > q_idx - window)
        p, lse = _softmax_parts(s, vis, softcap, sinks)
        outs.append(torch.einsum("hij,jhd->ihd", p, vd[a:b]))
        lses.append(lse.transpose(0, 1))
    return torch.cat(outs), torch.cat(lses)


def reference_varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec, softmax_scale: float | None = None, *,
    softcap: float | None = None, sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense float64 attention over the segments of a varlen call (the kernels' contract), differentiable.

    Args:
        q: ``[Nq, Hq, D]``; k, v: ``[Nk, Hkv, D]`` (any device and floating dtype).
        spec: a :class:`~hf_hsap.kernels.base.VarlenSpec`; ``causal`` and ``window_left`` are bottom-right
            aligned (query ``i`` of a segment sees key ``j`` iff ``j <= i + Lk - Lq`` when causal and
            ``j >= i + Lk - Lq - window_left`` when there is a window).
        softmax_scale: defaults to ``D ** -0.5``.
        softcap: scores ``softcap * tanh(score / softcap)``; sinks: ``[Hq]`` extra softmax columns.

    Returns:
        ``(out [Nq, Hq, D], lse [Nq, Hq])`` in float64; a query that sees no key has output 0 and
        lse ``-inf`` (the sink's logit with sinks).
    """
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    w = getattr(spec, "window_left", None)
    qd, kd, vd = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for qa, qb, ka, kb in spec.segments():
        lq, lk = qb - qa, kb - ka
        s = torch.einsum("ihd,jhd->hij", qd[qa:qb], kd[ka:kb].repeat_interleave(g, 1)) * scale  # [Hq, Lq, Lk]
        p_al = torch.arange(lq, device=q.device)[:, None] + (lk - lq)  # [Lq, 1] aligned key position
        j = torch.arange(lk, device=q.device)[None, :]  # [1, Lk]
        vis = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
        if spec.causal:
            vis &= j <= p_al
        if w is not None:
            vis &= j >= p_al - w
        p, lse = _softmax_parts(s, vis, softcap, sinks)
        outs.append(torch.einsum("hij,jhd->ihd", p, vd[ka:kb].repeat_interleave(g, 1)))
        lses.append(lse.transpose(0, 1))
    return torch.cat(outs), torch.cat(lses)
