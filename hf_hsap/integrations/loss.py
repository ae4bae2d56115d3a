"""Exact causal-LM loss under sequence and data parallelism.

With ``W = sp.size * sp.dp_size`` ranks and ``N`` valid targets in all DP groups' global batches together,
single-device training minimises ``L = sum(CE over all N targets) / N``. Under SP a rank holds only its
tokens, so it computes ``sum(local CE) / N``; summed over the ranks this is exactly ``L``. Data parallel
wrappers (DDP, FSDP, Accelerate) *average* gradients over the ``W`` ranks, so each rank multiplies its loss
by ``W`` (``grad_scale``)::

    rank loss = W * sum(local CE) / N        ->  DDP mean over W ranks  ->  grad of sum(CE) / N  (exact)

Transformers' Trainer does the same with ``average_tokens_across_devices=True``: it counts ``shift_labels``
of every rank's (local) batch, all-gathers the counts, and multiplies the loss by ``num_processes``; the
HSAP trainers rely on that. A batch without valid targets gives a finite zero loss (``N`` is clamped to 1).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from .plan_use import check_plan_used
from .sharding import IGNORE_INDEX

__all__ = ["dp_grad_scale", "global_num_items", "hsap_causal_lm_loss", "hsap_model_loss", "reduce_loss_for_logging"]

# Keys of a sharded batch that are targets or counts, never model inputs (hsap_model_loss passes the rest)
TARGET_KEYS = ("labels", "shift_labels", "num_items_in_batch")


def global_num_items(
    shift_labels: torch.Tensor, sp: Any, include_dp: bool = True, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """Valid targets over the SP group (and the DP groups) from every rank's *local* ``shift_labels``.

    Args:
        shift_labels: ``[1, T_local]`` this rank's targets (from :func:`~.sharding.shard_batch`).
        sp: the :class:`~hf_hsap.SPGroup` (collective over its group and, with ``include_dp``, its DP group).
        include_dp: also sum over the data-parallel groups (the ``N`` of the module docstring).
        ignore_index: label value without a target.

    Returns:
        0-dim int64 tensor on ``shift_labels``'s device, at least 1.
    """
    import torch.distributed as dist

    count = (shift_labels != ignore_index).sum().to(torch.int64)
    if getattr(sp, "size", 1) > 1:
        dist.all_reduce(count, group=sp.group)
    if include_dp and getattr(sp, "dp_size", 1) > 1:
        dist.all_reduce(count, group=sp.dp_group)
    return count.clamp_min(1)


def dp_grad_scale(sp: Any) -> int:
    """``W``: the number of ranks a DP wrapper averages gradients over when it spans SP and DP ranks."""
    return int(getattr(sp, "size", 1)) * int(getattr(sp, "dp_size", 1))


def hsap_causal_lm_loss(
    logits: torch.Tensor,
    shift_labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int,
    grad_scale: float = 1.0,
    ignore_index: int = IGNORE_INDEX,
    sp: Any = None,
) -> torch.Tensor:
    """``grad_scale * sum(CE of local tokens) / num_items_in_batch``, computed in float32.

    Args:
        logits: ``[1, T_local, V]`` (any leading shape whose product is ``T_local``).
        shift_labels: ``[1, T_local]`` targets (already shifted, ``-100`` = none).
        num_items_in_batch: global valid targets ``N`` (:func:`global_num_items`); values < 1 count as 1.
        grad_scale: ``W`` when a DP wrapper averages gradients over ``W`` ranks (:func:`dp_grad_scale`), else 1.
        ignore_index: label value without a target.
        sp: the SP group the batch was sharded for: first check that the forward which made ``logits`` ran
            the plan of the group's last :func:`~.sharding.shard_batch` through every attention layer.

    Returns:
        0-dim float32 loss; 0 (with zero gradients) when no local target is valid.

    Raises:
        PlanNotUsedError: (with ``sp``) the model's attention layers did not all consume the plan.
    """
    use = getattr(sp, "pending_plan_use", None)
    if use is not None and not use.checked:
        check_plan_used(use)
    vocab = logits.shape[-1]
    ce = F.cross_entropy(logits.float().reshape(-1, vocab), shift_labels.reshape(-1).to(logits.device),
                         ignore_index=ignore_index, reduction="sum")  # [T_local, V] -> scalar
    n = torch.as_tensor(num_items_in_batch, device=ce.device).clamp_min(1)
    return ce * grad_scale / n


def hsap_model_loss(
    model: torch.nn.Module,
    local: dict[str, Any],
    num_items_in_batch: torch.Tensor | int,
    grad_scale: float = 1.0,
    sp: Any = None,
    *,
    metrics: Any = None,
    **model_kwargs: Any,
) -> torch.Tensor:
    """The model's forward on a sharded batch and its loss: through the chunked LM head when the model has one (the
    logits never exist whole), else from the full logits (:func:`hsap_causal_lm_loss`; logged).

    The same value either way (to float32 rounding); the chunked head holds one tile of about 16M logits instead of
    ``[T_local, V]`` logits, their log-softmax and their gradient.

    Args:
        model: the model (wrapped or not); :func:`hf_hsap.prepare_model` (``levers=``) gives it the chunked
            head.
        local: this rank's batch (:func:`~.sharding.shard_batch` / :class:`~.dataloader.SPDataLoader`): every key
            but the targets and counts goes to the model, ``shift_labels`` ``[1, T_local]`` to the loss.
        num_items_in_batch: ``N`` (:func:`global_num_items`). grad_scale: ``W`` (:func:`dp_grad_scale`).
        sp: the SP group: check that the forward ran the plan through every attention layer.
        metrics: token metrics (entropy, top-1 accuracy) the chunked head fills from its tiles (``None``: none).
        **model_kwargs: more model inputs (they override ``local``'s).

    Returns:
        0-dim float32 ``grad_scale * sum(CE of local tokens) / N``.

    Raises:
        ValueError: ``local`` has no ``shift_labels``.
        PlanNotUsedError: (with ``sp``) an attention layer did not consume the plan.
    """
    from ..log import get_logger
    from ..memory.head import find_chunked_head

    if local.get("shift_labels") is None:
        raise ValueError("the batch has no shift_labels (shard_batch makes them from labels)")
    inputs = {k: v for k, v in local.items() if k not in TARGET_KEYS}
    inputs.update(model_kwargs)
    head = find_chunked_head(model)
    if head is None:
        get_logger(__name__).info("hf_hsap: the model has no chunked LM head; the loss comes from the full logits "
                                  "(hf_hsap.prepare_model(model, levers=hf_hsap.MemoryLevers()) gives it one)")
        return hsap_causal_lm_loss(model(**inputs).logits, local["shift_labels"], num_items_in_batch, grad_scale,
                                   sp=sp)
    with head.loss_for(local["shift_labels"], num_items_in_batch, grad_scale, metrics=metrics) as request:
        out = model(**inputs)
    use = getattr(sp, "pending_plan_use", None)
    if use is not None and not use.checked:
        check_plan_used(use)
    logits = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor) and logits.numel() == 0 and logits.requires_grad:
        # the head's empty logits hang off the loss through the wrappers' output hooks: the backward goes through
        # them too (+ 0), so that a hook that prepares the head's backward runs before it (ZeRO-3 gathers the
        # partitioned weight there; without it the weight's gradient meets an empty parameter)
        return request.loss + logits.sum()
    return request.loss


def reduce_loss_for_logging(loss: torch.Tensor, sp: Any, grad_scale: float = 1.0) -> float:
    """The single-device loss value from every rank's :func:`hsap_causal_lm_loss` (collective).

    Args:
        loss: this rank's loss (as returned, including ``grad_scale``).
        sp: the SP group; sums over its group and its DP group.
        grad_scale: the scale used in the loss.

    Returns:
        ``sum over ranks(loss) / grad_scale`` as a Python float.
    """
    import torch.distributed as dist

    total = loss.detach().float().clone()
    if getattr(sp, "size", 1) > 1:
        dist.all_reduce(total, group=sp.group)
    if getattr(sp, "dp_size", 1) > 1:
        dist.all_reduce(total, group=sp.dp_group)
    return float(total) / grad_scale
