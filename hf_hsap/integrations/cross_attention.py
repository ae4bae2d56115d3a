"""The ``"hsap"`` attention of a cross-attention layer (Mllama's text-to-image layers): per document, on local keys.

Its queries are this rank's text tokens and its keys the vision states of the rank's images
(:func:`hf_hsap.multimodal.cross.shard_cross`), so it needs no plan and no communication. With the batch's
:class:`~hf_hsap.multimodal.cross.CrossDocs` a token attends only to its own document's images: the model's additive
mask where it allows something, evenly over its own images where the model emptied the row, and nothing (output 0)
for a document without images, which run alone would skip the layer. Without them (one document per row) it is the
model's masked softmax attention as eager computes it. The scores are ``T_local x keys``, as dense as the model's
own mask.
"""
from __future__ import annotations

from typing import Any

import torch

from .plan_use import plan_use_of

__all__ = ["cross_forward"]


def cross_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None, *, docs: Any = None, plan: Any = None,
                  plan_use: Any = None) -> torch.Tensor:
    """Cross-attention of the text queries over the vision keys.

    Args:
        module: the calling layer; query: ``[B, Hq, Lq, D]``; key, value: ``[B, Hkv, Lk, D]``;
        attention_mask: the model's additive mask ``[B, 1, Lq, Lk]`` or ``None``; scaling: default ``D ** -0.5``;
        docs: the batch's ``CrossDocs`` (``B == 1``, ``Lq`` local tokens) or ``None``; plan, plan_use: the call's
        ``hsap_plan`` / ``hsap_plan_use`` (the layer is recorded as having run on the sharded batch).

    Returns:
        ``[B, Lq, Hq, D]``.

    Raises:
        ValueError: ``docs`` that do not describe the call's queries or keys.
    """
    b, hq, lq, d = query.shape
    lk = key.shape[2]
    if plan is not None and plan.size > 1:
        use = plan_use_of(plan, plan_use)
        if use is not None:
            use.record(module)
    k = key.repeat_interleave(hq // key.shape[1], dim=1)
    v = value.repeat_interleave(hq // value.shape[1], dim=1)
    compute = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    scores = torch.matmul(query.to(compute), k.to(compute).transpose(-1, -2)) * (scaling or d ** -0.5)
    if attention_mask is not None:
        scores = scores + attention_mask[..., :lk].to(compute)
    empty = None
    if docs is not None:
        ranges = docs.ranges.to(query.device)
        if b != 1 or ranges.shape[0] != lq or docs.n_images < 1 or lk % docs.n_images:
            raise ValueError(f"{type(module).__name__}: hsap_cross describes {ranges.shape[0]} tokens and "
                             f"{docs.n_images} images, but the call has {b} x {lq} queries and {lk} keys; pass the "
                             "batch through hf_hsap.shard_batch and every key of its output to model(**local)")
        per = lk // docs.n_images
        lo, hi = ranges[:, 0] * per, ranges[:, 1] * per  # [Lq] own keys
        kidx = torch.arange(lk, device=query.device)
        empty = hi == lo
        own = ((kidx >= lo[:, None]) & (kidx < hi[:, None])) | empty[:, None]  # [Lq, Lk]
        scores = scores.masked_fill(~own, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v.to(compute)).to(query.dtype)  # [B, Hq, Lq, D]
    if empty is not None and bool(empty.any()):
        out = out.masked_fill(empty[None, None, :, None], 0.0)
    return out.transpose(1, 2).contiguous()
