"""The ``"hsap"`` attention implementation for Hugging Face Transformers (registry only, no patching).

``register()`` (:mod:`.registry`) adds ``"hsap"`` to ``AttentionInterface`` (:func:`hsap_attention_forward`,
this module) and to ``AttentionMaskInterface`` (:func:`~.mask.hsap_mask_function`, a mask function that never
builds a dense 4D mask). Afterwards ``from_pretrained(..., attn_implementation="hsap")`` and
``model.set_attn_implementation("hsap")`` work for every model whose attention goes through
``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen2/3, Mistral, ...).

:func:`hsap_attention_forward` is the dispatcher. How documents are found (first match wins):

1. ``hsap_plan`` given and the plan's SP size > 1: sequence-parallel attention (:mod:`.sp_attention`,
   :func:`hf_hsap.hsap_attn_func`); the batch is one row of this rank's tokens in plan order. The layer
   records that it consumed the plan (``hsap_plan_use``, see :mod:`.plan_use`).
2. Otherwise one varlen call on this device (:mod:`.local_attention`, rules in :mod:`.local_layout`):
   ``cu_seq_lens_q`` (and optionally ``cu_seq_lens_k``) as in flash-attention's padding-free path; or, with
   ``L_q == L_k`` (training, prefill), the document ids the mask function read off the mask Transformers
   composed (causal, packed documents, chunks; O(L), never a dense mask), else a new document wherever
   ``position_ids`` does not continue, a 2D padding mask dropping padded tokens (their output is 0); or, with
   ``L_q != L_k`` (generation with a KV cache), one causal segment per row over its filled keys, bottom-right
   aligned (a static cache's unfilled slots are never seen; a 2D mask may pad on the left only).

Chunked-attention layers (Llama 4) run the plan whose documents are their chunks
(:func:`~.chunked_attention.layer_plan`); without a plan, the mask function's ids carry the chunks. Llama 4's NoPE
layers get their attention temperature from each token's document position (:mod:`.temperature`).

Computed exactly, in every branch (:func:`~.attention_checks.attention_variant`): sliding windows (the call's
``sliding_window``, else ``module.sliding_window``; Transformers' convention, a query sees the ``window`` keys
ending at itself, also in generation over the sliding caches' keys), logit soft-capping (``softcap``, Gemma 2) and
attention sinks (``s_aux``, GPT-OSS; the sinks get their gradient).

Layers with a per-query relative position bias (Inkling, Inkling 2; their bias modules hand a table once
``prepare_model`` ran, :mod:`.relative_bias`) attend in torch per document from each token's document position
(per-query sinks included); Inkling 2's attention residuals (learned queries over one token's layer states) are
plain attention with no token mixing (:func:`~.biased_attention.depth_forward`).

Cross-attention layers (Mllama's text-to-image layers, :mod:`.cross_attention`) attend per document over the
rank's own image states, without the plan.

Vision and audio encoders (a non-causal call from a module with a vision / audio config) get their own
per-image bidirectional attention (:mod:`.encoder_attention`); the decoder's plan never applies to them.

Refused with ``ValueError`` (the message names the fix, :mod:`.attention_checks`): attention dropout > 0,
chunked layers in generation past a chunk, non-causal modules or masks, dense position biases, dense 4D
masks and custom mask overlays, families with non-attention token mixers or attention outside the interface
(:mod:`.model_check`).
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from ..plan.plan import Plan
from ..kernels.dtypes import cast_qkv
from ..log import get_logger, log_once
from ..model_state import DEPTH, INDEXED, PREFIX_LM, RELAY, state_of
from ..multimodal.cross import CROSS_KEY, is_cross_attention
from ..multimodal.layer_blocks import layer_blocks
from .attention_checks import (NOT_PASSED, attention_variant, check_mask_rank, check_plan_mask, check_supported,
                               check_value_head_dim)
from .cross_attention import cross_forward
from .encoder_attention import encoder_forward, is_encoder_call, is_encoder_module
from .indexed import indexed_forward
from .local_attention import local_forward
from .local_layout import document_starts
from .mask import hsap_mask_function
from .plan_relay import relayed, relayed_documents
from .biased_attention import depth_forward
from .relative_bias import check_unprepared_bias, relative_bias_extent, relative_forward
from .chunked_attention import layer_plan
from .sp_attention import enter_plan, sp_forward
from .temperature import fix_temperature

__all__ = ["document_starts", "hsap_attention_forward", "hsap_mask_function"]

logger = get_logger(__name__)


def hsap_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    scaling: float | None = None,
    dropout: float = 0.0,
    hsap_plan: Plan | None = None,
    hsap_plan_use: Any = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    sliding_window: Any = NOT_PASSED,
    is_causal: bool | None = None,
    s_aux: Any = None,
    softcap: Any = None,
    position_bias: Any = None,
    hsap_blocks: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Exact causal, document-masked attention in the Transformers attention-function signature.

    Args:
        module: the calling attention layer (read: ``is_causal``, ``sliding_window``, ``config``).
        query: ``[B, Hq, Lq, D]``.
        key: ``[B, Hkv, Lk, D]`` (``Hq % Hkv == 0``; ``Lk >= Lq`` with a KV cache).
        value: ``[B, Hkv, Lk, Dv]`` (``Dv <= D``).
        attention_mask: ``None``, the ``[B, <= Lk]`` bool padding mask or the ``[B, L]`` int32 document ids
            from :func:`hsap_mask_function`.
        scaling: softmax scale, default ``D ** -0.5``.
        dropout: must be 0.
        hsap_plan: the :class:`~hf_hsap.Plan` from :func:`~.sharding.shard_batch` (SP size > 1: sequence
            parallel; SP size 1: its layout gives the documents), or ``None``.
        hsap_plan_use: the :class:`~.plan_use.PlanUse` record next to the plan, or ``None``.
        cu_seq_lens_q: ``[n + 1]`` document boundaries over the flattened ``B * Lq`` tokens, or ``None``.
        cu_seq_lens_k: ``[n + 1]`` document boundaries over the flattened ``B * Lk`` tokens, or ``None``.
        position_ids: ``[B, Lq]`` (or ``[1, Lq]``) positions; a new document starts where they do not continue.
        sliding_window: the layer's window in tokens, ``None`` (full attention) or not passed (then
            ``module.sliding_window``).
        is_causal: overrides ``module.is_causal``; must not be False.
        s_aux: ``[Hq]`` attention-sink logits (GPT-OSS), or ``None``.
        softcap: logit soft-cap (Gemma 2), or ``None``.
        position_bias: ``None``, or a prepared relative-bias layer's ``[B, Hq, Lq, E]`` table (``RELATIVE_BIAS``);
            dense biases are refused.
        hsap_blocks: bidirectional image blocks of the batch (Gemma 3, from :func:`~.sharding.shard_batch`), run by
            the plan's schedule at every SP size; ``None``: none.
        kwargs: the rest of the model's keyword arguments (``use_cache``, ``max_length_q``, ...), unused.

    Returns:
        ``(attn_output [B, Lq, Hq, Dv], None)``; padded queries get output 0.

    Raises:
        ValueError: for unsupported attention variants or inputs (see the module docstring).
    """
    if kwargs.get("hsap_vision_rows") is not None:  # no pre-hook took them: the model was not prepared
        raise ValueError("this vision-language model got hsap_vision_rows from shard_batch but does not keep its "
                         "rank's image feature rows: call hf_hsap.prepare_model(model, sp_size=...) once before "
                         "the first forward (the trainers do)")
    if is_cross_attention(module):  # text-to-image cross-attention (Mllama): not the self-attention plan's business
        check_supported(module, dropout, position_bias=position_bias)
        out = cross_forward(module, query, key, value, attention_mask, scaling, docs=kwargs.get(CROSS_KEY),
                            plan=hsap_plan, plan_use=hsap_plan_use, cu_seq_lens_q=cu_seq_lens_q)
        return out, None
    if state_of(module, RELAY) is not None:  # a layer the model's call does not reach: its plan and its documents
        if hsap_plan is None:
            hsap_plan, hsap_plan_use = relayed(module, "hsap_plan"), relayed(module, "hsap_plan_use")
            hsap_blocks = hsap_blocks if hsap_blocks is not None else relayed(module, "hsap_blocks")
        if position_ids is None and cu_seq_lens_q is None:
            position_ids, cu_seq_lens_q, cu_seq_lens_k = relayed_documents(module, query.shape[0], query.shape[2])
    if state_of(module, DEPTH) is not None:  # attention over each token's own layer states (Inkling 2): no token mixing
        return depth_forward(query, key, value, scaling), None
    check_unprepared_bias(module, position_bias, kwargs.get("sinks"))
    if relative_bias_extent(module, position_bias) is not None:  # a per-query bias table (Inkling, prepare_model)
        check_supported(module, dropout, is_causal=is_causal)
        check_mask_rank(module, attention_mask)
        window = attention_variant(module, query.shape[1], sliding_window=sliding_window).window
        ids_mask = attention_mask is not None and attention_mask.dtype != torch.bool
        check_plan_mask(hsap_plan, attention_mask, ids_mask)
        if hsap_plan is not None:
            enter_plan(module, hsap_plan, hsap_plan_use)
        out = relative_forward(module, query, key, value, attention_mask, table=position_bias,
                               sinks=kwargs.get("sinks"), scaling=scaling, window=window, plan=hsap_plan,
                               ids_mask=ids_mask, position_ids=position_ids, cu_seq_lens_q=cu_seq_lens_q,
                               plan_use=hsap_plan_use)
        return out, None
    own_mask = attention_mask is not None and attention_mask.dim() == 4 and is_encoder_module(module)
    if is_encoder_call(module, is_causal) or own_mask:  # a vision / audio tower (Mllama's: its own dense tile mask,
        # which SDPA applies whatever the layer's is_causal): per-image bidirectional attention
        return encoder_forward(module, query, key, value, attention_mask, scaling, dropout=dropout,
                               cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k)
    if is_causal is None and state_of(module, PREFIX_LM) is not None:
        # a prefix-LM's decoder (PaliGemma's Gemma: use_bidirectional_attention) is causal by its model's mask (the
        # hsap mask function refuses one that is not); its prefixes are the batch's blocks (hsap_blocks)
        is_causal = True
    check_supported(module, dropout, is_causal=is_causal, position_bias=position_bias)
    variant = attention_variant(module, query.shape[1], sliding_window=sliding_window, softcap=softcap, s_aux=s_aux)
    if state_of(module, INDEXED) is not None:  # DeepSeek-sparse attention: the indexer's top-k per document
        return indexed_forward(module, query, key, value, attention_mask, indices=kwargs.get("indices"),
                               plan=hsap_plan, plan_use=hsap_plan_use, scaling=scaling, window=variant.window,
                               softcap=variant.softcap, sinks=variant.sinks), None
    query, key, value = cast_qkv(query, key, value)  # autocast: q, k arrive in fp32, v in bf16
    check_mask_rank(module, attention_mask)
    head_dim, v_head_dim = query.shape[-1], value.shape[-1]
    check_value_head_dim(head_dim, v_head_dim)
    if v_head_dim < head_dim:  # e.g. MLA: pad values like flash-attention does, crop the output below
        if logger.isEnabledFor(logging.DEBUG):
            log_once(logger, logging.DEBUG, ("pad values", head_dim, v_head_dim),
                     "hsap attention: value heads of %d padded to the query head size %d (%s)", v_head_dim, head_dim,
                     type(module).__name__)
        value = torch.nn.functional.pad(value, [0, head_dim - v_head_dim])  # [B, Hkv, Lk, Dv] -> [B, Hkv, Lk, D]
    ids_mask = attention_mask is not None and attention_mask.dtype != torch.bool  # the mask function's ids
    check_plan_mask(hsap_plan, attention_mask, ids_mask)
    query = fix_temperature(module, query, plan=hsap_plan, plan_use=hsap_plan_use, attention_mask=attention_mask,
                            ids_mask=ids_mask, position_ids=position_ids, cu_seq_lens_q=cu_seq_lens_q,
                            keys=key.shape[2])  # Llama 4's NoPE layers: each token's document position
    hsap_blocks = layer_blocks(module, hsap_blocks)  # Gemma 4: its sliding layers' only
    if hsap_blocks is not None and hsap_plan is None:
        raise ValueError("hsap_blocks (bidirectional image blocks) need the batch's plan: pass the batch through "
                         "hf_hsap.shard_batch(batch, sp) (sp=1 on one process)")
    if hsap_plan is not None and (hsap_plan.size > 1 or hsap_blocks is not None):
        out = sp_forward(module, query, key, value, hsap_plan, scaling=scaling, window=variant.window,
                         plan_use=hsap_plan_use, softcap=variant.softcap, sinks=variant.sinks,
                         blocks=hsap_blocks)  # [1, T, Hq, D]
    else:
        plan = layer_plan(module, hsap_plan) if hsap_plan is not None else None  # a chunked layer: its chunks
        out = local_forward(module, query, key, value, attention_mask, scaling, variant=variant, plan=plan,
                            ids_mask=ids_mask, cu_seq_lens_q=cu_seq_lens_q, cu_seq_lens_k=cu_seq_lens_k,
                            position_ids=position_ids)  # [B, Lq, Hq, D]
    return out[..., :v_head_dim], None  # [B, Lq, Hq, D] -> [B, Lq, Hq, Dv]
