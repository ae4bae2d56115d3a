"""DeepSeek-sparse-attention style ``"indexed_attention"`` layers, exact per document on packed rows and under SP.

An indexed layer (DeepSeek-V3.2, GLM-MoE-DSA, dots3, AXK2, HY-V4, Mistral-Large-4, ...) scores every key of the
causal prefix with a small *lightning indexer* (under ``no_grad``: it selects, it gets no gradient), keeps the
``index_topk`` best keys per query (``topk`` indices ``[B, S, k]``; ``"shared"`` layers reuse the previous layer's)
and runs softmax attention over those keys only. Transformers hands the indices to the attention function as
``indices=`` (an ``"eager"`` / ``"sdpa"`` model folds them into a dense mask instead). Two other kinds build the
mask in the layer (:mod:`.indexed_masks`): GLM-5-Next scatters its pooled top-k into a mask, Qwen4-Exp's QSA
indexer returns a selection mask; hf_hsap runs their indexers per document the same way, and the bool mask that
reaches the attention is then the allowed keys.

Exact per document means each query's top-k is the one the document alone gives: its indexer's scores over its own
document's causal prefix only (a prefix shorter than ``k`` keeps all of it: ``topk`` then also returns masked keys,
which stay masked), and its attention over the selected keys of that prefix only. What hf_hsap does
(:func:`prepare_indexed`, called by :func:`~.prepare.prepare_model`, before its model check's probe forward):

* a forward pre-hook on every indexed layer replaces the ``"hsap"`` mask (document ids) by a dense ``[B, 1, S, L]``
  bool mask, *same document and causal*, of the layer's ``S`` queries over the row's ``L`` keys in global order
  (from the plan's layout when there is a plan, else from the ids the mask function read off the packed
  ``position_ids``), and keeps the call's documents for the indexer;
* the indexer's forward is run **on each document alone** (:func:`_indexer_forward`): its inputs (under SP first
  all-gathered over the SP group: hidden states, query latent, rotary ``cos`` / ``sin``; values only, the indexer
  has no gradient) cut to the document, with the causal mask Transformers builds for a document alone. The top-k
  is then taken from the very tensor the document alone scores, so even exact ties (keys whose every indexer head's
  ReLU is 0) are broken as there; this rank's queries keep their indices, shifted to global key positions. Scoring
  the packed row instead would break ties, and float32 near-ties of the indexer's float32 scores, by the row's
  shape, not the document's;
* the ``"hsap"`` attention function sends an indexed layer's call to :func:`indexed_forward`: under a plan the keys
  and values of the whole row are gathered over the SP group in global order (differentiable: the backward sums
  every rank's key / value gradient, one all-reduce, and keeps this rank's rows), and a dense softmax attention of
  the local queries runs over the keys that are selected *and* in the query's document-causal prefix (sinks and
  soft-capping as the layer asks).

Cost per indexed layer and rank (``L`` row tokens, ``S = L / P`` local queries, ``T_d`` a document's tokens):
all-gathers of ``L`` rows of ``hidden + q_lora + rope`` values (indexer inputs) and of ``L`` rows of keys and values
(``H * (Dk + Dv)``), one all-reduce of ``L`` rows of key / value gradient in the backward; compute
``sum_d T_d^2 * H_idx * D_idx`` for the indexer over the documents this rank's queries are in (a document split over
ranks is scored by each of them: the simplest exact path, with the family's indexer unchanged) and
``O(S * L * H * D)`` for the attention; memory ``O(T_d^2 * H_idx)`` indexer scores of the longest document (as
Transformers' indexer on that document alone) and ``O(S * L * H)`` attention scores and mask. One indexer call per
document and layer: a row of many short documents pays their Python overhead. Exact: float64 logits and every
parameter gradient against each document alone (``tests/model/test_indexed.py``, the zoos).
Refused, each with its fix: a KV cache (generation: use ``"eager"``), bidirectional image blocks in an indexed
layer, an unprepared model, indexed layers that hand their selection to the attention in a way
:func:`~.indexed_layers.indexed_kind` does not know (:func:`~.indexed_layers.other_indexed_layers`, refused by
:func:`~.model_check.check_model`).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..config import text_config
from ..data.positions import document_starts
from ..log import get_logger
from ..model_state import INDEXED, INDEXED_DOCS, INDEXED_MASK, ModelChanges, state_of
from .indexed_layers import (KIND_INDICES, KIND_TOPK_MASK, has_indexed_layers, indexed_kind, indexed_layers,
                             other_indexed_layers)
from .indexed_masks import check_padding, place_selection, topk_mask_builder
from .local_layout import document_ids
from .model_check import UnsupportedModelError
from .plan_relay import relayed
from .plan_use import plan_use_of
from .sharding import text_positions

__all__ = ["check_indexed_ready", "has_indexed_layers", "indexed_forward", "indexed_layers", "other_indexed_layers",
           "prepare_indexed"]  # the layer queries re-exported from indexed_layers

logger = get_logger(__name__)

_FIX_PREPARE = ("call hf_hsap.prepare_model(model, sp_size=...) once before the first forward (the trainers do): "
                "it makes the indexer and its top-k exact per document")
_READY: dict[int, Any] = {}  # id(text config) -> weakref of the config, for the configs of prepared models


def _is_ready(config: Any) -> bool:
    ref = _READY.get(id(config))
    return ref is not None and ref() is config


def check_indexed_ready(config: Any, *, cache: bool) -> None:
    """Refuse an ``"hsap"`` mask call of a model with indexed layers that :func:`prepare_indexed` did not prepare, or
    one with a KV cache (called by the mask function before any layer runs).

    Args:
        config: the decoder config the mask function got. cache: whether the call has a KV cache.

    Raises:
        UnsupportedModelError: naming the fix.
    """
    if config is None or not has_indexed_layers(config):
        return
    family = getattr(text_config(config), "model_type", type(config).__name__)
    if cache:
        raise UnsupportedModelError(f"attn_implementation='hsap' has no indexed attention with a KV cache ({family}); "
                                    "generate with attn_implementation='eager'")
    if not _is_ready(text_config(config)):
        raise UnsupportedModelError(f"{family}'s indexed-attention layers select their keys with a top-k over the "
                                    f"packed row; {_FIX_PREPARE}")


def _plan_of(module: torch.nn.Module, kwargs: dict[str, Any]) -> Any:
    plan = kwargs.get("hsap_plan")
    return plan if plan is not None else relayed(module, "hsap_plan")


def _plan_docs(plan: Any, device: torch.device) -> torch.Tensor:
    """The document index of every token of the plan's row. Shapes: ``[L]`` int64."""
    cu = torch.as_tensor(plan.layout.cu_seqlens, device=device)  # [n_docs + 1]
    return torch.searchsorted(cu, torch.arange(plan.total_tokens, device=device), right=True) - 1


def _plan_mask(plan: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The document-causal mask of this rank's queries over the row's keys in global order, and the queries'
    global positions. Shapes: ``[S, L]`` bool, ``[S]`` int64."""
    doc = _plan_docs(plan, device)  # [L]
    keys = torch.arange(doc.shape[0], device=device)  # [L]
    pos = plan.local_token_indices(0 if plan.size == 1 else None).to(device)  # [S] (an SP-1 plan has no rank)
    return (doc[None, :] == doc[pos][:, None]) & (keys[None, :] <= pos[:, None]), pos


def _ids_mask(ids: torch.Tensor | None, batch: int, length: int, device: torch.device) -> torch.Tensor:
    """The document-causal mask of a whole row from the mask function's ``[B, L]`` int32 ids (``0``: padding;
    ``None``: one document per row). Shapes: ``-> [B, L, L]`` bool."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()  # [L, L]
    if ids is None:
        return causal.expand(batch, length, length)
    same = (ids[:, :, None] == ids[:, None, :]) & (ids[:, None, :] != 0)  # [B, L, L]
    return same & causal


@dataclass(frozen=True)
class _Documents:
    """The documents an indexed layer's forward runs its indexer on.

    Attributes:
        spans: per row, the ``(start, end)`` token spans of its documents (global order; padding left out).
        positions: ``[S]`` global positions of the layer's queries (one row: the plan's local tokens).
        plan: the call's plan (the indexer's inputs are gathered to the whole row), or ``None``.
    """

    spans: tuple[tuple[tuple[int, int], ...], ...]
    positions: torch.Tensor
    plan: Any = None


def _row_documents(ids: torch.Tensor | None, position_ids: Any, batch: int, length: int,
                   device: torch.device) -> torch.Tensor | None:
    """Per-token document ids of rows without a plan, by the rule of the local attention
    (:func:`~.local_layout.layout_same_length`): the mask function's ids (documents of the composed mask, ``0`` on
    padding) and, where the layer gets 1-D ``[B, L]`` ``position_ids``, a new document wherever they do not
    continue (Transformers looks for packed rows only without a padding mask). Multimodal rotary positions
    (``[3, B, L]``) say nothing about documents and are left out. Shapes: ``-> [B, L]`` int32 or ``None``."""
    pos = position_ids if torch.is_tensor(position_ids) and position_ids.dim() == 2 else None
    if pos is None or pos.shape[-1] != length:
        return ids
    starts = document_starts(pos.expand(batch, -1)).to(device)  # [B, L]
    valid = None
    if ids is not None:
        starts[:, 1:] |= ids[:, 1:] != ids[:, :-1]
        valid = ids > 0
    return document_ids(starts, valid)


def _spans_of_ids(ids: torch.Tensor | None, batch: int, length: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Document spans of every row from the mask function's ``[B, L]`` ids (``0``: padding, left out)."""
    if ids is None:
        return tuple(((0, length),) for _ in range(batch))
    rows = []
    for row in ids.tolist():
        cuts = [0] + [t for t in range(1, length) if row[t] != row[t - 1]] + [length]
        rows.append(tuple((a, b) for a, b in zip(cuts[:-1], cuts[1:]) if row[a] != 0))
    return tuple(rows)


def _mask_hook(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """Forward pre-hook of an indexed layer: the dense document-causal ``[B, 1, S, L]`` mask in place of the
    ``"hsap"`` mask, and the call's documents kept for the indexer (:func:`_indexer_forward`)."""
    if kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:
            raise UnsupportedModelError("attn_implementation='hsap' has no indexed attention with a KV cache; generate "
                                    "with attn_implementation='eager'")
    if kwargs.get("hsap_blocks") is not None or relayed(module, "hsap_blocks") is not None:
        raise ValueError(f"{type(module).__name__}: bidirectional image blocks in an indexed-attention layer are not "
                         "implemented by hf_hsap; pack this family without them")
    hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]  # [B, S, hidden]
    batch, length = hidden.shape[:2]
    plan = _plan_of(module, kwargs)
    own = state_of(module, INDEXED) == KIND_TOPK_MASK  # the layer builds its mask: its own stays for its indexer
    if own:
        check_padding(module, kwargs.get("attention_mask"), plan, fix=_FIX_PREPARE)
    if plan is not None:
        mask, positions = _plan_mask(plan, hidden.device)  # [S, L], [S]
        mask = mask[None, None]  # [1, 1, S, L]
        cu = [int(x) for x in plan.layout.cu_seqlens]
        docs = _Documents((tuple(zip(cu[:-1], cu[1:])),), positions, plan)
    else:
        ids = kwargs.get("attention_mask")
        pos = kwargs.get("position_ids")
        if own:  # a [B, L] bool padding mask (or None); documents from the text positions
            ids = None if ids is None else ids.to(torch.int32)
            pos = text_positions(pos, torch.Size((batch, length))) if torch.is_tensor(pos) and pos.dim() == 3 else pos
        elif ids is not None and (ids.dtype == torch.bool or ids.dim() != 2):
            raise ValueError(f"{type(module).__name__}: an indexed-attention layer got a {ids.dim()}D "
                             f"{ids.dtype} mask; {_FIX_PREPARE} and pass packed rows with position_ids")
        ids = _row_documents(ids, pos, batch, length, hidden.device)
        mask = _ids_mask(ids, batch, length, hidden.device)[:, None]  # [B, 1, L, L]
        docs = _Documents(_spans_of_ids(ids, batch, length), torch.arange(length, device=hidden.device))
    if own:
        module.__dict__[INDEXED_MASK] = mask
    else:
        kwargs["attention_mask"] = mask
    if getattr(module, "indexer", None) is not None:
        module.indexer.__dict__[INDEXED_DOCS] = docs
    return args, kwargs


def _forget_documents(module: torch.nn.Module, args: tuple, output: Any) -> None:
    """Forward hook of an indexed layer: its indexer lets go of the call's documents (and plan) once it ran."""
    module.__dict__[INDEXED_MASK] = None
    if getattr(module, "indexer", None) is not None:
        module.indexer.__dict__[INDEXED_DOCS] = None


def _gathered(x: Any, plan: Any, batch: int, local: int) -> Any:
    """``x`` with its token dimension (dim 1 of ``[B, S, ...]``) gathered to the whole row in global order under a
    plan (tuples element-wise; other values unchanged). Values only: the indexer has no gradient."""
    if isinstance(x, (tuple, list)):
        return type(x)(_gathered(y, plan, batch, local) for y in x)
    if plan is not None and _is_tokens(x, batch, local):
        return plan.gather(x.detach()[0], 0)[None]
    return x


def _is_tokens(x: Any, batch: int, length: int) -> bool:
    return (torch.is_tensor(x) and x.dim() >= 2 and x.shape[0] in (1, batch) and x.shape[1] == length
            and x.dtype != torch.bool)


def _document_input(x: Any, row: int, span: tuple[int, int], batch: int, length: int, mask: torch.Tensor) -> Any:
    """One document's slice of an indexer input: token tensors cut to the span of the row, the layer's bool mask
    replaced by the document's own causal mask (``mask``), other values unchanged."""
    if isinstance(x, (tuple, list)):
        return type(x)(_document_input(y, row, span, batch, length, mask) for y in x)
    if torch.is_tensor(x) and x.dtype == torch.bool and x.dim() in (3, 4):  # the layer's document-causal mask
        return mask.view((1,) * (x.dim() - 2) + tuple(mask.shape[-2:]))
    if torch.is_tensor(x) and x.dtype == torch.bool and x.dim() == 2:  # a [B, L] padding mask (GLM-5-Next)
        if x.shape[-1] == length:
            return x[row if x.shape[0] == batch else 0][None, span[0]:span[1]]
        return torch.ones(1, span[1] - span[0], dtype=torch.bool, device=x.device)  # a rank's all-valid tokens
    if _is_tokens(x, batch, length):
        r = row if x.shape[0] == batch else 0
        return x[r:r + 1, span[0]:span[1]]
    return x


def _indexer_forward(indexer: torch.nn.Module, original: Any) -> Any:
    """The indexer's forward run on each document alone: its inputs (gathered to the whole row under a plan) cut to
    the document, with the causal mask Transformers builds for a document alone (``0`` / the dtype's minimum, as the
    eager mask), so the top-k is taken from the very scores the document alone has (ties included); the indices of
    this call's queries, shifted to global key positions, ``-1`` padded to the widest document's ``k``."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        docs = state_of(indexer, INDEXED_DOCS)
        if docs is None:
            return original(*args, **kwargs)
        hidden = args[0] if args else kwargs["hidden_states"]
        batch, local = hidden.shape[:2]
        args = tuple(_gathered(a, docs.plan, batch, local) for a in args)
        kwargs = {k: _gathered(v, docs.plan, batch, local) for k, v in kwargs.items()}
        length = docs.plan.total_tokens if docs.plan is not None else local
        positions = docs.positions
        picked, selections = [], []
        for row, spans in enumerate(docs.spans):
            for span in spans:
                rows = ((positions >= span[0]) & (positions < span[1])).nonzero().flatten()  # [n] local queries
                if rows.numel() == 0:
                    continue
                n = span[1] - span[0]
                causal = torch.ones(n, n, dtype=torch.bool, device=hidden.device).tril()
                mask = torch.zeros(n, n, dtype=hidden.dtype, device=hidden.device)
                mask = mask.masked_fill(~causal, torch.finfo(hidden.dtype).min)[None]  # [1, n, n]
                cut = [_document_input(a, row, span, batch, length, mask) for a in args]
                out = original(*cut, **{k: _document_input(v, row, span, batch, length, mask)
                                        for k, v in kwargs.items()})
                if torch.is_tensor(out) and out.dtype == torch.bool and out.dim() == 4:  # a selection mask (QSA)
                    selections.append((row, rows, span, out[0, 0].index_select(0, positions[rows] - span[0])))
                    continue
                if not torch.is_tensor(out) or out.is_floating_point() or out.dim() != 3:
                    raise UnsupportedModelError(
                        f"{type(indexer).__name__} returns {type(out).__name__} rather than top-k key indices "
                        "[B, S, k]; hf_hsap runs DeepSeek-sparse indexers only: train this family with one document "
                        "per row (attn_implementation='eager')")
                idx = out[0].index_select(0, positions[rows] - span[0])  # [n_rows, k_doc]
                picked.append((row, rows, torch.where(idx >= 0, idx + span[0], idx)))
        if selections:
            return place_selection(selections, batch=batch, local=local, length=length, device=hidden.device)
        width = max((p[2].shape[-1] for p in picked), default=1)
        dtype = picked[0][2].dtype if picked else torch.int32
        result = torch.full((batch, local, width), -1, dtype=dtype, device=hidden.device)  # [B, S, k]
        for row, rows, idx in picked:
            result[row, rows, : idx.shape[-1]] = idx
        return result

    return forward


def prepare_indexed(model: torch.nn.Module, changes: ModelChanges) -> int:
    """Make the model's indexed attention layers exact per document (module docstring); recorded in ``changes``.

    Args:
        model: a Transformers model whose decoder has ``"indexed_attention"`` layers (else nothing is done).
        changes: the preparation's journal.

    Returns:
        The number of indexed layers prepared.
    """
    layers = indexed_layers(model)
    for layer in layers:
        kind = indexed_kind(type(layer))
        changes.put(layer, INDEXED, kind)
        if kind == KIND_TOPK_MASK:
            changes.put(layer, INDEXED_MASK, None)
            changes.set(layer, "build_attention_mask_from_topk", topk_mask_builder(layer))
        changes.hook(layer.register_forward_pre_hook(_mask_hook, with_kwargs=True))
        changes.hook(layer.register_forward_hook(_forget_documents))
        if layer.indexer is not None:
            changes.put(layer.indexer, INDEXED_DOCS, None)
            changes.set(layer.indexer, "forward", _indexer_forward(layer.indexer, layer.indexer.forward))
    configs = {id(text_config(layer.config)): text_config(layer.config) for layer in layers}
    configs.update({id(m.config): m.config for m in layers})
    for key, config in configs.items():
        _READY[key] = weakref.ref(config)
        changes.on_undo(lambda key=key: _READY.pop(key, None))
    if layers:
        logger.info("prepare_model: %d indexed-attention layers (%s): each document's indexer runs on that document "
                    "alone (its top-k as alone, ties included) and the attention is a dense document-causal one over "
                    "the selected keys; under SP the indexer inputs and the keys / values of the whole row are "
                    "all-gathered over the SP group (the simplest exact path, not a sequence-parallel one)",
                    len(layers), type(layers[0]).__name__)
    return len(layers)


class _GatherTokens(torch.autograd.Function):
    """The whole row's tokens (dim 2 of ``[1, H, S, D]``) in global order; the backward sums every rank's gradient
    (one all-reduce) and keeps this rank's rows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, plan: Any) -> torch.Tensor:
        ctx.plan = plan
        return plan.gather(x, 2) if plan.size > 1 else plan.unshard([x], 2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        plan = ctx.plan
        grad = grad.contiguous()
        if plan.size > 1:
            dist.all_reduce(grad, group=plan.sp.group)
        return plan.shard(grad, 2, rank=0 if plan.size == 1 else None), None


def indexed_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor, *, indices: torch.Tensor | None, plan: Any, plan_use: Any,
                    scaling: float | None, window: int | None, softcap: float | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention of an indexed layer over its selected keys of each query's document-causal prefix.

    Args:
        module: the indexed layer. query: this rank's queries. key, value: this rank's keys and values (the whole
            row at one rank without a plan). attention_mask: the pre-hook's document-causal mask.
        indices: the top-k key indices (global order; negative: none). plan: the call's plan, or ``None``.
        plan_use: the call's ``hsap_plan_use`` record. scaling: softmax scale. window: a sliding window, or ``None``.
        softcap: logit soft-cap, or ``None``. sinks: ``[Hq]`` sink logits (in the denominator), or ``None``.

    Returns:
        The attention output.

    Shapes:
        query ``[B, Hq, S, D]``, key / value ``[B, Hkv, S_kv, D / Dv]``, attention_mask ``[B, 1, S, L]``,
        indices ``[B, S, k]`` -> ``[B, S, Hq, Dv]``.
    """
    if indices is None and state_of(module, INDEXED) == KIND_INDICES:
        raise ValueError(f"{type(module).__name__}: an indexed-attention layer called the attention without its "
                         f"top-k indices; {_FIX_PREPARE}")
    if attention_mask is None or attention_mask.dtype != torch.bool or attention_mask.dim() != 4:
        raise ValueError(f"{type(module).__name__}: an indexed-attention layer without hf_hsap's document-causal "
                         f"mask; {_FIX_PREPARE}")
    if plan is not None:
        key, value = _GatherTokens.apply(key, plan), _GatherTokens.apply(value, plan)
        if plan.size > 1:
            use = plan_use_of(plan, plan_use)
            if use is not None:
                use.record(module)
    n_keys = key.shape[2]
    allowed = attention_mask[:, 0]  # [B, S, L]; a layer that built its own mask: already the selected keys
    if indices is not None:
        idx = indices.long()
        idx = torch.where(idx < 0, torch.full_like(idx, n_keys), idx)  # [B, S, k]; a negative index selects nothing
        selected = torch.zeros(*idx.shape[:2], n_keys + 1, dtype=torch.bool, device=idx.device)
        allowed = selected.scatter(-1, idx, True)[..., :n_keys] & allowed  # [B, S, L]
    if window is not None:
        dev = allowed.device
        pos = _plan_mask(plan, dev)[1] if plan is not None else torch.arange(query.shape[2], device=dev)
        allowed = allowed & (torch.arange(n_keys, device=allowed.device)[None, :] > pos[:, None] - window)
    compute = torch.promote_types(query.dtype, torch.float32)
    q, k, v = query.to(compute), key.to(compute), value.to(compute)
    group = q.shape[1] // k.shape[1]
    if group > 1:  # grouped-query heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [B, H, S, L]
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    if sinks is not None:  # one sink logit per head joins the denominator (GPT-OSS / HY-V4), no value
        sink = sinks.to(compute).reshape(1, -1, 1, 1).expand(*scores.shape[:3], 1)  # [B, H, S, 1]
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    probs = torch.where(allowed.any(-1)[:, None, :, None], probs, torch.zeros_like(probs))  # padding: output 0
    out = torch.matmul(probs, v)  # [B, H, S, Dv]
    return out.transpose(1, 2).to(query.dtype)  # [B, S, H, Dv]
