"""The ``"hsap"`` mask function: what Transformers' mask factories hand the attention, never a dense mask.

``masking_utils.create_causal_mask`` (and its sliding / chunked variants) calls the function registered in
``AttentionMaskInterface`` once per mask kind and forward. For ``"hsap"`` that is :func:`hsap_mask_function`:
without a cache it probes the composed mask on its sub-diagonal only (O(L)) and returns per-token document ids;
with a cache it returns the padding of the filled key slots. The attention function turns either into a
:class:`~.local_layout.LocalLayout`.

Sliding layers get their own mask call (``create_sliding_window_causal_mask``, ``local_size`` = the window). Their
composed mask is ``causal AND kv_idx > q_idx - window AND same document``: with a window of at least 2 a token
still sees its predecessor exactly when both are in one document, so the probe reads the same documents as the full
layers' mask; the window itself is applied by the attention function (the layer passes it). With a window of 1 a
token sees only itself, the probe cannot see documents and makes every token its own segment, which is what a
window of 1 computes anyway (exact; only the DEBUG log and the packed-rows model check see "packed").
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from ..log import get_logger, log_once
from .encoder_attention import is_encoder_config
from .indexed import check_indexed_ready
from .local_layout import document_ids
from .model_check import UnsupportedModelError, check_config, chunked_attention_size, has_reference_sliding

__all__ = ["hsap_mask_function"]

logger = get_logger(__name__)


def hsap_mask_function(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    *,
    attention_mask: torch.Tensor | None = None,
    config: Any = None,
    local_size: int | None = None,
    use_vmap: bool = False,
    device: torch.device | str | None = None,
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
    * From a vision / audio encoder's mask (its config says so, e.g. Idefics' tower masking padded patches):
      Transformers' SDPA mask, as that tower's attention is SDPA's (``encoder_attention.py``).
    * With a cache: the padding of the filled key slots (``[B, <= kv_length]`` bool); a static cache's slots
      past the last query are not filled and are left out.

    Args:
        batch_size: mask geometry (rows).
        q_length: mask geometry (query tokens).
        kv_length: mask geometry (key tokens).
        q_offset: mask geometry (Transformers' query offset).
        kv_offset: mask geometry (Transformers' key offset).
        mask_function: the mask pattern Transformers composed (index-based).
        attention_mask: ``[B, seen + q_length]`` bool padding mask or ``None``.
        config: the model config (checked with :func:`~.model_check.check_config`), or ``None``.
        local_size: the chunk size of a chunked layer (or a sliding layer's window, see the module docstring),
            or ``None``.
        use_vmap: True for a custom mask overlay (refused).
        device: where the mask goes (without an ``attention_mask`` to take it from).
        kwargs: the rest of what the mask factories pass (``allow_is_causal_skip``, ``dtype``, ...), unused.

    Returns:
        ``None`` (one causal document per row, no padding), int32 document ids ``[B, L]``, or a bool
        padding mask of the filled keys.

    Raises:
        ValueError: a custom mask overlay, a non-causal mask, chunked attention in generation past a
            chunk, or a model family hf_hsap cannot run (:class:`~.model_check.UnsupportedModelError`).
    """
    if is_encoder_config(config):  # a vision / audio tower's own mask (Idefics' padded patches): SDPA's, as the
        from transformers.masking_utils import sdpa_mask  # tower's attention is SDPA's (encoder_attention.py)

        return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
                         attention_mask=attention_mask, local_size=local_size, use_vmap=use_vmap,
                         **({"device": device} if device is not None else {}), **kwargs)
    q_offset, kv_offset = int(q_offset), int(kv_offset)  # a static cache gives 0-dim tensors
    cached = not (q_offset == 0 and kv_offset == 0 and kv_length == q_length)
    if use_vmap and _reference_overlay(config, cached=cached, q_length=q_length, attention_mask=attention_mask):
        use_vmap = False
    if use_vmap:
        raise ValueError(
            "attn_implementation='hsap' supports causal document-masked attention only, but this model adds a "
            "custom mask overlay (e.g. bidirectional image tokens): for a vision-language model, pack with "
            "PackingCollator(max_length, vision=hf_hsap.vision_spec(model)) and call model(**hf_hsap.shard_batch("
            "batch, sp)) (image blocks are then exact), else use attn_implementation='sdpa' for it"
        )
    check_indexed_ready(config, cache=cached)
    if not cached:
        ids, packed = _probe_documents(batch_size, q_length, mask_function, attention_mask, device)
        if local_size == 1 and _chunk_size(config, local_size) is None and logger.isEnabledFor(logging.DEBUG):
            log_once(logger, logging.DEBUG, "window of 1",
                     "hsap mask: a sliding window of 1 token hides every predecessor, so every token is its own "
                     "segment (exactly what a window of 1 computes)")
        if config is not None:
            check_config(config, packed=packed)
        if logger.isEnabledFor(logging.DEBUG):  # once per case, not per forward
            what = "document ids" if packed else ("padding ids" if ids is not None else "none (one document per row)")
            log_once(logger, logging.DEBUG, ("no cache", what, config is None),
                     "hsap mask: no cache, mask read off the composed mask's sub-diagonal: %s%s", what,
                     "" if config is not None else "; no config passed, so the model family is not checked here")
        return ids
    if config is not None:
        check_config(config, packed=False)
    chunk = _chunk_size(config, local_size)
    if chunk is not None and q_offset + q_length > chunk:
        raise UnsupportedModelError(
            f"attn_implementation='hsap' has no chunked attention with a KV cache, and this generation reaches "
            f"{q_offset + q_length} tokens, past the chunk of {chunk}; generate with attn_implementation='sdpa'"
        )
    filled = q_offset + q_length - kv_offset  # keys up to the last query (a static cache has more slots)
    if logger.isEnabledFor(logging.DEBUG):
        log_once(logger, logging.DEBUG, ("cache", attention_mask is None, filled < kv_length),
                 "hsap mask: with a KV cache, the padding of the filled keys (%s%s)",
                 "no padding mask given" if attention_mask is None else "from the 2D padding mask",
                 "; the cache has unfilled slots (a static cache)" if filled < kv_length else "")
    if attention_mask is None:
        if filled >= kv_length:
            return None
        return torch.ones(batch_size, max(filled, q_length), dtype=torch.bool, device=device)
    attention_mask = attention_mask[:, -kv_length:]  # sliding caches keep only the last kv_length keys
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask.bool()


def _reference_overlay(config: Any, *, cached: bool, q_length: int, attention_mask: torch.Tensor | None) -> bool:
    """Whether a mask overlay is the one Unlimited-OCR's ``"reference_sliding_attention"`` mask adds, where it is
    causal (see :data:`~.model_check.REFERENCE_SLIDING`).

    Its overlay is ``causal AND key in the prefill``: without a cache (training, prefill) every key is prefill, so the
    composed mask is causal (the probe still refuses a token that sees its successor). In a decode step the cache
    hands out the prefill keys and the window's, all of them visible to one new token; several new tokens (the
    window per token) or a padding mask (its columns no longer line up with the kept keys) are refused.

    Raises:
        UnsupportedModelError: a decode step of several tokens or with a padding mask.
    """
    if config is None or not has_reference_sliding(config):
        return False
    if cached and (q_length != 1 or (attention_mask is not None and not bool(attention_mask.all()))):
        raise UnsupportedModelError(
            "attn_implementation='hsap' decodes reference-sliding-window layers (Unlimited-OCR) one token at a time "
            f"and without padding, but this step has {q_length} new tokens"
            f"{' and a padding mask' if attention_mask is not None else ''}; generate with "
            "attn_implementation='sdpa'")
    return True


def _chunk_size(config: Any, local_size: int | None) -> int | None:
    """The chunk of a chunked-attention mask call.

    Args:
        config: the model config, or ``None``.
        local_size: the mask call's ``local_size`` (also a sliding layer's window: only a model with chunked
            layers of that size makes it a chunk).

    Returns:
        The chunk size in tokens, or ``None`` (not a chunked-attention mask).
    """
    if local_size is None or config is None:
        return None
    return local_size if chunked_attention_size(config) == local_size else None


def _probe_documents(batch: int, length: int, mask_function: Any, attention_mask: torch.Tensor | None,
                     device: Any) -> tuple[torch.Tensor | None, bool]:
    """Document ids of a mask without cache, read off its sub-diagonal (see :func:`hsap_mask_function`).

    Args:
        batch, length: ``B`` and ``L``.
        mask_function: the composed index-based mask pattern, or ``None`` (causal).
        attention_mask: ``[B, >= L]`` padding mask (its last ``L`` columns are read), or ``None``.
        device: where the ids go (without an ``attention_mask``).

    Returns:
        ``(ids, packed)``: ``[B, L]`` int32 document ids (``None``: one causal document per row and no
        padding), and whether a row holds several segments.

    Raises:
        ValueError: the mask lets a token see its successor (not causal).
    """
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
        h = torch.zeros(1, dtype=torch.long, device=device)  # [1]: the pattern is the same for every head
        t = torch.arange(1, length, device=device)[None, :]  # [1, L - 1]
        sees_previous = torch.as_tensor(mask_function(b, h, t, t - 1), device=device).expand(batch, length - 1)
        sees_next = torch.as_tensor(mask_function(b, h, t - 1, t), device=device).expand(batch, length - 1)
        if bool(sees_next.any()):
            raise ValueError(
                "attn_implementation='hsap' computes causal attention only, but this model's mask lets tokens see "
                "later tokens (bidirectional blocks): for Gemma 3's image tokens, pack with PackingCollator(max_length, "
                "vision=hf_hsap.vision_spec(model)) and call model(**hf_hsap.shard_batch(batch, sp)) (the blocks are "
                "then exact), else use attn_implementation='sdpa'"
            )
        starts[:, 1:] = ~sees_previous
    packed = bool(starts[:, 1:].any())
    if valid is None and not packed:
        return None, False
    return document_ids(starts, valid), packed
