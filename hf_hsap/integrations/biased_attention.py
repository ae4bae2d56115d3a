"""The torch attention of :mod:`.relative_bias`: causal per document with a per-query relative position bias table
and per-query sinks (no SAP kernel takes a per-query table), and Inkling 2's attention residuals (depth attention,
no token mixing). Plain torch: autograd gives every gradient (q, k, v, the table, the sinks)."""
from __future__ import annotations

import torch

__all__ = ["QUERY_CHUNK", "biased_attention", "depth_forward"]

QUERY_CHUNK = 512  # queries per dense score block (memory: heads x chunk x keys of the chunk's documents)


def depth_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None
                  ) -> torch.Tensor:
    """Inkling 2's attention residuals: learned queries over each token's stack of layer states (the call's
    "heads" axis is the tokens, its keys one token's states), so no token mixing and no document rule; plain
    softmax attention, as eager computes it.

    Args:
        query: ``[B, L, Nq, D]``. key, value: ``[B, L, Nk, D]``. scaling: softmax scale (``D ** -0.5``: ``None``).

    Returns:
        ``[B, Nq, L, D]`` (eager's transposed output).
    """
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    weights = torch.softmax(torch.matmul(query, key.transpose(2, 3)) * scale, dim=-1).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous()


def biased_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, *,
                     q_doc: torch.Tensor, q_pos: torch.Tensor, k_doc: torch.Tensor, k_pos: torch.Tensor,
                     scale: float, window: int | None = None, sinks: torch.Tensor | None = None,
                     chunk: int = QUERY_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention per document with a per-query relative bias table and per-query sinks (plain torch).

    A query sees the keys of its document (same ``doc``, ``doc >= 0``) at distance ``0 <= d`` (``d < window``
    with a window); the score is ``scale * q.k + table[q, h, d]`` (``d < extent``; 0 beyond). A sink joins each
    query's softmax as one more logit with a zero value.

    Args:
        q: ``[Tq, Hq, D]``. k: ``[Tk, Hkv, D]``. v: ``[Tk, Hkv, Dv]`` (``Hq % Hkv == 0``).
        table: ``[Tq, Hq, E]`` bias per query, head and distance.
        q_doc, q_pos: ``[Tq]`` int64 document (``-1``: padding, output 0) and position in it of each query.
        k_doc, k_pos: ``[Tk]`` the same for the keys.
        scale: softmax scale. window: Transformers' sliding window (keys ``d < window``), or ``None``.
        sinks: ``[Tq, Hq]`` sink logits, or ``None``.
        chunk: queries per dense score block.

    Returns:
        ``(out [Tq, Hq, Dv], lse [Tq, Hq])``; the lse of the biased scores, the sink included (float32 at least); a
        query that sees nothing has output 0 and lse ``-inf``.
    """
    tq, hq, _ = q.shape
    hkv, extent = k.shape[1], table.shape[-1]
    acc = torch.promote_types(q.dtype, torch.float32)  # scores, softmax and the sum over values: float32 at least
    group = hq // hkv
    outs, lses = [], []
    for s in range(0, tq, chunk):
        e = min(tq, s + chunk)
        qd, qp = q_doc[s:e], q_pos[s:e]
        keys = torch.nonzero(torch.isin(k_doc, qd[qd >= 0])).flatten()
        kd, kp = k_doc[keys], k_pos[keys]
        kc, vc = k[keys], v[keys]  # [Kc, Hkv, D]
        qc = q[s:e].reshape(e - s, hkv, group, -1)  # [n, Hkv, G, D]
        scores = torch.einsum("nhgd,khd->hgnk", qc, kc).reshape(hq, e - s, len(keys)).to(acc) * scale  # [Hq, n, Kc]
        dist = qp[:, None] - kp[None, :]  # [n, Kc]
        seen = (qd[:, None] == kd[None, :]) & (qd[:, None] >= 0) & (dist >= 0)
        if window is not None:
            seen &= dist < window
        near = dist.clamp(0, extent - 1).expand(hq, -1, -1)  # [Hq, n, Kc]
        bias = table[s:e].transpose(0, 1).gather(-1, near).to(acc)  # [Hq, n, Kc]
        scores = scores + bias.masked_fill(dist >= extent, 0.0)
        scores = scores.masked_fill(~seen, float("-inf"))
        if sinks is not None:
            scores = torch.cat([scores, sinks[s:e].transpose(0, 1).unsqueeze(-1).to(scores.dtype)], dim=-1)
        lse = torch.logsumexp(scores, dim=-1)  # [Hq, n]
        probs = torch.exp(scores - lse.masked_fill(torch.isinf(lse), 0.0).unsqueeze(-1))  # 0 where nothing seen
        if sinks is not None:
            probs = probs[..., :-1]
        out = torch.einsum("hgnk,khd->nhgd", probs.reshape(hkv, group, e - s, len(keys)), vc.to(probs.dtype))
        outs.append(out.reshape(e - s, hq, -1))
        lses.append(lse.transpose(0, 1))
    return torch.cat(outs).to(q.dtype), torch.cat(lses)
