"""The sequence-parallel branch of the ``"hsap"`` attention function (an ``hsap_plan`` of SP size > 1).

The batch is one row of this rank's tokens in plan order (built by :func:`~.sharding.shard_batch`). The
branch refuses what the plan cannot express (a model family hf_hsap cannot run under SP), records that the layer
consumed the plan (:mod:`.plan_use`) and runs SAP attention (:func:`hf_hsap.hsap_attn_func`) on the layer's plan
(:func:`~.chunked_attention.layer_plan`: a chunked layer's chunks are its documents) with the layer's sliding window
(the plan's schedule of that mask kind: only the keys the window sees move), soft-capping and sinks.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from ..attention import hsap_attn_func
from ..log import get_logger, log_once
from ..plan.plan import Plan
from .chunked_attention import layer_plan
from .model_check import check_config, check_mixers_prepared
from .plan_use import PlanUse, plan_use_of

__all__ = ["enter_plan", "sp_attention", "sp_forward"]

logger = get_logger(__name__)


def sp_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: Plan, scaling: float | None, *,
    window: int | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
    blocks: Any = None,
) -> torch.Tensor:
    """Sequence-parallel attention over this rank's tokens (``B == 1``, tokens in plan order).

    Args:
        query, key, value: this rank's heads (see Shapes).
        plan: the :class:`~hf_hsap.Plan` of the global batch.
        scaling: softmax scale, default ``D ** -0.5``.
        window, softcap, sinks: the layer's sliding window, soft-capping and ``[Hq]`` sink logits (or ``None``).
        blocks: the batch's bidirectional image blocks (:class:`~hf_hsap.plan.blocks.Blocks`), or ``None``.

    Returns:
        The attention output of this rank's queries.

    Shapes:
        query ``[1, Hq, T, D]``, key/value ``[1, Hkv, T, D]`` -> ``[1, T, Hq, D]``.

    Raises:
        ValueError: more than one row, or queries and keys of different lengths (a KV cache).
    """
    if query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        raise ValueError(
            "hsap_plan needs one row of local tokens and no KV cache (got query "
            f"{tuple(query.shape)}, key {tuple(key.shape)}); build the batch with hf_hsap's shard_batch"
        )
    q = query[0].transpose(0, 1)  # [1, Hq, T, D] -> [T, Hq, D]
    k = key[0].transpose(0, 1)  # [1, Hkv, T, D] -> [T, Hkv, D]
    v = value[0].transpose(0, 1)  # [1, Hkv, T, D] -> [T, Hkv, D]
    out = hsap_attn_func(q, k, v, plan, softmax_scale=scaling, window=window, softcap=softcap, sinks=sinks,
                         blocks=blocks)
    return out.unsqueeze(0)  # [T, Hq, D] -> [1, T, Hq, D]


def enter_plan(module: torch.nn.Module, plan: Plan, plan_use: PlanUse | None) -> PlanUse | None:
    """A layer takes the batch's plan: refuse what the plan cannot express, record that the layer consumed it.

    Args:
        module: the calling attention layer.
        plan: the batch's :class:`~hf_hsap.Plan`.
        plan_use: the call's ``hsap_plan_use`` record, or ``None`` (see :func:`~.plan_use.plan_use_of`).

    Returns:
        The plan-use record (``None`` at SP size 1 or for a plan made by hand).
    """
    config = getattr(module, "config", None)
    if config is not None:
        check_config(config, packed=True, sp_size=plan.size)
        check_mixers_prepared(module, config, plan.size)
    use = plan_use_of(plan, plan_use) if plan.size > 1 else None
    if use is not None:
        use.record(module)
    elif plan.size > 1:  # a plan made by hand (not by shard_batch): nothing proves that every layer consumed it
        log_once(logger, logging.WARNING, "no plan use",
                 "hsap attention: an hsap_plan without its hsap_plan_use record (a plan not made by shard_batch, "
                 "or not its latest); whether every attention layer consumed the plan is not checked")
    return use


def sp_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: Plan, *,
               scaling: float | None, window: int | None, plan_use: PlanUse | None = None,
               softcap: float | None = None, sinks: torch.Tensor | None = None, blocks: Any = None) -> torch.Tensor:
    """The SP branch of :func:`~.transformers.hsap_attention_forward` (also taken at SP size 1 by a batch with
    bidirectional image blocks, which the plan's schedule runs).

    Refuses what the plan cannot express, records that this layer consumed the plan (``plan``, the batch's), runs
    SAP on the layer's plan (:func:`~.chunked_attention.layer_plan`).

    Args:
        module: the calling attention layer.
        query, key, value: this rank's heads (see Shapes).
        plan: the :class:`~hf_hsap.Plan` (SP size > 1).
        scaling: softmax scale, default ``D ** -0.5``.
        window: the layer's sliding window (from :func:`~.attention_checks.attention_variant`), or ``None``.
        plan_use: the call's ``hsap_plan_use`` record, or ``None`` (then the SP group's pending record of the
            same plan, see :func:`~.plan_use.plan_use_of`).
        softcap: the layer's logit soft-capping, or ``None``. sinks: its ``[Hq]`` sink logits, or ``None``.
        blocks: the batch's bidirectional image blocks (``hsap_blocks`` from :func:`~.sharding.shard_batch`), or
            ``None``.

    Returns:
        The attention output of this rank's queries.

    Shapes:
        query ``[1, Hq, T, D]``, key/value ``[1, Hkv, T, D]`` -> ``[1, T, Hq, D]``.
    """
    use = enter_plan(module, plan, plan_use)
    if logger.isEnabledFor(logging.DEBUG):  # once per case, not per layer
        log_once(logger, logging.DEBUG, ("sp", plan.size),
                 "hsap attention: sequence-parallel branch, SAP over sp_size=%d (%s)", plan.size,
                 type(module).__name__)
    plan = layer_plan(module, plan, first_positions=use.first_positions if use is not None else None, blocks=blocks)
    return sp_attention(query, key, value, plan, scaling, window=window, softcap=softcap, sinks=sinks, blocks=blocks)
