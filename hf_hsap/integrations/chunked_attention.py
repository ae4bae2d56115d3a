"""The plan a ``"hsap"`` attention layer runs: the batch's plan, or for a chunked-attention layer (Llama 4's
``chunked_attention`` entries of ``config.layer_types``) the plan whose documents are the chunks
(:func:`hf_hsap.plan.chunks.chunked_plan`: chunk bounds at document-relative multiples of
``attention_chunk_size``, as for each document run alone and as ``masking_utils`` cuts a packed row). Same tokens
on every rank, fewer keys moved; built once per batch plan and chunk size and cached on the plan.

What stays refused is where chunks are not documents: generation with a KV cache past a chunk (:mod:`.mask`), and
bidirectional image blocks (Gemma 3's) in a model with chunked layers whose documents cross a chunk bound.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..plan.chunks import chunked_plan
from ..plan.plan import Plan
from ..sp_plan import SPPlan
from .model_check import UnsupportedModelError, chunked_attention_size, layer_type

__all__ = ["layer_chunk_size", "layer_plan"]


def layer_chunk_size(module: torch.nn.Module) -> int | None:
    """``attention_chunk_size`` when ``module`` is a chunked-attention layer (its config's ``layer_types`` entry at
    its ``layer_idx``), else ``None``."""
    config = getattr(module, "config", None)
    if config is None or layer_type(config, getattr(module, "layer_idx", None)) != "chunked_attention":
        return None
    return chunked_attention_size(config)


def layer_plan(module: torch.nn.Module, plan: Plan, *, first_positions: np.ndarray | None = None,
               blocks: Any = None) -> Plan:
    """The plan ``module`` attends with: ``plan``, or its chunk plan for a chunked-attention layer, bound to
    ``plan``'s process group.

    Args:
        module: the calling attention layer (read: ``config``, ``layer_idx``).
        plan: the batch's plan (``hsap_plan``).
        first_positions: ``[n_docs]`` first position of each document (``None``: 0 for all; ``shard_batch``
            records others on the batch's ``hsap_plan_use``).
        blocks: the batch's bidirectional image blocks, or ``None``.

    Returns:
        The plan to run.

    Raises:
        UnsupportedModelError: image blocks in a chunked layer whose documents cross a chunk bound.
    """
    chunk = layer_chunk_size(module)
    if chunk is None:
        return plan
    chunks = chunked_plan(plan, chunk, first_positions)
    if chunks is plan:
        return plan
    if blocks is not None and len(blocks):
        raise UnsupportedModelError(
            f"{type(module).__name__} (layer {module.layer_idx}) is a chunked-attention layer of {chunk} tokens in a "
            "batch with bidirectional image blocks and a document longer than a chunk; hf_hsap has no image blocks "
            "across chunks: keep documents at most attention_chunk_size tokens long, or use attn_implementation='sdpa'"
        )
    sp = plan.sp
    return SPPlan.bind(chunks, sp) if sp is not None else chunks
