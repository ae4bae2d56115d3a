"""Llama 4's attention temperature on packed rows: each token's scale from its document position, not its row index.

Llama 4's NoPE layers (``attn_temperature_tuning`` and no rotary embedding) multiply the queries by
``log1p(floor((t + 1) / floor_scale)) * attn_scale + 1`` where ``t`` is the index in the row (``arange`` of the
call's length plus the cached tokens): the position of a document run alone, but on a packed row (or a rank's
shard under SP) a later document's tokens get their row index instead. Transformers does so on packed rows too;
the two differ from ``floor_scale - 1`` tokens on (8191 in the released configs). :func:`fix_temperature` rescales
such a layer's queries by ``scale(position) / scale(row index)`` where the call's document positions are known and
differ: the batch plan's (``shard_batch``, any SP size; a continued document from its first position), else a
packed row's ``position_ids`` / ``cu_seq_lens_q`` / the mask function's document ids. The scale is computed as the
layer does (float32, then multiplied into the queries), so no model code is edited.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..plan.plan import Plan
from .chunked_attention import layer_chunk_size
from .model_check import UnsupportedModelError
from .plan_use import plan_use_of

__all__ = ["fix_temperature", "temperature_scale"]


def temperature_scale(module: torch.nn.Module, positions: torch.Tensor) -> torch.Tensor:
    """The layer's query scale at ``positions`` (float32, as Llama 4 computes it). Shapes: ``[...] -> [...]``."""
    return torch.log1p(torch.floor((positions.float() + 1.0) / module.floor_scale)) * module.attn_scale + 1.0


def _tuned(module: torch.nn.Module) -> bool:
    """Whether the layer scales its queries by their row index (Llama 4's NoPE layers)."""
    return bool(getattr(module, "attn_temperature_tuning", False)) and not getattr(module, "use_rope", True) \
        and hasattr(module, "floor_scale") and hasattr(module, "attn_scale")  # use_rope: no_rope_layers' 0 / 1


def _plan_positions(plan: Plan, first_positions: np.ndarray | None, device: torch.device) -> torch.Tensor:
    """``[1, T_local]`` positions of this rank's tokens in their documents (a continued document from its first
    position)."""
    idx = plan.local_token_indices(0 if plan.size == 1 and plan.rank is None else None).numpy()  # [T_local]
    cu = plan.layout.cu_seqlens
    doc = plan.layout.doc_of(idx)
    pos = idx - cu[doc] + (first_positions[doc] if first_positions is not None else 0)
    return torch.from_numpy(pos).to(device).unsqueeze(0)


def _offsets(starts: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` index of each token since its row's last True in ``starts`` (column 0 True)."""
    col = torch.arange(starts.shape[1], device=starts.device).expand_as(starts)
    return col - torch.cummax(torch.where(starts, col, torch.zeros_like(col)), dim=1).values


def _local_positions(module: torch.nn.Module, batch: int, length: int, *, attention_mask: torch.Tensor | None,
                     ids_mask: bool, position_ids: torch.Tensor | None,
                     cu_seq_lens_q: torch.Tensor | None) -> torch.Tensor | None:
    """``[B, L]`` document positions of a packed single-device call, ``None`` when the call holds one document per
    row (then the row index is the layer's own answer)."""
    if cu_seq_lens_q is not None:
        flat = torch.zeros(batch * length, dtype=torch.bool, device=cu_seq_lens_q.device)
        flat[cu_seq_lens_q[:-1].long()] = True
        starts = flat.view(batch, length)
        starts[:, 0] = True
        return _offsets(starts) if bool(starts[:, 1:].any()) else None
    if position_ids is not None and position_ids.dim() == 2 and position_ids.shape[-1] == length:
        pos = position_ids.expand(batch, -1)
        packed = bool((pos[:, 1:] - pos[:, :-1] != 1).any())
        return pos if packed else None
    if ids_mask and attention_mask is not None:
        starts = torch.ones_like(attention_mask, dtype=torch.bool)
        starts[:, 1:] = attention_mask[:, 1:] != attention_mask[:, :-1]
        if not bool(starts[:, 1:].any()):
            return None
        if layer_chunk_size(module) is not None:  # the ids cut documents at chunks too: no document positions
            raise UnsupportedModelError(
                f"{type(module).__name__} (layer {module.layer_idx}) is a chunked layer with Llama 4's attention "
                "temperature on a packed row, and its documents cannot be told from its chunks here; pass the batch "
                "through hf_hsap.shard_batch(batch, sp) (sp=1 on one process), or position_ids to the attention")
        return _offsets(starts)
    return None


def fix_temperature(module: torch.nn.Module, query: torch.Tensor, *, plan: Plan | None, plan_use: Any,
                    attention_mask: torch.Tensor | None, ids_mask: bool, position_ids: torch.Tensor | None,
                    cu_seq_lens_q: torch.Tensor | None, keys: int) -> torch.Tensor:
    """``query`` with a temperature-tuned layer's row-index scale replaced by each token's document-position scale.

    Args:
        module: the calling attention layer (read: ``attn_temperature_tuning``, ``use_rope``, ``floor_scale``,
            ``attn_scale``).
        query: ``[B, Hq, Lq, D]``, scaled by the layer.
        plan, plan_use: the call's ``hsap_plan`` and ``hsap_plan_use`` (or ``None``).
        attention_mask, ids_mask, position_ids, cu_seq_lens_q: the call's documents (single-device calls).
        keys: ``Lk`` (a call with cached keys is left as the layer computed it).

    Returns:
        ``query``, rescaled where a token's document position and row index give different scales.
    """
    if not _tuned(module) or keys != query.shape[2]:
        return query
    batch, length = query.shape[0], query.shape[2]
    if plan is not None:
        use = plan_use_of(plan, plan_use) if plan.size > 1 else None  # as the SP branch finds it
        first = use.first_positions if use is not None else None
        positions = _plan_positions(plan, first, query.device)
    else:
        positions = _local_positions(module, batch, length, attention_mask=attention_mask, ids_mask=ids_mask,
                                     position_ids=position_ids, cu_seq_lens_q=cu_seq_lens_q)
    if positions is None:
        return query
    rows = torch.arange(length, device=query.device).expand(positions.shape[0], -1)  # [B, L]
    scale, row_scale = temperature_scale(module, positions.to(query.device)), temperature_scale(module, rows)
    if torch.equal(scale, row_scale):
        return query
    # the ratio in float64, applied in float32 at least: (q * s_row) * (s / s_row) is q * s to the query's rounding
    ratio = (scale.double() / row_scale.double()).to(torch.promote_types(query.dtype, torch.float32))  # [B, L]
    return (query * ratio[:, None, :, None]).to(query.dtype)  # [B, Hq, L, D]
