"""Worker functions: SP composed with DDP and FSDP2 data parallelism (tests/model/test_dp_composition.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import hf_hsap
from hf_hsap.integrations import (dp_grad_scale, global_num_items, hsap_causal_lm_loss, hsap_model_loss, shard_batch,
                                  shift_labels_global)
from hf_hsap.integrations.sharding import batch_cu_seqlens
from workers.sp_model import DOC_LENS, get_sp, global_batch, make_model

LAYOUTS = [DOC_LENS, [30, 2, 1, 44, 7, 3, 19, 1, 20, 17]]  # one packed row per DP replica (144 tokens each)


def reference_grads(kind: str) -> dict[str, torch.Tensor]:
    """Single process: gradient of (sum of token CE over both rows) / (valid targets of both rows)."""
    model = make_model(kind)
    total, count = 0.0, 0
    for i, lens in enumerate(LAYOUTS):
        batch = global_batch(lens, seed=1 + i)
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        shift = shift_labels_global(batch["labels"], batch_cu_seqlens(batch))  # [T]
        total = total + F.cross_entropy(logits[0], shift, ignore_index=-100, reduction="sum")
        count += int((shift != -100).sum())
    (total / count).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def dp_sp_grads(kind: str, wrapper: str, sp_size: int, levers: bool = False) -> dict[str, torch.Tensor]:
    """World = dp x sp ranks; each DP replica trains on its own row under SP; gradients after the DP
    wrapper's averaging (``ddp`` or ``fsdp2`` over the whole world), gathered to full tensors. ``levers``: every
    memory lever applied before wrapping, the loss through the chunked head (:func:`hsap_model_loss`)."""
    sp = get_sp(sp_size)
    model = make_model(kind)
    if levers:
        hf_hsap.prepare_model(model, sp_size=sp.size, levers=hf_hsap.MemoryLevers(
            loss_tile_tokens=16, gradient_checkpointing=True, tiled_mlp=True, mlp_tile_tokens=8, recompute_norms=True))
    if wrapper == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
        inner = model.module
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        inner = model
    local = shard_batch(global_batch(LAYOUTS[sp.dp_rank], seed=1 + sp.dp_rank), sp)
    n = global_num_items(local["shift_labels"], sp, include_dp=True)
    if levers:
        hsap_model_loss(model, local, n, grad_scale=dp_grad_scale(sp), sp=sp).backward()
    else:
        logits = model(input_ids=local["input_ids"], position_ids=local["position_ids"],
                       hsap_plan=local["hsap_plan"], use_cache=False).logits
        hsap_causal_lm_loss(logits, local["shift_labels"], n, grad_scale=dp_grad_scale(sp)).backward()
    out = {}
    for name, p in inner.named_parameters():
        g = p.grad
        out[name.replace("_fsdp_wrapped_module.", "")] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach()
    return out
