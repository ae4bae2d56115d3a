"""Attention with a per-query relative position bias (Inkling, Inkling 2), exact on packed rows and under SP.

These layers add to each score a bias that depends on the query token and on the backward distance
``d = position_q - position_k``: ``table[q, h, d]`` for ``0 <= d < extent``, 0 beyond (``extent`` is ``rel_extent``
in the full layers, the window in the sliding ones); Inkling 2 adds a per-query sink logit (one more softmax
column with a zero value). The model hands the attention function the bias as a dense ``[B, H, Lq, Lk]`` tensor
built from the row's indices: O(L^2), and wrong on a packed row (distances across documents) and under SP (local
indices). :func:`prepare_relative_bias` replaces, per instance and only while the model runs with
``attn_implementation="hsap"``, the bias module's forward by one that returns the per-query table
``[B, H, Lq, extent]`` (the model's own computation, asked for the distances ``0 .. extent - 1``) and marks the
attention layer (``RELATIVE_BIAS``: the table's width); :func:`relative_forward` then applies the table from each
token's document and position in it (:func:`~.biased_attention.biased_attention`).

Inkling (v1) also scales a full layer's queries and bias by ``1 + alpha * log(max((n + 1) / n_floor, 1))`` with
``n`` the row index (``torch.arange`` in its forward) when ``log_scaling_n_floor`` is set: both are rescaled here to
each token's document position (as :mod:`.temperature` does for Llama 4). Inkling 2 scales by ``position_ids``.

No SAP kernel takes a per-query bias table, so this path computes the attention in torch (float math of the
inputs' dtype; autograd gives every gradient: q, k, v, the table, the sinks). Under SP each rank gathers the row's
keys and values in global order (its backward sums the key/value gradients back to their ranks): exact, but every
rank holds the row's keys and values of these layers (logged once), as for the indexed layers (:mod:`.indexed`,
whose gather this path shares).
"""
from __future__ import annotations

import logging
import types
from typing import Any

import numpy as np
import torch

from ..data.positions import document_starts
from ..log import get_logger, log_once
from ..model_state import DEPTH, RELATIVE_BIAS, ModelChanges, state_of
from ..plan.plan import Plan
from .biased_attention import biased_attention
from .indexed import _GatherTokens
from .local_layout import document_ids
from .plan_use import plan_use_of

__all__ = ["check_unprepared_bias", "prepare_relative_bias", "relative_bias_extent", "relative_forward"]

logger = get_logger(__name__)


def _bias_kind(m: torch.nn.Module) -> str | None:
    """``"hidden"`` for Inkling 2's bias module (``(hidden_states, relative_distance, position_ids)``), ``"states"``
    for Inkling's (``(relative_states, query_positions, key_positions)``), else ``None``."""
    if not (hasattr(m, "proj") and hasattr(m, "rel_extent")):
        return None
    name = type(m).__name__
    if name.endswith("RelativePositionBias") and hasattr(m, "linear") and hasattr(m, "norm"):
        return "hidden"
    if name.endswith("RelativeLogits"):
        return "states"
    return None


def prepare_relative_bias(model: torch.nn.Module, changes: ModelChanges) -> int:
    """Make the model's relative-position-bias modules return their per-query table under ``"hsap"`` and mark their
    attention layers (``RELATIVE_BIAS``); mark Inkling 2's attention residuals (``DEPTH``).

    Args:
        model: a Transformers model.
        changes: the preparation's journal (``undo()`` restores the forwards and drops the marks).

    Returns:
        How many bias modules were prepared.
    """
    count = 0
    for parent in model.modules():
        if type(parent).__name__.endswith("AttentionResidual") and getattr(parent, "is_causal", None) is False:
            changes.put(parent, DEPTH, True)  # queries and keys are one token's layer states: see depth_forward
        config = getattr(parent, "config", None)
        for child in parent.children():
            kind = _bias_kind(child)
            if kind is None or config is None:
                continue
            changes.set(child, "forward", types.MethodType(_table_forward(config, kind), child))
            changes.put(parent, RELATIVE_BIAS, int(child.rel_extent))
            count += 1
    if count:
        logger.info("prepare_relative_bias: %d relative position bias modules hand hsap attention their per-query "
                    "tables", count)
    return count


def _table_forward(config: Any, kind: str) -> Any:
    def forward(self: torch.nn.Module, states: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> Any:
        orig = type(self).forward
        if getattr(config, "_attn_implementation", None) != "hsap":
            return orig(self, states, first, second)
        extent, length, device = int(self.rel_extent), states.shape[1], states.device
        # the model's own bias at the distances 0 .. extent - 1 of every query: its table [B, H, Lq, extent]
        ladder = torch.arange(extent, device=device)
        if kind == "hidden":  # (hidden_states, relative_distance [Lq, Lk], position_ids)
            return orig(self, states, ladder.expand(length, extent), second)
        # (relative_states, query_positions, key_positions): distance = query - key
        return orig(self, states, torch.full((length,), extent - 1, device=device), extent - 1 - ladder)

    return forward


def relative_bias_extent(module: torch.nn.Module, position_bias: Any) -> int | None:
    """The table width of a prepared layer's call (its ``position_bias`` is then its table), else ``None``."""
    extent = state_of(module, RELATIVE_BIAS)
    return extent if extent is not None and torch.is_tensor(position_bias) else None


def check_unprepared_bias(module: torch.nn.Module, position_bias: Any, sinks: Any) -> None:
    """Refuse a relative-bias layer's call that ``prepare_model`` did not prepare (its dense bias is built from the
    row's indices) and per-query ``sinks`` outside a prepared layer (no other path applies them)."""
    prepared = state_of(module, RELATIVE_BIAS) is not None
    if not prepared and position_bias is not None and any(_bias_kind(c) for c in module.children()):
        raise ValueError(f"{type(module).__name__} adds a relative position bias its model builds from the row's "
                         "indices: call hf_hsap.prepare_model(model, sp_size=...) once before the first forward (the "
                         "trainers do); it makes the bias per document")
    if not prepared and sinks is not None:
        raise ValueError(f"attn_implementation='hsap' takes per-query `sinks` only from a relative-bias layer "
                         f"prepared by hf_hsap.prepare_model, but {type(module).__name__} passes them; use "
                         "attn_implementation='eager' for this model")


def _log_scale(module: torch.nn.Module, positions: torch.Tensor) -> torch.Tensor:
    """Inkling's full-layer scale at ``positions`` (float32, as its forward computes it)."""
    config = module.config
    n = (positions + 1).float()
    return 1.0 + config.log_scaling_alpha * torch.log((n / config.log_scaling_n_floor).clamp(min=1.0))


def _row_scaled(module: torch.nn.Module) -> bool:
    """Whether the layer scales its queries and bias by the row index (Inkling's full layers with log scaling)."""
    config = getattr(module, "config", None)
    return (hasattr(module, "rel_logits_proj") and not getattr(module, "is_sliding", True)
            and getattr(config, "log_scaling_n_floor", None) is not None)


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
                     attention_mask: torch.Tensor | None, *, table: torch.Tensor, sinks: torch.Tensor | None,
                     scaling: float | None, window: int | None, plan: Plan | None, ids_mask: bool,
                     position_ids: torch.Tensor | None, cu_seq_lens_q: torch.Tensor | None,
                     plan_use: Any = None) -> torch.Tensor:
    """The ``"hsap"`` attention of a layer with a per-query relative bias (module docstring).

    Args:
        module: the calling attention layer.
        query: ``[B, Hq, L, D]``. key, value: ``[B, Hkv, L, D]`` (no KV cache).
        attention_mask: the mask function's ids, a 2D padding mask or ``None``.
        table: the layer's bias table ``[B, Hq, L, E]`` (from its prepared bias module).
        sinks: ``[B, Hq, L, 1]`` per-query sink logits, or ``None``.
        scaling: softmax scale (``D ** -0.5`` when ``None``). window: the layer's sliding window, or ``None``.
        plan: the batch's plan (its layout gives the documents; SP size > 1: the group's keys are gathered).
        ids_mask: whether ``attention_mask`` holds document ids.
        position_ids, cu_seq_lens_q: the documents without a plan.
        plan_use: the call's ``hsap_plan_use`` (a continued document's first position, for Inkling's log scale).

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
    table = table.transpose(1, 2).reshape(b * length, hq, -1)
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
    if _row_scaled(module):  # Inkling: queries and table scaled by the row index -> by the document position
        first = 0
        if plan is not None and plan.size > 1:
            use = plan_use_of(plan, plan_use)
            if use is not None and use.first_positions is not None:
                first = torch.as_tensor(use.first_positions, device=q.device)[q_doc]
        rows = torch.arange(length, device=q.device).repeat(b)
        ratio = (_log_scale(module, q_pos + first).double() / _log_scale(module, rows).double())
        ratio = ratio.to(torch.promote_types(q.dtype, torch.float32))[:, None, None]  # [N, 1, 1]
        q, table = (q * ratio).to(q.dtype), (table * ratio).to(table.dtype)
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
