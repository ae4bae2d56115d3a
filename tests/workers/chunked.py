"""Worker functions for tests/model/test_chunked_attention.py: a tiny Llama 4 text model (a chunked-attention layer
of 8 tokens beside a temperature-tuned NoPE layer) under SP, float64."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from hf_hsap.integrations import register, shard_batch
from workers.sp_model import VOCAB, get_sp

CHUNK = 8
LENS = [5, 29, 3, 19]  # two documents over several 8-token chunks; at SP 2 the 29-token one spans both ranks


def packed_row(lens: list[int] = LENS, first: int = 0, seed: int = 4) -> dict[str, torch.Tensor]:
    """One packed row of ``lens``: ``input_ids``, ``position_ids`` (the first document's from ``first``),
    ``labels`` (-100 at document starts)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (1, sum(lens)), generator=g)
    pos = torch.cat([torch.arange(n) + (first if i == 0 else 0) for i, n in enumerate(lens)]).unsqueeze(0)
    labels = ids.clone()
    labels[0, torch.cumsum(torch.tensor([0] + lens[:-1]), 0)] = -100
    return {"input_ids": ids, "position_ids": pos, "labels": labels}


def loss_weights(total: int) -> torch.Tensor:
    """Fixed ``[T, V]`` float64 weights of the test loss term ``sum(w * logits)``."""
    return torch.randn(total, VOCAB, generator=torch.Generator().manual_seed(5), dtype=torch.float64)


def model64(tuned: bool = True) -> torch.nn.Module:
    """A tiny Llama 4 text model in float64 (train mode, the same weights everywhere): a chunked-attention layer of
    :data:`CHUNK` tokens (RoPE) and a full NoPE layer whose attention temperature (``tuned``; ``floor_scale`` 4, not
    8192) grows every 4 positions, so a token's scale from its row index differs from its document position's."""
    from transformers import Llama4TextConfig

    register()
    config = Llama4TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, intermediate_size_mlp=48,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              attention_chunk_size=CHUNK, num_local_experts=1, moe_layers=[], no_rope_layers=[1, 0],
                              floor_scale=4, attn_scale=0.5, attn_temperature_tuning=tuned,
                              max_position_embeddings=256, pad_token_id=0)
    assert config.layer_types == ["chunked_attention", "full_attention"]
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="hsap", dtype=torch.float64).train()


def sp_run(sp_size: int, ulysses: int = 1, placement: str = "auto", first: int = 0) -> dict[str, Any]:
    """The packed row under SP: this rank's logits and their global indices, the loss, every parameter's gradient
    of ``loss + sum(w * logits)`` summed over the group, and the chunked layer's plan (documents, keys received)."""
    sp = get_sp(sp_size, ulysses)
    model = model64(tuned=not first)  # a continued document: Transformers' packed row is the reference (row-index
    batch = packed_row(first=first)  # temperatures there), so without the temperature
    local = shard_batch(batch, sp, placement=placement)
    plan = local["hsap_plan"]
    idx = plan.local_token_indices()
    out = model(**local)
    # the loss in float64 (Transformers' own casts the logits to float32): sum(CE of local tokens) / N
    loss = F.cross_entropy(out.logits[0], local["shift_labels"][0], ignore_index=-100, reduction="sum")
    loss = loss / local["num_items_in_batch"]
    (loss + (out.logits[0] * loss_weights(batch["input_ids"].numel())[idx]).sum()).backward()
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad.detach().clone()
        dist.all_reduce(g, group=sp.group)
        grads[name] = g
    loss = loss.detach().clone()
    dist.all_reduce(loss, group=sp.group)
    from hf_hsap.plan.chunks import chunked_plan

    chunks = chunked_plan(plan, CHUNK, local["hsap_plan_use"].first_positions)
    return {"index": idx, "logits": out.logits.detach()[0], "loss": float(loss), "grads": grads,
            "split": bool((plan.placement.doc == 1).any() and len(set(plan.placement.part[plan.placement.doc == 1]))
                          > 1),
            "docs": plan.layout.n_docs, "chunk_docs": chunks.layout.n_docs,
            "recv": plan.stats().recv_kv_tokens[sp.rank], "chunk_recv": chunks.stats().recv_kv_tokens[sp.rank]}
