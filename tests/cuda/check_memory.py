"""The memory levers and the memory model on one GPU (run by ``scripts/gpu_check.sh``; skipped without CUDA).

For each configuration: a Llama-shaped model in bf16 on the GPU, one warm training step (forward, backward, AdamW)
with the levers, and ``torch.cuda.max_memory_allocated`` of that step less what was allocated before it, against
:func:`hf_hsap.memory.model.predict_step_memory` (``device="cuda"``) less the weights and optimizer states that
exist before the step. Every lever's loss is first checked against the step without levers. The figures go to
``$OUT/memory.json`` (or /tmp/hsap_gpu).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from hf_hsap.integrations import hsap_model_loss, shard_batch
from hf_hsap import prepare_model
from hf_hsap.memory import MemoryLevers
from hf_hsap.memory.model import predict_step_memory

DEV = torch.device(os.environ.get("HSAP_CHECK_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
pytestmark = pytest.mark.skipif(DEV.type != "cuda", reason="needs CUDA (tests/unit/test_gpu_checks.py runs the logic "
                                                          "on CPU)")

SIZES = dict(model_type="llama", hidden_size=1024, intermediate_size=3584, num_hidden_layers=8,
             num_attention_heads=16, num_key_value_heads=4, head_dim=64, vocab_size=128256,
             tie_word_embeddings=False)
CASES = [  # (name, tokens, levers)
    ("full logits", 8192, dict(chunked_loss=False)),
    ("chunked loss", 32768, dict()),
    ("checkpointing", 65536, dict(gradient_checkpointing=True)),
    ("all levers", 131072, dict(gradient_checkpointing=True, tiled_mlp=True, recompute_norms=True)),
    ("all levers, offloaded", 131072, dict(gradient_checkpointing=True, tiled_mlp=True, recompute_norms=True,
                                           activation_offloading=True)),
    ("all levers, tiled attention", 131072, dict(gradient_checkpointing=True, tiled_mlp=True, recompute_norms=True,
                                                 tiled_attention=True)),
]
TOL = 0.15  # the caching allocator rounds blocks and the flash kernels keep workspaces the CPU model does not see
_RESULTS: list[dict] = []


def _step(name: str, tokens: int, levers: dict, sizes: dict = SIZES) -> tuple[float, int, int]:
    """One warm step's loss, its peak above what was allocated before it (on CPU: the tensor peak), and the resident
    weights + optimizer states."""
    from benchmarks.suites.memory_model import build_model
    from benchmarks.tensor_memory import TensorPeak

    model = build_model(sizes, "bf16").to(DEV)
    lev = MemoryLevers(**levers)
    offload = prepare_model(model, levers=lev).offload
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, sizes["vocab_size"], (1, tokens), generator=g)
    lens = [tokens // 4] * 4  # four documents
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    local = shard_batch({"input_ids": ids.to(DEV), "labels": ids.to(DEV), "position_ids": pos.to(DEV)}, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step() -> float:
        with offload():
            loss = hsap_model_loss(model, local, local["num_items_in_batch"])  # the chunked head's, or the logits'
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    first = step()
    if DEV.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        with TensorPeak() as meter:
            step()
        peak = meter.peak_bytes
    resident = sum(p.numel() * p.element_size() for p in model.parameters())
    resident += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                    if torch.is_tensor(v) and v.dim() > 0)
    del model, opt, local
    if DEV.type == "cuda":
        torch.cuda.empty_cache()
    return first, peak, resident


@pytest.mark.parametrize("name,tokens,levers", CASES, ids=[c[0] for c in CASES])
def test_memory_model_on_the_gpu(name: str, tokens: int, levers: dict) -> None:
    loss, peak, resident = _step(name, tokens, levers)
    pred = predict_step_memory(SIZES, tokens, world=1, sp_size=1, sharding="none", levers=MemoryLevers(**levers),
                               param_dtype="bf16", compute_dtype="bf16", master_weights=False, device="cuda")
    predicted = pred.total - pred.weights - pred.states
    row = {"name": name, "tokens": tokens, "levers": levers, "loss": loss, "measured_mib": peak / 2**20,
           "predicted_mib": predicted / 2**20, "resident_mib": resident / 2**20,
           "error": predicted / peak - 1, "limiting_term": pred.limiting_term()}
    _RESULTS.append(row)
    out = Path(os.environ.get("OUT") or "/tmp/hsap_gpu")
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps(_RESULTS, indent=1))
    print(json.dumps(row))
    assert abs(row["error"]) <= TOL, row


def test_levers_give_the_loss_of_the_plain_step(sizes: dict = SIZES, tokens: int = 4096) -> None:
    """bf16: every lever's first loss equals the plain step's to bf16 rounding."""
    plain = _step("plain", tokens, dict(chunked_loss=False), sizes)[0]
    for levers in (dict(), dict(gradient_checkpointing=True, tiled_mlp=True, recompute_norms=True),
                   dict(gradient_checkpointing=True, tiled_attention=True, attention_tile_tokens=max(64, tokens // 4))):
        assert _step("levers", tokens, levers, sizes)[0] == pytest.approx(plain, rel=2e-2)
