"""Worker functions for tests/model/test_memory_levers.py: the memory levers on tiny models under SP."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import hf_hsap
from hf_hsap.integrations import hsap_causal_lm_loss, hsap_model_loss, shard_batch
from hf_hsap.integrations.loss import TARGET_KEYS
from hf_hsap.model_state import ATTENTION_TILES, state_of

from . import sp_model as W



def levered_model(kind: str, levers: dict[str, Any], dtype: torch.dtype, layers: int = 2) -> torch.nn.Module:
    """:func:`sp_model.make_model` in ``dtype`` with :class:`hf_hsap.MemoryLevers` ``levers`` applied."""
    model = W.make_model(kind, layers=layers).to(dtype)
    hf_hsap.prepare_model(model, levers=hf_hsap.MemoryLevers(**levers))
    return model


def levers_forward_backward(kind: str, sp_size: int, levers: dict[str, Any], ulysses: int = 1,
                            dtype: torch.dtype = torch.float32, layers: int = 2) -> dict[str, Any]:
    """The packed row of :mod:`sp_model` under SP with ``levers``: the global loss ``sum(CE) / N`` (the chunked head's
    when ``chunked_loss``, else from the logits), the logits when the head makes them, and every parameter's
    gradient summed over the SP group (a model of ``layers`` decoder layers)."""
    sp = W.get_sp(sp_size, ulysses) if sp_size > 1 else sp_size
    model = levered_model(kind, levers, dtype, layers)
    local = shard_batch(W.global_batch(), sp)
    n = local["num_items_in_batch"]
    idx = local["hsap_plan"].local_token_indices(None if sp_size > 1 else 0)
    logits = None
    if levers.get("chunked_loss", True):
        loss = hsap_model_loss(model, local, n, sp=sp if sp_size > 1 else None)
        with torch.no_grad():  # no request: the same head gives the logits
            logits = model(**{k: v for k, v in local.items() if k not in TARGET_KEYS}).logits[0]
    else:
        out = model(**{k: v for k, v in local.items() if k not in TARGET_KEYS})
        logits = out.logits[0]
        loss = hsap_causal_lm_loss(out.logits, local["shift_labels"], n)
    loss.backward()
    grads = {}
    total = loss.detach().double().clone()
    for name, p in model.named_parameters():
        g = p.grad.detach().double().clone()
        if sp_size > 1:
            dist.all_reduce(g, group=sp.group)
        grads[name] = g
    if sp_size > 1:
        dist.all_reduce(total, group=sp.group)
    return {"index": idx, "logits": logits.detach().double(), "loss": float(total), "grads": grads,
            "num_items": int(n), "chunked": type(model.get_output_embeddings()).__name__,
            "attention_tiles": {state_of(m, ATTENTION_TILES) for m in model.modules()} - {None}}
