"""CUDA checks of hybrid models (linear attention, Mamba, short convolutions) on packed rows for a lent GPU
(``bash scripts/gpu_check.sh`` runs this file; CI never collects it). ``HSAP_CHECK_DEVICE=cpu`` runs the same logic
on CPU.

Tiny Qwen3.5 (gated delta rule), Kimi-Linear (KDA), Bamba (Mamba2), Jamba (Mamba) and LFM2 (short convolution) under
bf16 autocast with ``attn_implementation="hsap"``: one packed row through ``shard_batch(batch, 1)`` +
``model(**local)`` against the same model on each document alone, logits within bf16 rounding and the loss's
gradient reaching every recurrent layer. On CUDA the recurrent kernels are fla / mamba-ssm / causal-conv1d where
installed (each segment one call), else Transformers' torch path; which ones ran is printed.
"""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

import hf_hsap
from hf_hsap.model_state import MIXERS, state_of
from helpers import rel_err
from workers import zoo_configs as ZC

DEV = torch.device(os.environ.get("HSAP_CHECK_DEVICE", "cuda"))
if DEV.type == "cuda" and not torch.cuda.is_available():
    raise SystemExit("tests/cuda/check_hybrid.py needs a CUDA device (run scripts/gpu_check.sh on a GPU machine)")
DOC_LENS = [7, 30, 1, 19, 15]
BF16_TOL = 3e-2  # relative error of bf16 activations against float32 over a few layers
FAMILIES = ["qwen3_5_text", "kimi_linear", "bamba", "jamba", "lfm2"]


def test_kernels_installed() -> None:
    """Which packages the kernel hooks dispatch to on this device (printed; none is required)."""
    found = {p: importlib.util.find_spec(p) is not None for p in ("fla", "mamba_ssm", "causal_conv1d")}
    print("recurrent kernels installed:", found, "device:", DEV)
    assert set(found) == {"fla", "mamba_ssm", "causal_conv1d"}


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_hybrid_bf16_matches_documents_alone(family: str) -> None:
    config = ZC.tiny_config(family)
    model = ZC.build_model(config, "hsap", torch.float32).to(DEV)
    assert hf_hsap.prepare_model(model).check.mixer_layers > 0
    vocab = config.get_text_config().vocab_size
    ids = torch.randint(3, vocab, (1, sum(DOC_LENS)), generator=torch.Generator().manual_seed(0))
    pos = torch.cat([torch.arange(n) for n in DOC_LENS]).unsqueeze(0)
    batch = {"input_ids": ids, "position_ids": pos, "labels": ids.clone()}
    local = {k: (v.to(DEV) if torch.is_tensor(v) else v) for k, v in hf_hsap.shard_batch(batch, 1).items()}
    with torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=DEV.type == "cuda"):
        out = model(**local)
    out.loss.backward()
    ctx = state_of(model, MIXERS)
    assert all(any(p.grad is not None and float(p.grad.abs().max()) > 0 for p in layer.parameters())
               for layer in ctx.layers)  # the loss reaches every recurrent layer
    with torch.no_grad(), torch.autocast(DEV.type, dtype=torch.bfloat16, enabled=DEV.type == "cuda"):
        alone, start = [], 0
        for n in DOC_LENS:
            doc = ids[:, start:start + n].to(DEV)
            alone.append(model(input_ids=doc, position_ids=torch.arange(n, device=DEV)[None], use_cache=False).logits[0])
            start += n
    ref = torch.cat(alone).float()
    assert rel_err(out.logits[0].float().detach(), ref) < BF16_TOL
