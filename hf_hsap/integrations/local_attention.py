"""The single-device branch of the ``"hsap"`` attention function: one varlen call over the flattened batch.

Which documents the call has is decided here, first match wins (the rules themselves are in
:mod:`.local_layout`):

1. an ``hsap_plan`` of SP size 1 (and no document ids from the mask function): the plan's layout covers the
   flattened ``B * L`` tokens;
2. ``cu_seq_lens_q`` (and optionally ``cu_seq_lens_k``): documents over the flattened ``B * L`` tokens, as in
   flash-attention's padding-free path;
3. ``L_q == L_k`` (training, prefill): the mask function's document ids, else ``position_ids``, and a 2D
   padding mask;
4. ``L_q != L_k`` (generation with a KV cache): one bottom-right causal segment per row.

With the ``tiled_attention`` lever (:mod:`hf_hsap.memory.tiled_attention`) the call runs in query tiles.

The layer's sliding window, soft-cap and sinks (:class:`~.attention_checks.AttentionVariant`) go to the kernel
as they are: the window counts keys back from each query's own key inside its segment (bottom-right aligned),
which is ``masking_utils``' window also over a sliding cache's keys (they are the most recent keys, in order,
ending at the last query). A window at least as long as every segment's keys hides nothing and is dropped.

Which branch ran is logged at DEBUG, once per distinct case (not per layer or step).
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from ..kernels import varlen_attention
from ..log import get_logger, log_once
from ..model_state import ATTENTION_TILES, state_of
from .attention_checks import AttentionVariant
from .local_layout import LocalLayout, layout_cached, layout_from_cu, layout_same_length
from .model_check import check_config, check_mixers_prepared

__all__ = ["choose_layout", "local_forward"]

logger = get_logger(__name__)


def choose_layout(batch: int, lq: int, lk: int, attention_mask: torch.Tensor | None, device: torch.device, *,
                  plan: Any = None, ids_mask: bool = False, cu_seq_lens_q: torch.Tensor | None = None,
                  cu_seq_lens_k: torch.Tensor | None = None,
                  position_ids: torch.Tensor | None = None) -> tuple[LocalLayout, str]:
    """The documents of one single-device call, and which rule gave them (see the module docstring).

    Args:
        batch, lq, lk: ``B``, ``L_q`` and ``L_k``.
        attention_mask: ``None``, a ``[B, <= L_k]`` bool padding mask or the mask function's ``[B, L]`` ids.
        device: where the index tensors go.
        plan: an ``hsap_plan`` of SP size 1, or ``None``.
        ids_mask: whether ``attention_mask`` holds the mask function's integer document ids.
        cu_seq_lens_q, cu_seq_lens_k: ``[n + 1]`` document boundaries over ``B * L_q`` / ``B * L_k``, or ``None``.
        position_ids: ``[B, L]`` (or ``[1, L]``) positions, or ``None``.

    Returns:
        ``(layout, branch)``; ``branch`` is ``"plan"``, ``"cu_seq_lens"``, ``"same_length"`` or ``"cached"``.

    Raises:
        ValueError: a plan that does not cover the batch, or what :mod:`.local_layout` refuses.
    """
    if plan is not None and not ids_mask:  # SP size 1: the plan's layout covers the flattened batch
        cu = tuple(int(x) for x in plan.layout.cu_seqlens)
        if lq != lk or cu[-1] != batch * lq:
            raise ValueError(f"hsap_plan covers {cu[-1]} tokens but the batch has {batch} x {lq} queries, {lk} keys")
        return LocalLayout(cu, cu), "plan"
    if cu_seq_lens_q is not None:  # ids: split at chunks too
        return layout_from_cu(batch, lq, lk, cu_seq_lens_q, cu_seq_lens_k, attention_mask), "cu_seq_lens"
    if lq == lk and (attention_mask is None or attention_mask.shape[1] == lk):
        return layout_same_length(batch, lq, position_ids, attention_mask, device), "same_length"
    return layout_cached(batch, lq, lk, attention_mask, device), "cached"


def _log_branch(module: torch.nn.Module, branch: str, layout: LocalLayout, batch: int, *,
                attention_mask: torch.Tensor | None, ids_mask: bool, position_ids: torch.Tensor | None) -> None:
    """Say at DEBUG which layout branch an attention call took, once per distinct case."""
    if attention_mask is None:
        mask = "no mask"
    elif ids_mask:
        mask = "the mask function's document ids"
    else:
        mask = "a 2D padding mask"
    positions = "position_ids" if position_ids is not None else "no position_ids"
    padded = layout.q_index is not None or layout.k_index is not None
    log_once(logger, logging.DEBUG, (branch, mask, positions, padded),
             "hsap attention: single-device branch %r (%s, %s%s): %d segments over %d rows in %s", branch, mask,
             positions, ", padded tokens left out" if padded else "", len(layout.cu_q) - 1, batch,
             type(module).__name__)


def _effective_window(module: torch.nn.Module, window: int | None, layout: LocalLayout, branch: str) -> int | None:
    """``window``, or ``None`` where it is at least every segment's key count (then it hides no key)."""
    if window is None:
        return None
    longest = layout.max_k
    if logger.isEnabledFor(logging.DEBUG):
        log_once(logger, logging.DEBUG, ("window", branch, window < longest),
                 "hsap attention: sliding window of %d tokens, longest segment %d keys (%s branch): %s (%s)", window,
                 longest, branch, "applied in the kernel" if window < longest else "hides nothing, dropped",
                 type(module).__name__)
    return window if window < longest else None


def local_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None, *,
                  variant: AttentionVariant | None = None, plan: Any = None, ids_mask: bool = False,
                  cu_seq_lens_q: torch.Tensor | None = None, cu_seq_lens_k: torch.Tensor | None = None,
                  position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The single-device branch of :func:`~.transformers.hsap_attention_forward`.

    Args:
        module: the calling attention layer (read: ``config``).
        query, key, value: the heads, values already padded to the query head size (see Shapes).
        attention_mask: ``None``, a ``[B, <= L_k]`` bool padding mask or the mask function's ``[B, L]`` ids.
        scaling: softmax scale, default ``D ** -0.5``.
        variant: the layer's window, soft-cap and sinks (``None``: none of them).
        plan, ids_mask, cu_seq_lens_q, cu_seq_lens_k, position_ids: see :func:`choose_layout`.

    Returns:
        The attention output; padded queries get output 0.

    Shapes:
        query ``[B, Hq, Lq, D]``, key/value ``[B, Hkv, Lk, D]`` -> ``[B, Lq, Hq, D]``.

    Raises:
        ValueError: what :func:`choose_layout` refuses.
    """
    batch, lq, lk = query.shape[0], query.shape[2], key.shape[2]
    head_dim = query.shape[-1]
    layout, branch = choose_layout(batch, lq, lk, attention_mask, query.device, plan=plan, ids_mask=ids_mask,
                                   cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k,
                                   position_ids=position_ids)
    if logger.isEnabledFor(logging.DEBUG):  # the cheap guard: nothing else runs when DEBUG is off
        _log_branch(module, branch, layout, batch, attention_mask=attention_mask, ids_mask=ids_mask,
                    position_ids=position_ids)
    variant = variant or AttentionVariant()
    window = _effective_window(module, variant.window, layout, branch)
    config = getattr(module, "config", None)
    if config is not None and len(layout.cu_q) - 1 > batch:  # packed rows (e.g. from cu_seq_lens_q alone)
        check_config(config, packed=True)
        check_mixers_prepared(module, config)
    q = query.transpose(1, 2).reshape(batch * lq, query.shape[1], head_dim)  # [B, Hq, Lq, D] -> [B*Lq, Hq, D]
    k = key.transpose(1, 2).reshape(batch * lk, key.shape[1], head_dim)  # [B, Hkv, Lk, D] -> [B*Lk, Hkv, D]
    v = value.transpose(1, 2).reshape(batch * lk, value.shape[1], head_dim)  # [B, Hkv, Lk, D] -> [B*Lk, Hkv, D]
    if layout.k_index is not None:
        k, v = k.index_select(0, layout.k_index), v.index_select(0, layout.k_index)  # [N_k kept, Hkv, D]
    q_kept = q.index_select(0, layout.q_index) if layout.q_index is not None else q  # [N_q kept, Hq, D]
    out = varlen_attention(q_kept, k, v, layout.cu_q, layout.cu_k, causal=True, softmax_scale=scaling,
                           window=window, softcap=variant.softcap, sinks=variant.sinks,
                           tile_tokens=state_of(module, ATTENTION_TILES))  # the tiled_attention lever's, or None
    if layout.q_index is not None:
        out = q.new_zeros(q.shape).index_copy(0, layout.q_index, out)  # [B*Lq, Hq, D], padding = 0
    return out.view(batch, lq, query.shape[1], head_dim)  # [B*Lq, Hq, D] -> [B, Lq, Hq, D]
