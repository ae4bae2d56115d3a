"""Worker functions for tests/model/test_vlm.py: tiny vision-language models on packed image / video + text rows,
at one process and under SP, against each document run alone (float64, SDPA attention)."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

import hf_hsap
from hf_hsap.data.packing import best_fit_decreasing
from hf_hsap.examples import tiny_vlm, tiny_vlm_config, vlm_documents
from hf_hsap.multimodal import ROWS_KEY, vision_spec

DTYPE = torch.float64
# (text before, grid (t, h, w) in patches or None, text after): one long document whose image SP must split, a
# text-only one and short ones; grids are ignored by fixed-size-image families.
SHAPES = [(21, (1, 8, 8), 11), (2, (1, 4, 4), 4), (5, None, 7), (1, (1, 2, 4), 2), (3, (1, 4, 2), 6)]
VIDEO_SHAPES = [(9, (2, 8, 8), 13), (2, (1, 4, 4), 4), (4, (2, 2, 4), 3)]
_GROUPS: dict = {}


def get_sp(sp_size: int, ulysses: int | None, family: str | None = None,
           cost: dict | None = None) -> hf_hsap.SPGroup:
    """This process's SP group of that shape (cached per worker process); ``ulysses=None``: the default degree of
    ``family``'s config (the heads of its text config), priced by ``cost`` (CostModel fields; None: the model's)."""
    key = (sp_size, ulysses, family if ulysses is None else None, None if cost is None else tuple(sorted(cost.items())))
    if key not in _GROUPS:
        model_config = tiny_vlm_config(family) if ulysses is None else None
        _GROUPS[key] = hf_hsap.init_sequence_parallel(hf_hsap.HSAPConfig(
            sp_size=sp_size, ulysses_size=ulysses, model_config=model_config,
            cost_model=None if cost is None else hf_hsap.CostModel(**cost)))
    return _GROUPS[key]


def documents(family: str, video: bool = False) -> tuple[torch.nn.Module, list[dict[str, Any]]]:
    """The reference model (SDPA, float64) and the documents."""
    model = tiny_vlm(family, DTYPE, attn="sdpa")
    return model, vlm_documents(model.config, VIDEO_SHAPES if video else SHAPES, video=video, dtype=DTYPE)


def packed_batch(family: str, docs: list[dict[str, Any]], model: torch.nn.Module, pad_to: int = 4) -> dict[str, Any]:
    """All documents in one packed row (rounded up to ``pad_to`` tokens)."""
    total = sum(d["input_ids"].numel() for d in docs)
    return hf_hsap.PackingCollator(total, pad_to_multiple_of=pad_to, vision=vision_spec(model))(docs)


def weights(n: int, vocab: int, real: int) -> torch.Tensor:
    """Fixed ``[n, V]`` weights of ``sum(w * logits)``, zero on the padding after the ``real`` tokens."""
    w = torch.randn(n, vocab, generator=torch.Generator().manual_seed(2), dtype=DTYPE)
    w[real:] = 0
    return w


def documents_alone(family: str, video: bool = False) -> dict[str, Any]:
    """Each document alone through the SDPA model: logits ``[T, V]`` in packed order, loss, gradients of
    ``loss + sum(w * logits)``."""
    model, docs = documents(family, video)
    logits, loss, n_items = alone_backward(model, docs)
    return {"logits": logits, "loss": loss, "n_items": n_items,
            "grads": {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}}


# the document keys with one entry per token (attention_mask: where the forward's multimodal positions need it)
PER_TOKEN = ("input_ids", "mm_token_type_ids", "token_type_ids", "attention_mask", "image_embeds_position_mask",
             "moe_mm_token_type_ids")


def alone_backward(model: torch.nn.Module, docs: list[dict[str, Any]]) -> tuple[torch.Tensor, float, int]:
    """Run each document alone in the collator's row order and backpropagate ``loss + sum(w * logits)``.

    Returns:
        ``(logits [T, V], loss = sum(CE) / N, N)``; the gradients are left in the model.
    """
    total = sum(d["input_ids"].numel() for d in docs)
    order = best_fit_decreasing([d["input_ids"].numel() for d in docs], total)[0]  # the collator's row order
    pieces, ce, n_items = [], 0.0, 0
    for i in order:
        doc = {k: (v.unsqueeze(0) if k in PER_TOKEN else v) for k, v in docs[i].items() if k != "labels"}
        logits = model(**doc, use_cache=False).logits[0]  # [n, V]
        target = docs[i]["labels"][1:]
        ce = ce + F.cross_entropy(logits[:-1], target, ignore_index=-100, reduction="sum")
        n_items += int((target != -100).sum())
        pieces.append(logits)
    logits = torch.cat(pieces)
    loss = ce / n_items
    (loss + (logits * weights(total, logits.shape[-1], total)).sum()).backward()
    return logits.detach(), float(loss.detach()), n_items


def vlm_forward_backward(family: str, sp_size: int, ulysses: int | None = 1, placement: str = "auto",
                         video: bool = False, cost: dict | None = None) -> dict[str, Any]:
    """The packed row through ``shard_batch`` + ``model(**local)`` ("hsap"): local logits with their global
    indices, the loss, the gradients summed over the SP group, how many local items were split, the degree the
    row ran at and the group's degrees (``ulysses=None``: the default of the family's config; ``cost``: see
    :func:`get_sp`)."""
    sp = get_sp(sp_size, ulysses, family, cost) if sp_size > 1 else 1
    ref, docs = documents(family, video)
    model = tiny_vlm(family, DTYPE, attn="hsap")
    check = hf_hsap.prepare_model(model, sp_size=sp_size).check
    batch = packed_batch(family, docs, ref, pad_to=max(sp_size, 1))
    real = sum(d["input_ids"].numel() for d in docs)
    local = hf_hsap.shard_batch(batch, sp, placement=placement)
    plan = local["hsap_plan"]
    idx = plan.local_token_indices(None if sp_size > 1 else 0)
    rows = local[ROWS_KEY]
    out = model(**local)
    # the loss in float64 (Transformers' loss upcasts logits to float32): sum of local CE / global count
    loss = F.cross_entropy(out.logits[0], local["shift_labels"][0], ignore_index=-100, reduction="sum") / \
        local["num_items_in_batch"]
    w = weights(batch["input_ids"].numel(), out.logits.shape[-1], real)[idx]
    (loss + (out.logits[0] * w).sum()).backward()
    grads, loss = {}, loss.detach().clone()
    for name, p in model.named_parameters():
        g = p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
        if sp_size > 1:
            dist.all_reduce(g, group=sp.group)
        grads[name] = g
    if sp_size > 1:
        dist.all_reduce(loss, group=sp.group)
    return {"index": idx, "logits": out.logits.detach()[0], "loss": float(loss), "grads": grads, "real": real,
            "num_items": int(local["num_items_in_batch"]), "layers": check.attention_layers,
            "placement": plan.placement.name, "ulysses": plan.ulysses_size,
            "degrees": sorted(sp.degrees) if sp_size > 1 else [],
            "local_rows": {k: int(v.numel()) for k, v in rows.items() if ":" not in k},
            "received": sum(v.recv_rows for k, v in rows.items() if k.endswith(":exchange")),  # encoded once elsewhere
            "local_items": {k: int(local[key].shape[0]) for k, key in (("image", "image_grid_thw"),
                                                                         ("video", "video_grid_thw"),
                                                                         ("pixel", "pixel_values")) if key in local}}
