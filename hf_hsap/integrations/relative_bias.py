"""Attention with a per-query relative position bias (Inkling 2's), exact on packed rows and under SP.

Inkling 2's attention layers add to each score a bias that depends on the query token and on the backward distance
``d = position_q - position_k``: ``logits[q, h, d]`` for ``0 <= d < extent``, 0 beyond (``extent`` is
``rel_extent`` in the full layers, the window in the sliding ones), and a per-query sink logit (one extra softmax
column with a zero value). The model hands the attention function the bias as a dense ``[B, H, Lq, Lk]`` tensor
built from the row's indices, which is wrong on a packed row (distances across documents) and under SP (local
indices). :func:`prepare_relative_bias` replaces, per instance and only while the model runs with
``attn_implementation="hsap"``, the bias module's forward by one that returns the per-query table
:class:`RelativeLogits` (``[B, H, Lq, extent]``, the model's own computation asked for the distances
``0 .. extent - 1``); :func:`relative_forward` then applies it from each token's document and position in it.

No SAP kernel takes a per-query bias table, so this path computes the attention in torch (float math of the
inputs' dtype, autograd gives every gradient: q, k, v, the table, the sinks). Under SP each rank gathers the
row's keys and values in global order (its backward sums the key/value gradients back to their ranks):
exact, but every rank holds the group's keys and values of these layers (logged once), as for the indexed
layers (:mod:`.indexed`, whose gather this path shares).
"""
from __future__ import annotations

import logging
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..log import get_logger, log_once
from ..model_state import DEPTH, ModelChanges
from ..plan.plan import Plan
from .indexed import _GatherTokens
from .local_layout import document_ids
from ..data.positions import document_starts

__all__ = ["DEPTH", "RelativeLogits", "biased_attention", "depth_forward", "prepare_relative_bias",
           "relative_forward"]

logger = get_logger(__name__)

QUERY_CHUNK = 512  # queries per dense score block (memory: heads x chunk x keys of the chunk's documents)


@dataclass(frozen=True)
class RelativeLogits:
    """A per-query relative position bias table (what the prepared bias module returns under ``"hsap"``).

    Args:
        logits: ``[B, H, Lq, extent]``: the bias query ``q`` of head ``h`` adds to a key ``d`` tokens back in its
            document (``0 <= d < extent``); keys further back get no bias.
        extent: the table's width.
    """

    logits: torch.Tensor
    extent: int


def _is_bias_module(m: torch.nn.Module) -> bool:
    return (type(m).__name__.endswith("RelativePositionBias") and hasattr(m, "proj") and hasattr(m, "rel_extent")
            and hasattr(m, "linear") and hasattr(m, "norm"))


def prepare_relative_bias(model: torch.nn.Module, changes: ModelChanges) -> int:
    """Make the model's relative-position-bias modules return :class:`RelativeLogits` under ``"hsap"``.

    Args:
        model: a Transformers model.
        changes: the preparation's journal (``undo()`` restores the forwards).

    Returns:
        How many modules were prepared.
    """
    owners = {}
    for parent in model.modules():
        for child in parent.children():
            if _is_bias_module(child) and getattr(parent, "config", None) is not None:
                owners[id(child)] = parent.config
    count = 0
    for m in model.modules():
        if type(m).__name__.endswith("AttentionResidual") and getattr(m, "is_causal", None) is False:
            changes.put(m, DEPTH, True)  # queries and keys are one token's layer states: see depth_forward
        if not _is_bias_module(m) or id(m) not in owners:
            continue
        changes.set(m, "forward", types.MethodType(_table_forward(owners[id(m)]), m))
        count += 1
    if count:
        logger.info("prepare_relative_bias: %d relative position bias modules hand hsap attention their per-query "
                    "tables", count)
    return count


def _table_forward(config: Any) -> Any:
    def forward(self: torch.nn.Module, hidden_states: torch.Tensor, relative_distance: torch.Tensor,
                position_ids: torch.Tensor) -> Any:
        orig = type(self).forward
        if getattr(config, "_attn_implementation", None) != "hsap":
            return orig(self, hidden_states, relative_distance, position_ids)
        extent = int(self.rel_extent)
        # the model's own bias for the distances 0 .. extent - 1 of every query: its table [B, H, Lq, extent]
        ladder = torch.arange(extent, device=hidden_states.device).expand(hidden_states.shape[1], extent)
        return RelativeLogits(orig(self, hidden_states, ladder, position_ids), extent)

    return forward


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
        ``(out [Tq, Hq, Dv], lse [Tq, Hq])``; the lse of the biased scores, the sink included; a query that sees
        nothing has output 0 and lse ``-inf``.
    """
    tq, hq, _ = q.shape
    hkv, extent = k.shape[1], table.shape[-1]
    group = hq // hkv
    outs, lses = [], []
    for s in range(0, tq, chunk):
        e = min(tq, s + chunk)
        qd, qp = q_doc[s:e], q_pos[s:e]
        keys = torch.nonzero(torch.isin(k_doc, qd[qd >= 0])).flatten()
        kd, kp = k_doc[keys], k_pos[keys]
        kc, vc = k[keys], v[keys]  # [Kc, Hkv, D]
        qc = q[s:e].reshape(e - s, hkv, group, -1)  # [n, Hkv, G, D]
        scores = torch.einsum("nhgd,khd->hgnk", qc, kc).reshape(hq, e - s, len(keys)) * scale  # [Hq, n, Kc]
        dist = qp[:, None] - kp[None, :]  # [n, Kc]
        seen = (qd[:, None] == kd[None, :]) & (qd[:, None] >= 0) & (dist >= 0)
        if window is not None:
            seen &= dist < window
        near = dist.clamp(0, extent - 1).expand(hq, -1, -1)  # [Hq, n, Kc]
        bias = table[s:e].transpose(0, 1).gather(-1, near)  # [Hq, n, Kc]
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


def _positions_of(doc: torch.Tensor) -> torch.Tensor:
    """``[N]`` position of each token in its document (tokens of a document contiguous)."""
    idx = torch.arange(doc.numel(), device=doc.device)
    start = torch.ones_like(doc, dtype=torch.bool)
    start[1:] = doc[1:] != doc[:-1]
    return idx - torch.where(start, idx, torch.zeros_like(idx)).cummax(0).values


def _local_documents(batch: int, length: int, *, attention_mask: torch.Tensor | None, ids_mask: bool,
                     position_ids: torch.Tensor | None, cu_seq_lens_q: torch.Tensor | None,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Document (``-1`` padding, distinct across rows) and position of every token of ``B`` rows, flattened."""
    if ids_mask:
        ids = attention_mask.long()
    else:
        starts = torch.zeros(batch, length, dtype=torch.bool, device=device)
        starts[:, 0] = True
        if cu_seq_lens_q is not None:
            flat = starts.view(-1)
            flat[torch.as_tensor(cu_seq_lens_q)[:-1].long().to(device)] = True
        elif position_ids is not None and length > 1:
            pos = torch.as_tensor(position_ids).to(device)
            pos = pos[0] if pos.dim() == 3 else pos  # [3/4, B, L] multimodal positions: the first axis
            starts |= document_starts(pos.expand(batch, length))
        valid = attention_mask.bool().to(device) if attention_mask is not None and attention_mask.dim() == 2 else None
        ids = document_ids(starts, valid).long()
    doc = (ids - 1) + torch.arange(batch, device=device)[:, None] * (length + 1)
    doc = torch.where(ids > 0, doc, torch.full_like(doc, -1)).reshape(-1)
    return doc, _positions_of(doc)


def _plan_documents(plan: Plan, idx: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Document and position of the row's tokens ``idx`` (global indices)."""
    cu = np.asarray(plan.layout.cu_seqlens)
    doc = np.searchsorted(cu, idx, side="right") - 1
    return (torch.as_tensor(doc, dtype=torch.long, device=device),
            torch.as_tensor(idx - cu[doc], dtype=torch.long, device=device))


def relative_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, *, bias: RelativeLogits, sinks: torch.Tensor | None,
                     scaling: float | None, window: int | None, plan: Plan | None, ids_mask: bool,
                     position_ids: torch.Tensor | None, cu_seq_lens_q: torch.Tensor | None) -> torch.Tensor:
    """The ``"hsap"`` attention of a layer with a per-query relative bias (module docstring).

    Args:
        module: the calling attention layer.
        query: ``[B, Hq, L, D]``. key, value: ``[B, Hkv, L, D]`` (no KV cache).
        attention_mask: the mask function's ids, a 2D padding mask or ``None``.
        bias: the layer's :class:`RelativeLogits` (``[B, Hq, L, E]``).
        sinks: ``[B, Hq, L, 1]`` per-query sink logits, or ``None``.
        scaling: softmax scale (``D ** -0.5`` when ``None``). window: the layer's sliding window, or ``None``.
        plan: the batch's plan (its layout gives the documents; SP size > 1: the group's keys are gathered).
        ids_mask: whether ``attention_mask`` holds document ids.
        position_ids, cu_seq_lens_q: the documents without a plan.

    Returns:
        ``[B, L, Hq, Dv]``.
    """
    b, hq, length, d = query.shape
    if key.shape[2] != length:
        raise ValueError(f"hsap attention with a relative position bias ({type(module).__name__}) runs without a KV "
                         "cache (training, prefill): got "
                         f"{length} queries and {key.shape[2]} keys; generate with attn_implementation='eager'")
    scale = d ** -0.5 if scaling is None else scaling
    q = query.transpose(1, 2).reshape(b * length, hq, d)
    k = key.transpose(1, 2).reshape(b * length, key.shape[1], d)
    v = value.transpose(1, 2).reshape(b * length, value.shape[1], value.shape[-1])
    table = bias.logits.transpose(1, 2).reshape(b * length, hq, -1)
    snk = None if sinks is None else sinks[..., 0].transpose(1, 2).reshape(b * length, hq)
    if plan is not None:
        if b != 1:
            raise ValueError(f"hsap_plan needs one row of local tokens, got {b} rows")
        q_doc, q_pos = _plan_documents(plan, plan.local_token_indices(plan.rank if plan.size > 1 else 0).numpy(),
                                       q.device)
    else:
        q_doc, q_pos = _local_documents(b, length, attention_mask=attention_mask, ids_mask=ids_mask,
                                        position_ids=position_ids, cu_seq_lens_q=cu_seq_lens_q, device=q.device)
    k_doc, k_pos = q_doc, q_pos
    if plan is not None and plan.size > 1:
        log_once(logger, logging.INFO, "relative bias gather",
                 "hsap attention: %s adds a per-query relative position bias, which no SAP kernel takes: its keys "
                 "and values are gathered over the SP group (exact; each rank holds the group's keys and values of "
                 "these layers)", type(module).__name__)
        # the row's keys and values in global order (the backward sums every rank's gradient, keeps this rank's)
        k = _GatherTokens.apply(key, plan)[0].transpose(0, 1)  # [1, Hkv, T, D] -> [T, Hkv, D]
        v = _GatherTokens.apply(value, plan)[0].transpose(0, 1)
        k_doc, k_pos = _plan_documents(plan, np.arange(plan.total_tokens), q.device)
    out, _ = biased_attention(q, k, v, table, q_doc=q_doc, q_pos=q_pos, k_doc=k_doc, k_pos=k_pos, scale=scale,
                              window=window, sinks=snk)
    return out.reshape(b, length, hq, -1)
