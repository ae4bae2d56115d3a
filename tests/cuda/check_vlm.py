"""CUDA checks of vision-language models on packed rows for a lent GPU (``bash scripts/gpu_check.sh`` runs this
file; CI never collects it). ``HSAP_CHECK_DEVICE=cpu`` runs the same logic on CPU.

1. Tiny Qwen2.5-VL, LLaVA and Gemma 3 under bf16 autocast with ``attn_implementation="hsap"``, one packed image +
   text row through ``shard_batch(batch, 1)`` + ``model(**local)``, against the same float32 model on each document
   alone (SDPA): logits within bf16 rounding, the loss's gradient reaching the vision tower.
2. The bidirectional image-block work item (Gemma 3) on the CUDA kernel in bf16 against the float64 dense mask.
"""
from __future__ import annotations

import os

import pytest
import torch

import hf_hsap
from hf_hsap.data.packing import best_fit_decreasing
from hf_hsap.examples import tiny_vlm, vlm_documents
from hf_hsap.plan.blocks import Blocks
from helpers import rel_err

DEV = torch.device(os.environ.get("HSAP_CHECK_DEVICE", "cuda"))
if DEV.type == "cuda" and not torch.cuda.is_available():
    raise SystemExit("tests/cuda/check_vlm.py needs a CUDA device (run scripts/gpu_check.sh on a GPU machine)")
SHAPES = [(21, (1, 8, 8), 11), (2, (1, 4, 4), 4), (5, None, 7), (3, (1, 4, 2), 6)]
BF16_TOL = 3e-2  # relative error of bf16 activations against float32 over a 2-layer model


def _to(doc: dict, device: torch.device) -> dict:
    return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in doc.items()}


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava", "gemma3"])
def test_packed_vlm_bf16_matches_documents_alone(family: str) -> None:
    ref = tiny_vlm(family, torch.float32, attn="sdpa").to(DEV)
    model = tiny_vlm(family, torch.float32, attn="hsap").to(DEV)
    hf_hsap.prepare_model(model)
    docs = vlm_documents(model.config, SHAPES)
    total = sum(d["input_ids"].numel() for d in docs)
    batch = hf_hsap.PackingCollator(total, vision=hf_hsap.vision_spec(model))(docs)
    local = _to(hf_hsap.shard_batch(_to(batch, DEV), 1), DEV)
    with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=DEV.type == "cuda"):
        out = model(**local)
    out.loss.backward()
    tower = [p.grad for n, p in model.named_parameters() if "vision" in n or "visual" in n]
    assert any(g is not None and float(g.abs().max()) > 0 for g in tower)  # the loss reaches the vision tower
    pieces = []
    for i in best_fit_decreasing([d["input_ids"].numel() for d in docs], total)[0]:
        doc = {k: (v.unsqueeze(0) if k in ("input_ids", "mm_token_type_ids", "token_type_ids") else v)
               for k, v in docs[i].items() if k != "labels"}
        with torch.no_grad():
            pieces.append(ref(**_to(doc, DEV), use_cache=False).logits[0].float())
    expected = torch.cat(pieces)
    assert rel_err(out.logits[0, :total].float(), expected) <= BF16_TOL


def test_image_block_item_on_the_device_kernel() -> None:
    cu = [0, 300, 520]
    blocks = Blocks((20, 310), (276, 374))  # a 256-token image, a 64-token one
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(520, h, 64, generator=g, dtype=torch.float64) for h in (8, 2, 2))
    plan = hf_hsap.plan_sequence(torch.tensor(cu), 1)
    dtype = torch.bfloat16 if DEV.type == "cuda" else torch.float32
    args = [x.to(DEV, dtype).requires_grad_() for x in (q, k, v)]
    out = hf_hsap.hsap_attn_func(*args, plan, blocks=blocks)
    doc = torch.bucketize(torch.arange(520), torch.tensor(cu[1:]), right=True)
    blk = torch.full((520,), -1)
    for b, (s, e) in enumerate(zip(blocks.starts, blocks.ends)):
        blk[s:e] = b
    i, j = torch.arange(520)[:, None], torch.arange(520)[None, :]
    mask = (doc[:, None] == doc[None, :]) & ((j <= i) | ((blk[:, None] == blk[None, :]) & (blk[:, None] >= 0)))
    kk, vv = k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
    p = (torch.einsum("qhd,khd->hqk", q, kk) / 8).masked_fill(~mask, float("-inf")).softmax(-1)
    ref = torch.einsum("hqk,khd->qhd", p, vv)
    assert rel_err(out.double().cpu(), ref) <= (2e-2 if dtype == torch.bfloat16 else 1e-5)
    out.float().sum().backward()
    assert all(torch.isfinite(a.grad).all() for a in args)
