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
