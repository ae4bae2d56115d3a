"""CUDA checks of hybrid models (linear attention, Mamba, short convolutions) on packed rows for a lent GPU
(``bash scripts/gpu_check.sh`` runs this file; CI never collects it). ``HSAP_CHECK_DEVICE=cpu`` runs the same logic
on CPU.

Tiny Qwen3.5 (gated delta rule), Kimi-Linear (KDA), Bamba (Mamba2), Jamba (Mamba) and LFM2 (short convolution) under
bf16 autocast with ``attn_implementation="hsap"``: one packed row through ``shard_batch(batch, 1)`` +
``model(**local)`` against the same model on each document alone, logits within bf16 rounding and the loss's
gradient reaching every recurrent layer. On CUDA the recurrent kernels are fla / mamba-ssm / causal-conv1d where
installed (a rank's runs in padded calls), else Transformers' torch path; which ones ran is printed. Then one
document split over 2 and 4 parts (threads of this process exchanging summaries through the loopback transport) for
the gated delta rule (fla's widened-value call), Mamba2's SSD (mamba-ssm) and the short convolution (causal-conv1d):
output and every input gradient against the document run whole, float32.
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


# One document split over P parts (contiguous slices), each part a thread of this process on one device
# (hf_hsap.comm.loopback: the summary exchange through queues, NCCL needs a GPU per rank): the parallel hand-off on
# the kernels this device dispatches to (fla's gated delta rule, mamba-ssm's SSD, causal-conv1d on CUDA).
SPLIT_T = 1024


def _kernel_call(kernel: str) -> tuple:
    """``(orig, tensors {name: (tensor, token dim)}, positional names, options, out dim)`` of one kernel call over
    :data:`SPLIT_T` tokens in float32 on :data:`DEV`, with Transformers' hook function (its own dispatch)."""
    from transformers.models.mamba2 import modeling_mamba2
    from transformers.models.qwen3_5 import modeling_qwen3_5

    gen = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(DEV)

    T = SPLIT_T
    if kernel == "chunk_gated_delta_rule":
        h, d = 4, 64
        tensors = {"query": (rnd(1, T, h, d), 1), "key": (rnd(1, T, h, d), 1), "value": (rnd(1, T, h, d), 1),
                   "g": (-torch.nn.functional.softplus(rnd(1, T, h)), 1), "beta": (torch.sigmoid(rnd(1, T, h)), 1)}
        return (modeling_qwen3_5.torch_chunk_gated_delta_rule, tensors, ("query", "key", "value"),
                {"use_qk_l2norm_in_kernel": True}, 1)
    if kernel == "mamba_chunk_scan_combined":
        h, p, g, n = 8, 32, 1, 64
        tensors = {"hidden_states": (rnd(1, T, h, p), 1), "dt": (rnd(1, T, h), 1), "A": (-torch.exp(rnd(h)), None),
                   "B": (rnd(1, T, g, n), 1), "C": (rnd(1, T, g, n), 1), "D": (rnd(h), None),
                   "dt_bias": (rnd(h), None)}
        return (modeling_mamba2.mamba2_chunk_scan, tensors, ("hidden_states", "dt", "A", "B", "C"),
                {"chunk_size": 256, "dt_softplus": True}, 1)
    c, k = 256, 4
    tensors = {"hidden_states": (rnd(1, c, T), 2), "weight": (rnd(c, k), None), "bias": (rnd(c), None)}
    return modeling_mamba2.causal_conv1d_fn, tensors, ("hidden_states", "weight", "bias"), {"activation": "silu"}, 2


def _call(kernel: str, orig, values: dict, positional: tuple, options: dict, chain, exchange) -> torch.Tensor:
    from hf_hsap.mixers.ops import OPS

    out = OPS[kernel](orig, tuple(values[n] for n in positional),
                      {**{n: v for n, v in values.items() if n not in positional}, **options}, chain, exchange)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("kernel", ["chunk_gated_delta_rule", "mamba_chunk_scan_combined", "causal_conv1d_fn"])
@pytest.mark.parametrize("parts", [2, 4])
def test_split_document_matches_it_whole(kernel: str, parts: int) -> None:
    import numpy as np

    from hf_hsap.comm.loopback import LoopbackHub
    from hf_hsap.mixers import StateExchange
    from hf_hsap.plan.chain import document_chain, state_chain

    orig, tensors, positional, options, out_dim = _kernel_call(kernel)
    cu = np.array([0, SPLIT_T])
    leaves = {n: t.clone().requires_grad_() for n, (t, _) in tensors.items()}
    whole = _call(kernel, orig, leaves, positional, options, document_chain(cu), None)
    w = torch.randn(whole.shape, generator=torch.Generator().manual_seed(1)).to(DEV)
    ref_grads = torch.autograd.grad((whole * w).sum(), list(leaves.values()))
    bounds = np.linspace(0, SPLIT_T, parts + 1).astype(int)
    tokens = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    hub = LoopbackHub(parts)

    def part(p: int) -> tuple:
        a, b = int(bounds[p]), int(bounds[p + 1])
        mine = {n: (t.detach() if d is None else t.detach().narrow(d, a, b - a)).clone().requires_grad_()
                for n, (t, d) in tensors.items()}
        exchange = StateExchange(None, list(range(parts)))
        exchange.executor = hub.executor(p)
        out = _call(kernel, orig, mine, positional, options, state_chain(cu, tokens, p), exchange)
        grads = torch.autograd.grad((out * w.narrow(out_dim, a, b - a)).sum(), list(mine.values()))
        return out.detach(), grads

    res = hub.run(part)
    out = torch.cat([r[0] for r in res], dim=out_dim)
    err = rel_err(out, whole.detach())
    print(f"{kernel} split over {parts}: output rel err {err:.1e} ({DEV})")
    assert err < 1e-3
    for j, (name, (t, d)) in enumerate(tensors.items()):
        got = torch.cat([r[1][j] for r in res], dim=d) if d is not None else sum(r[1][j] for r in res)
        assert rel_err(got, ref_grads[j]) < 1e-3, name
