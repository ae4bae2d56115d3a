"""The ``"hsap"`` attention implementation for Hugging Face Transformers (registry only, no patching).

``register()`` adds ``"hsap"`` to ``AttentionInterface`` (the attention function) and to
``AttentionMaskInterface`` (a mask function that never builds a dense 4D mask). Afterwards
``from_pretrained(..., attn_implementation="hsap")`` and ``model.set_attn_implementation("hsap")`` work
for every model whose attention goes through ``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen2/3, Mistral, ...).

How documents are found (first match wins), see ``NOTES.md`` next to this file for the transformers side:

1. ``hsap_plan`` in the kwargs and the plan's SP size > 1: sequence-parallel attention
   (:func:`hf_hsap.hsap_attn_func`); the batch is one row of this rank's tokens in plan order.
2. ``cu_seq_lens_q`` (and optionally ``cu_seq_lens_k``) in the kwargs: documents over the flattened
   ``B * L`` tokens, exactly as flash-attention's padding-free path.
3. ``L_q == L_k`` (training, prefill): a new document starts at every row start and wherever
   ``position_ids`` does not continue (``p[t] != p[t-1] + 1``, the rule ``masking_utils`` uses for
   eager/SDPA, which includes every restart at 0). A 2D padding mask drops padded tokens (their output is 0);
   the valid tokens of a row must be contiguous (left or right padding).
4. ``L_q != L_k`` (generation with a KV cache): one causal segment per row, bottom-right aligned (the new
   queries are the last ``L_q`` of the ``L_k`` keys). A 2D mask may pad on the left only.

Refused with ``ValueError`` (the message names the fix): attention dropout > 0, sliding-window layers
whose window is shorter than a document's keys, non-causal modules, attention sinks (``s_aux``),
logit soft-capping, position biases, dense 4D masks and custom mask overlays.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..kernels import varlen_attention

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
    """Mask factory for ``"hsap"``: never a dense mask, only the 2D padding mask when it matters.

    Called by ``masking_utils.create_causal_mask`` / ``create_sliding_window_causal_mask``. Causality and
    document boundaries are handled by the attention function, so the only information kept is padding.

    Args:
        batch_size, q_length, kv_length, q_offset, kv_offset: mask geometry (only ``kv_length`` is used).
        mask_function: the composed mask pattern (ignored: the kernel is causal + document-masked).
        attention_mask: ``[B, seen + q_length]`` bool padding mask or ``None``.
        kwargs: ``use_vmap`` is True when a model adds a custom mask overlay, which is refused.

    Returns:
        ``None`` when there is no padding, else the padding mask's last ``kv_length`` columns
        (``[B, <= kv_length]`` bool).

    Raises:
        ValueError: a custom mask overlay (``or_mask_function`` / ``and_mask_function``) was requested.
    """
    if kwargs.get("use_vmap", False):
        raise ValueError(
            "attn_implementation='hsap' supports causal document-masked attention only, but this model adds a "
            "custom mask overlay (e.g. bidirectional image tokens); use attn_implementation='sdpa' for it"
        )
    if attention_mask is None:
        return None
    attention_mask = attention_mask[:, -kv_length:]  # sliding caches keep only the last kv_length keys
    if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
        return None
    return attention_mask.bool()


@dataclass(frozen=True)
class _Layout:
    """Documents of one local attention call over flattened tokens.

    ``q_index`` / ``k_index`` select the kept queries / keys of the flattened ``B * L`` tensors (``None``:
    all, in order); ``cu_q`` / ``cu_k`` are the segment boundaries over the kept tokens.
    """

    cu_q: tuple[int, ...]
    cu_k: tuple[int, ...]
    q_index: torch.Tensor | None = None
    k_index: torch.Tensor | None = None

    @property
    def max_k(self) -> int:
        return max((b - a for a, b in zip(self.cu_k, self.cu_k[1:])), default=0)


def _cu_from_starts(starts: torch.Tensor) -> tuple[int, ...]:
    """Segment boundaries from a flat bool ``[N]`` tensor marking segment starts (``starts[0]`` True)."""
    idx = torch.nonzero(starts, as_tuple=False).flatten().tolist()
    return tuple(idx) + (int(starts.numel()),)


_HOLES_FIX = "pack documents with position_ids / cu_seq_lens_q instead of masking, or pad on one side only"
_LEFT_PAD_FIX = "generate with left padding: set tokenizer.padding_side = 'left'"


def _row_ranges(valid: torch.Tensor, fix: str = _HOLES_FIX) -> tuple[torch.Tensor, torch.Tensor]:
    """First valid column and number of valid columns per row; raise if a row's valid part has holes.

    Args:
        valid: ``[B, M]`` bool padding mask.
        fix: the remedy named in the error message.

    Returns:
        ``(first, count)``, each ``[B]`` int64 (``first`` is meaningless where ``count == 0``).
    """
    count = valid.sum(dim=1)
    first = valid.int().argmax(dim=1)
    last = valid.shape[1] - 1 - valid.flip(1).int().argmax(dim=1)
    holes = (count > 0) & (last - first + 1 != count)
    if bool(holes.any()):
        raise ValueError(
            "attn_implementation='hsap' needs each row's attention_mask to be one contiguous block of ones "
            f"(left or right padding), got padding between tokens; {fix}"
        )
    return first, count


def document_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """Where documents start in packed rows: every row start, and wherever the position does not continue.

    The rule of ``masking_utils.find_packed_sequence_indices`` (``p[t] != p[t - 1] + 1``), so a packed row
    means the same to "hsap" as to eager/SDPA; it includes every restart at 0.

    Args:
        position_ids: ``[B, L]`` integer positions.

    Returns:
        ``[B, L]`` bool, True on the first token of each document.
    """
    starts = torch.ones(position_ids.shape, dtype=torch.bool, device=position_ids.device)  # [B, L]
    starts[:, 1:] = position_ids[:, 1:] - position_ids[:, :-1] != 1  # [B, L - 1]
    return starts


def _positions(position_ids: torch.Tensor | None, batch: int, length: int) -> torch.Tensor | None:
    """``position_ids`` as ``[B, L]`` (expanding a shared ``[1, L]``), or ``None``."""
    if position_ids is None:
        return None
    if position_ids.dim() != 2 or position_ids.shape[-1] != length:
        raise ValueError(
            f"attn_implementation='hsap' expects position_ids of shape [batch, {length}], got "
            f"{tuple(position_ids.shape)}; pass cu_seq_lens_q / cu_seq_lens_k to give the documents explicitly"
        )
    if position_ids.shape[0] != batch:
        position_ids = position_ids.expand(batch, -1)  # [1, L] -> [B, L]
    return position_ids


def _layout_same_length(
    batch: int, length: int, position_ids: torch.Tensor | None, mask: torch.Tensor | None, device: torch.device
) -> _Layout:
    """Documents when queries and keys are the same tokens (training, prefill): see module docstring, 3."""
    pos = _positions(position_ids, batch, length)
    starts = torch.zeros(batch, length, dtype=torch.bool, device=device)  # [B, L]
    if pos is not None:
        starts = document_starts(pos).to(device)
    starts[:, 0] = True
    if mask is None:
        cu = _cu_from_starts(starts.flatten())
        return _Layout(cu, cu)
    valid = mask.to(device=device, dtype=torch.bool)
    _row_ranges(valid)
    starts[:, 1:] |= ~valid[:, :-1]  # a valid token after padding starts a document
    keep = torch.nonzero(valid.flatten(), as_tuple=False).flatten()  # [N_valid] into B * L
    cu = _cu_from_starts(starts.flatten()[keep]) if keep.numel() else (0,)
    return _Layout(cu, cu, keep, keep)


def _layout_cached(batch: int, lq: int, lk: int, mask: torch.Tensor | None, device: torch.device) -> _Layout:
    """One bottom-right causal segment per row (decoding with a KV cache): see module docstring, 4."""
    if mask is None:
        return _Layout(tuple(range(0, batch * lq + 1, lq)), tuple(range(0, batch * lk + 1, lk)))
    valid = mask.to(device=device, dtype=torch.bool)
    m = valid.shape[1]  # a static cache holds lk >= m slots; slots past m are not filled yet
    if m > lk or m < lq:
        raise ValueError(f"attention_mask covers {m} keys but the cache holds {lk} keys for {lq} queries")
    first, count = _row_ranges(valid, _LEFT_PAD_FIX)
    if bool(((count > 0) & (first + count != m)).any()):
        raise ValueError(
            "attn_implementation='hsap' needs the new tokens to follow the last valid key of each row; "
            + _LEFT_PAD_FIX
        )
    first = torch.where(count > 0, first, torch.full_like(first, m))  # [B]; empty rows keep nothing
    k_cols = torch.arange(lk, device=device)  # [Lk]
    k_keep = (k_cols[None, :] >= first[:, None]) & (k_cols[None, :] < m)  # [B, Lk]
    q_keep = (m - lq + torch.arange(lq, device=device))[None, :] >= first[:, None]  # [B, Lq]
    cu_q = (0,) + tuple(int(x) for x in q_keep.sum(1).cumsum(0).tolist())
    cu_k = (0,) + tuple(int(x) for x in k_keep.sum(1).cumsum(0).tolist())
    q_index = torch.nonzero(q_keep.flatten(), as_tuple=False).flatten()  # [N_q kept] into B * Lq
    k_index = torch.nonzero(k_keep.flatten(), as_tuple=False).flatten()  # [N_k kept] into B * Lk
    return _Layout(cu_q, cu_k, q_index, k_index)


def _layout_from_cu(batch: int, lq: int, lk: int, kwargs: dict[str, Any], mask: torch.Tensor | None) -> _Layout:
    """Documents given explicitly by ``cu_seq_lens_q`` / ``cu_seq_lens_k``: see module docstring, 2."""
    if mask is not None:
        raise ValueError(
            "attn_implementation='hsap' got both cu_seq_lens_q and a padding attention_mask; put padding into "
            "its own document in cu_seq_lens_q and drop the attention_mask"
        )
    cu_q_t = kwargs["cu_seq_lens_q"]
    cu_k_t = kwargs.get("cu_seq_lens_k")
    cu_q = tuple(int(x) for x in cu_q_t.tolist())
    cu_k = cu_q if cu_k_t is None else tuple(int(x) for x in cu_k_t.tolist())
    if cu_q[-1] != batch * lq or cu_k[-1] != batch * lk or cu_q[0] != 0 or len(cu_q) != len(cu_k):
        raise ValueError(
            f"cu_seq_lens_q/k must start at 0 and end at the flattened token counts {batch * lq} / {batch * lk}, "
            f"got {cu_q[:1]}..{cu_q[-1:]} / {cu_k[:1]}..{cu_k[-1:]}; build them over the whole batch "
            "(hf_hsap.data.PackingCollator does)"
        )
    return _Layout(cu_q, cu_k)


def _check_supported(module: torch.nn.Module, dropout: float, kwargs: dict[str, Any]) -> int | None:
    """Refuse attention variants the kernel does not compute; return the sliding window (or ``None``)."""
    name = type(module).__name__
    if dropout and dropout > 0:
        raise ValueError(
            f"attn_implementation='hsap' has no attention dropout ({name} asked for p={dropout}); set "
            "model.config.attention_dropout = 0.0 (dropout elsewhere in the model is unaffected)"
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
    """Longest document of a plan's layout, in tokens."""
    cu = _plan_cu_seqlens(plan)
    return max((int(b) - int(a) for a, b in zip(cu[:-1], cu[1:])), default=0)


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
        attention_mask: ``None`` or the ``[B, <= Lk]`` bool padding mask from :func:`hsap_mask_function`.
        scaling: softmax scale, default ``D ** -0.5``.
        dropout: must be 0.
        kwargs: ``hsap_plan``, ``cu_seq_lens_q/k``, ``position_ids``, ``sliding_window``, ``is_causal``, ...

    Returns:
        ``(attn_output [B, Lq, Hq, Dv], None)``; padded queries get output 0.

    Raises:
        ValueError: for unsupported attention variants or inputs (see the module docstring).
    """
    window = _check_supported(module, dropout, kwargs)
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"attn_implementation='hsap' never uses dense masks, but got a {attention_mask.dim()}D attention_mask; "
            "pass a 2D padding mask, or position_ids / cu_seq_lens_q for packed documents"
        )
    head_dim, v_head_dim = query.shape[-1], value.shape[-1]
    if v_head_dim > head_dim:
        raise ValueError(f"attn_implementation='hsap' needs value head_dim <= query head_dim, got {v_head_dim} > "
                         f"{head_dim}; use attn_implementation='sdpa' for this model")
    if v_head_dim < head_dim:  # e.g. MLA: pad values like flash-attention does, crop the output below
        value = torch.nn.functional.pad(value, [0, head_dim - v_head_dim])  # [B, Hkv, Lk, D]
    plan = kwargs.get("hsap_plan")
    if plan is not None and attention_mask is not None:
        raise ValueError("hsap_plan does not combine with a padding attention_mask; make padding its own document")
    if plan is not None and plan.size > 1:
        _check_window(module, window, _plan_longest_doc(plan))
        out = _sp_attention(query, key, value, plan, scaling)
        return out[..., :v_head_dim], None
    batch, lq, lk = query.shape[0], query.shape[2], key.shape[2]
    if plan is not None:  # SP size 1: the plan's layout covers the flattened batch in global order
        cu = tuple(int(x) for x in _plan_cu_seqlens(plan))
        if lq != lk or cu[-1] != batch * lq:
            raise ValueError(f"hsap_plan covers {cu[-1]} tokens but the batch has {batch} x {lq} queries, {lk} keys")
        layout = _Layout(cu, cu)
    elif kwargs.get("cu_seq_lens_q") is not None:
        layout = _layout_from_cu(batch, lq, lk, kwargs, attention_mask)
    elif lq == lk and (attention_mask is None or attention_mask.shape[1] == lk):
        layout = _layout_same_length(batch, lq, kwargs.get("position_ids"), attention_mask, query.device)
    else:
        layout = _layout_cached(batch, lq, lk, attention_mask, query.device)
    _check_window(module, window, layout.max_k)
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
