"""The ``"hsap"`` attention implementation for Hugging Face Transformers (registry only, no patching).

``register()`` adds ``"hsap"`` to ``AttentionInterface`` (the attention function) and to
``AttentionMaskInterface`` (a mask function that never builds a dense 4D mask). Afterwards
``from_pretrained(..., attn_implementation="hsap")`` and ``model.set_attn_implementation("hsap")`` work
for every model whose attention goes through ``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen2/3, Mistral, ...).

How documents are found (first match wins); the single-device rules live in :mod:`.local_layout`:

1. ``hsap_plan`` in the kwargs and the plan's SP size > 1: sequence-parallel attention
   (:func:`hf_hsap.hsap_attn_func`); the batch is one row of this rank's tokens in plan order. The layer
   records that it consumed the plan (``hsap_plan_use``, see :mod:`.plan_use`).
2. ``cu_seq_lens_q`` (and optionally ``cu_seq_lens_k``) in the kwargs: documents over the flattened
   ``B * L`` tokens, exactly as flash-attention's padding-free path.
3. ``L_q == L_k`` (training, prefill): the mask function evaluates the mask Transformers composed
   (causal, packed documents, chunks) on the sub-diagonal only (O(L), never a dense mask) and passes the
   document ids as a ``[B, L]`` integer ``attention_mask``; without them, a new document starts wherever
   ``position_ids`` does not continue. A 2D padding mask drops padded tokens (their output is 0).
4. ``L_q != L_k`` (generation with a KV cache): one causal segment per row over its filled keys,
   bottom-right aligned (a static cache's unfilled slots are never seen). A 2D mask may pad on the left only.

Refused with ``ValueError`` (the message names the fix): attention dropout > 0, sliding-window layers
whose window is shorter than a document's keys, chunked layers under SP or in generation past a chunk,
non-causal modules or masks, attention sinks (``s_aux``), logit soft-capping, position biases, dense 4D
masks and custom mask overlays, families with non-attention token mixers or attention outside the
interface (:mod:`.model_check`).
"""
from __future__ import annotations

from typing import Any

import torch

from ..kernels import varlen_attention
from ..kernels.dtypes import cast_qkv
from .local_layout import (LocalLayout, document_ids, document_starts, layout_cached, layout_from_cu,
                           layout_same_length)
from .model_check import UnsupportedModelError, check_config, chunked_attention_size, layer_type
from .plan_use import plan_use_of

ATTN_NAME = "hsap"

__all__ = ["ATTN_NAME", "document_starts", "hsap_attention_forward", "hsap_mask_function", "is_registered",
           "register"]


def register(name: str = ATTN_NAME) -> str:
    """Register the hsap attention and mask functions with Transformers (idempotent).

    Args:
        name: the ``attn_implementation`` name to register (default ``"hsap"``).

    Returns:
        ``name``, to pass as ``attn_implementation``.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, hsap_attention_forward)
    AttentionMaskInterface.register(name, hsap_mask_function)
    return name


def is_registered(name: str = ATTN_NAME) -> bool:
    """Whether both registries map ``name`` to the hsap functions."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    return (
        AttentionInterface._global_mapping.get(name) is hsap_attention_forward
        and AttentionMaskInterface._global_mapping.get(name) is hsap_mask_function
    )


def hsap_mask_function(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """Mask factory for ``"hsap"``: never a dense mask, only what the varlen kernel needs.

    Called by ``masking_utils.create_causal_mask`` (and its sliding / chunked variants) once per mask kind
    and forward.

    * Without a cache (training, prefill): the composed ``mask_function`` (causal, packed documents from
      ``position_ids``, chunks of chunked layers) is evaluated on the pairs ``(t, t - 1)`` and ``(t - 1, t)``
      only: where a token may not see its predecessor a segment starts, and a token that may see its
      successor means the mask is not causal (refused). The segments go to the attention function as
      ``[B, L]`` int32 document ids (``0`` = padding, so ``.bool()`` is the padding mask), so they reach it
      even when a model does not forward ``position_ids`` to its attention layers.
    * With a cache: the padding of the filled key slots (``[B, <= kv_length]`` bool); a static cache's slots
      past the last query are not filled and are left out.

    Args:
        batch_size, q_length, kv_length, q_offset, kv_offset: mask geometry.
        mask_function: the mask pattern Transformers composed (index-based).
        attention_mask: ``[B, seen + q_length]`` bool padding mask or ``None``.
        kwargs: ``config`` (checked with :func:`~.model_check.check_config`), ``local_size`` (chunk size of
            a chunked layer), ``use_vmap`` (True for a custom mask overlay, refused).

    Returns:
        ``None`` (one causal document per row, no padding), int32 document ids ``[B, L]``, or a bool
        padding mask of the filled keys.

    Raises:
        ValueError: a custom mask overlay, a non-causal mask, chunked attention in generation past a
            chunk, or a model family hf_hsap cannot run (:class:`~.model_check.UnsupportedModelError`).
    """
    if kwargs.get("use_vmap", False):
        raise ValueError(
            "attn_implementation='hsap' supports causal document-masked attention only, but this model adds a "
            "custom mask overlay (e.g. bidirectional image tokens); use attn_implementation='sdpa' for it"
        )
    config = kwargs.get("config")
    q_offset, kv_offset = int(q_offset), int(kv_offset)  # a static cache gives 0-dim tensors
    if q_offset == 0 and kv_offset == 0 and kv_length == q_length:
        ids, packed = _probe_documents(batch_size, q_length, mask_function, attention_mask, kwargs.get("device"))
        if config is not None:
            check_config(config, packed=packed)
        return ids
    if config is not None:
        check_config(config, packed=False)
    chunk = _chunk_size(config, kwargs.get("local_size"))
    if chunk is not None and q_offset + q_length > chunk:
        raise UnsupportedModelError(
            f"attn_implementation='hsap' has no chunked attention with a KV cache, and this generation reaches "
            f"{q_offset + q_length} tokens, past the chunk of {chunk}; generate with attn_implementation='sdpa'"
        )
    filled = q_offset + q_length - kv_offset  # keys up to the last query (a static cache has more slots)
    if attention_mask is None:
        if filled >= kv_length:
            return None
        return torch.ones(batch_size, max(filled, q_length), dtype=torch.bool, device=kwargs.get("device"))
    attention_mask = attention_mask[:, -kv_length:]  # sliding caches keep only the last kv_length keys
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask.bool()


def _chunk_size(config: Any, local_size: int | None) -> int | None:
    """The chunk of a chunked-attention mask call (``local_size`` is also a sliding layer's window: only a
    model with chunked layers of that size makes it a chunk)."""
    if local_size is None or config is None:
        return None
    return local_size if chunked_attention_size(config) == local_size else None


def _probe_documents(batch: int, length: int, mask_function: Any, attention_mask: torch.Tensor | None,
                     device: Any) -> tuple[torch.Tensor | None, bool]:
    """Document ids ``[B, L]`` int32 of a mask without cache, read off its sub-diagonal (``None``: one
    causal document per row and no padding), and whether a row holds several segments. See
    :func:`hsap_mask_function`."""
    valid = None
    if attention_mask is not None:
        valid = attention_mask[:, -length:].to(torch.bool)  # [B, L]
        device = valid.device
        if bool(valid.all()):
            valid = None
    starts = torch.zeros(batch, length, dtype=torch.bool, device=device)  # [B, L]
    starts[:, 0] = True
    if mask_function is not None and length > 1:
        b = torch.arange(batch, device=device)[:, None]  # [B, 1]
        h = torch.zeros(1, dtype=torch.long, device=device)
        t = torch.arange(1, length, device=device)[None, :]  # [1, L - 1]
        sees_previous = torch.as_tensor(mask_function(b, h, t, t - 1), device=device).expand(batch, length - 1)
        sees_next = torch.as_tensor(mask_function(b, h, t - 1, t), device=device).expand(batch, length - 1)
        if bool(sees_next.any()):
            raise ValueError(
                "attn_implementation='hsap' computes causal attention only, but this model's mask lets tokens see "
                "later tokens (bidirectional blocks); use attn_implementation='sdpa' for it"
            )
        starts[:, 1:] = ~sees_previous
    packed = bool(starts[:, 1:].any())
    if valid is None and not packed:
        return None, False
    return document_ids(starts, valid), packed


def _check_supported(module: torch.nn.Module, dropout: float, kwargs: dict[str, Any]) -> int | None:
    """Refuse attention variants the kernel does not compute; return the sliding window (or ``None``)."""
    name = type(module).__name__
    if dropout and dropout > 0:
        raise ValueError(
            f"attn_implementation='hsap' has no attention dropout ({name} asked for p={dropout}); call "
            "hf_hsap.disable_attention_dropout(model) or load the model with attention_dropout=0.0 (setting "
            "model.config.attention_dropout afterwards does not reach the layers; other dropout is unaffected)"
        )
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if is_causal is False:
        raise ValueError(
            f"attn_implementation='hsap' computes causal attention only, but {name} is not causal "
            "(an encoder or bidirectional layer); use attn_implementation='sdpa' for this model"
        )
    for key, what in (("s_aux", "attention sinks"), ("softcap", "logit soft-capping"),
                      ("position_bias", "additive position biases")):
        if kwargs.get(key) is not None:
            raise ValueError(
                f"attn_implementation='hsap' does not implement {what} ({name} passes `{key}`); "
                "use attn_implementation='eager' or 'flex_attention' for this model"
            )
    window = kwargs.get("sliding_window")
    return window if window is not None else getattr(module, "sliding_window", None)


def _check_chunked_sp(module: torch.nn.Module, longest_doc: int) -> None:
    """Refuse a chunked layer under SP when a document is longer than its chunk (the plan has no chunks)."""
    config = getattr(module, "config", None)
    if config is None or layer_type(config, getattr(module, "layer_idx", None)) != "chunked_attention":
        return
    chunk = chunked_attention_size(config)
    if chunk is not None and longest_doc > chunk:
        raise UnsupportedModelError(
            f"{type(module).__name__} (layer {module.layer_idx}) is a chunked-attention layer of {chunk} tokens and a "
            f"document has {longest_doc}; hf_hsap has no chunked attention under sequence parallelism. Use "
            "sp_size=1 (chunks are exact there), or keep documents at most attention_chunk_size tokens long"
        )


def _check_window(module: torch.nn.Module, window: int | None, longest_keys: int) -> None:
    """Refuse a sliding window shorter than some document's keys (then it would change the result)."""
    if window is not None and longest_keys > window:
        raise ValueError(
            f"attn_implementation='hsap' has no sliding-window attention, and {type(module).__name__} has a "
            f"window of {window} tokens while a document spans {longest_keys} keys; keep documents at most "
            f"{window} tokens long, or disable the window (config.use_sliding_window=False / sliding_window=None)"
        )


def _sp_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: Any, scaling: float | None
) -> torch.Tensor:
    """Sequence-parallel attention over this rank's tokens (``B == 1``, tokens in plan order).

    Shapes: query ``[1, Hq, T, D]``, key/value ``[1, Hkv, T, D]`` -> ``[1, T, Hq, D]``.
    """
    from .. import hsap_attn_func

    if query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        raise ValueError(
            "hsap_plan needs one row of local tokens and no KV cache (got query "
            f"{tuple(query.shape)}, key {tuple(key.shape)}); build the batch with hf_hsap's shard_batch"
        )
    q = query[0].transpose(0, 1)  # [1, Hq, T, D] -> [T, Hq, D]
    k = key[0].transpose(0, 1)  # [1, Hkv, T, D] -> [T, Hkv, D]
    v = value[0].transpose(0, 1)
    return hsap_attn_func(q, k, v, plan, softmax_scale=scaling).unsqueeze(0)  # [1, T, Hq, D]


def _plan_cu_seqlens(plan: Any) -> Any:
    """Document boundaries of a plan's layout (global order)."""
    return plan.layout.cu_seqlens


def _plan_longest_doc(plan: Any) -> int:
    """Longest document of a plan's layout, in tokens (vectorised: it runs in every attention layer)."""
    cu = torch.as_tensor(_plan_cu_seqlens(plan))
    return int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0


def _sp_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: Any,
                scaling: float | None, window: int | None, kwargs: dict[str, Any]) -> torch.Tensor:
    """The SP branch of :func:`hsap_attention_forward`: refuse what the plan cannot express, record that this
    layer consumed the plan, run SAP. Shapes: query ``[1, Hq, T, D]`` -> ``[1, T, Hq, D]``."""
    config = getattr(module, "config", None)
    if config is not None:
        check_config(config, packed=True, sp_size=plan.size)
    longest = _plan_longest_doc(plan)
    _check_window(module, window, longest)
    _check_chunked_sp(module, longest)
    use = plan_use_of(plan, kwargs)
    if use is not None:
        use.record(module)
    return _sp_attention(query, key, value, plan, scaling)


def hsap_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Exact causal, document-masked attention in the Transformers attention-function signature.

    Args:
        module: the calling attention layer (read: ``is_causal``, ``sliding_window``).
        query: ``[B, Hq, Lq, D]``.
        key: ``[B, Hkv, Lk, D]`` (``Hq % Hkv == 0``; ``Lk >= Lq`` with a KV cache).
        value: ``[B, Hkv, Lk, Dv]`` (``Dv <= D``).
        attention_mask: ``None``, the ``[B, <= Lk]`` bool padding mask or the ``[B, L]`` int32 document ids
            from :func:`hsap_mask_function`.
        scaling: softmax scale, default ``D ** -0.5``.
        dropout: must be 0.
        kwargs: ``hsap_plan``, ``hsap_plan_use``, ``cu_seq_lens_q/k``, ``position_ids``, ``sliding_window``,
            ``is_causal``, ...

    Returns:
        ``(attn_output [B, Lq, Hq, Dv], None)``; padded queries get output 0.

    Raises:
        ValueError: for unsupported attention variants or inputs (see the module docstring).
    """
    window = _check_supported(module, dropout, kwargs)
    query, key, value = cast_qkv(query, key, value)  # autocast: q, k arrive in fp32, v in bf16
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"attn_implementation='hsap' reads only 2D padding masks, but {type(module).__name__} got a "
            f"{attention_mask.dim()}D attention_mask, a dense mask the model builds itself (or one passed in by "
            "hand); use attn_implementation='sdpa' for this model, or pass position_ids / cu_seq_lens_q (not a 4D "
            "mask) for packed documents"
        )
    head_dim, v_head_dim = query.shape[-1], value.shape[-1]
    if v_head_dim > head_dim:
        raise ValueError(f"attn_implementation='hsap' needs value head_dim <= query head_dim, got {v_head_dim} > "
                         f"{head_dim}; use attn_implementation='sdpa' for this model")
    if v_head_dim < head_dim:  # e.g. MLA: pad values like flash-attention does, crop the output below
        value = torch.nn.functional.pad(value, [0, head_dim - v_head_dim])  # [B, Hkv, Lk, D]
    plan = kwargs.get("hsap_plan")
    ids_mask = attention_mask is not None and attention_mask.dtype != torch.bool  # the mask function's ids
    if plan is not None and attention_mask is not None and not ids_mask:
        raise ValueError("hsap_plan does not combine with a padding attention_mask; make padding its own document")
    if plan is not None and plan.size > 1:
        return _sp_forward(module, query, key, value, plan, scaling, window, kwargs)[..., :v_head_dim], None
    batch, lq, lk = query.shape[0], query.shape[2], key.shape[2]
    if plan is not None and not ids_mask:  # SP size 1: the plan's layout covers the flattened batch
        cu = tuple(int(x) for x in _plan_cu_seqlens(plan))
        if lq != lk or cu[-1] != batch * lq:
            raise ValueError(f"hsap_plan covers {cu[-1]} tokens but the batch has {batch} x {lq} queries, {lk} keys")
        layout = LocalLayout(cu, cu)
    elif kwargs.get("cu_seq_lens_q") is not None:
        layout = layout_from_cu(batch, lq, lk, kwargs, attention_mask)  # ids: split at chunks too
    elif lq == lk and (attention_mask is None or attention_mask.shape[1] == lk):
        layout = layout_same_length(batch, lq, kwargs.get("position_ids"), attention_mask, query.device)
    else:
        layout = layout_cached(batch, lq, lk, attention_mask, query.device)
    _check_window(module, window, layout.max_k)
    config = getattr(module, "config", None)
    if config is not None and len(layout.cu_q) - 1 > batch:  # packed rows (e.g. from cu_seq_lens_q alone)
        check_config(config, packed=True)
    q = query.transpose(1, 2).reshape(batch * lq, query.shape[1], head_dim)  # [B, Hq, Lq, D] -> [B*Lq, Hq, D]
    k = key.transpose(1, 2).reshape(batch * lk, key.shape[1], head_dim)  # [B, Hkv, Lk, D] -> [B*Lk, Hkv, D]
    v = value.transpose(1, 2).reshape(batch * lk, value.shape[1], head_dim)
    if layout.k_index is not None:
        k, v = k.index_select(0, layout.k_index), v.index_select(0, layout.k_index)  # [N_k kept, Hkv, D]
    q_kept = q.index_select(0, layout.q_index) if layout.q_index is not None else q  # [N_q kept, Hq, D]
    out = varlen_attention(q_kept, k, v, layout.cu_q, layout.cu_k, causal=True, softmax_scale=scaling)
    if layout.q_index is not None:
        out = q.new_zeros(q.shape).index_copy(0, layout.q_index, out)  # [B*Lq, Hq, D], padding = 0
    out = out.view(batch, lq, query.shape[1], head_dim)  # [B*Lq, Hq, D] -> [B, Lq, Hq, D]
    return out[..., :v_head_dim], None
