"""The memory model (:mod:`hf_hsap.memory.model`) against the exact tensor peak of CPU steps, and the longest rows
it predicts on H100-80GB clusters.

Validation: tiny random Transformers models (Llama with GQA or MHA, Qwen3-MoE), one packed row of one document, the
attention ``"hsap"``, one process (SP 1) and spawned gloo ranks (SP 2 and 4, :class:`hf_hsap.testing.DistPool`),
float32 or bf16 weights (``dtype=torch.bfloat16``, no autocast: 16-bit activations with the norms' float32 copies,
as on the GPU), with and without a receive budget, with and without the tiled attention at SP 1. Each configuration
runs one warm-up step (forward, backward, AdamW step: the optimizer's states exist from then on), then one measured
step inside
:class:`~benchmarks.tensor_memory.TensorPeak`: the exact peak of the storages the step allocates (what
``torch.cuda.max_memory_allocated`` minus the resident weights and states reports). The prediction compared with it
is :func:`~hf_hsap.memory.predict_step_memory` with ``device="cpu"``, ``sharding="none"`` (no DP wrapper), the same
dtypes, AdamW without master weights, less the resident terms (weights and optimizer states, which existed before the
block); the largest rank's figure under SP.

Longest rows: :mod:`benchmarks.suites.longest_rows` (Llama-3-8B, Qwen3-8B, Llama-3-70B on 1, 8 and 32 H100-80GB,
the device's limit and a DGX-H100 node's host limit side by side, the best of the lever settings, offloads and SAP
set-ups it searches), beside ALST's published figures.

Usage: ``python -m benchmarks memory_model [--out benchmarks/results/memory_model.json] [--quick] [--no-measure]
[--no-write-md]`` (``python -m benchmarks memory`` runs it after :mod:`benchmarks.suites.memory_levers`). Writes the
results JSON; the entry point then (unless ``--quick`` or ``--no-write-md``) renders it
(:func:`benchmarks.report.memory.memory_model_section`) into the detail file ``benchmarks/results/memory.md`` and
``BENCHMARKS.md``'s headline.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

from hf_hsap.memory.host import DEFAULT_HOST_MEMORY_GIB, DEFAULT_PROCESS_FOOTPRINT_GIB, HOST_RESERVE_FRACTION
from hf_hsap.memory.levers import MemoryLevers
from hf_hsap.memory.model import predict_step_memory

from .longest_rows import (ALST_PUBLISHED, GPU_MEMORY_GIB, GPUS_PER_NODE, RESERVE_GIB, best_rows, longest_rows,
                           settings_here)
from .output import RESULTS, Outcome, command_line, renders_pages, stamp

DEFAULT_OUT = RESULTS / "memory_model.json"

# tiny models: small hidden sizes, large vocabularies, activations dominate the weights
DENSE = dict(model_type="llama", hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, vocab_size=32000, tie_word_embeddings=False)
MOE = dict(model_type="qwen3_moe", hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
           num_experts=8, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           head_dim=32, vocab_size=32000, tie_word_embeddings=False)


def _cfg(base: dict, **over: Any) -> dict:
    return {**base, **over}


# (name, model sizes, row tokens, levers, sp[, options: dtype "bf16" / recv_budget_tokens])
BF16 = _cfg(DENSE, hidden_size=256, head_dim=64, intermediate_size=640, vocab_size=6144)
BF16_ALL = dict(loss_tile_tokens=128, gradient_checkpointing=True, tiled_mlp=True, mlp_tile_tokens=512)
CONFIGS: list[tuple] = [
    ("dense full-logits", DENSE, 2048, dict(chunked_loss=False), 1),
    ("dense chunked", DENSE, 4096, dict(), 1),
    ("dense chunked V=128K", _cfg(DENSE, vocab_size=131072), 4096, dict(), 1),
    ("dense chunked tile 512, wide MLP", _cfg(DENSE, intermediate_size=2048, vocab_size=8192), 4096,
     dict(loss_tile_tokens=256), 1),
    ("dense checkpointed", _cfg(DENSE, num_hidden_layers=4, intermediate_size=2048), 8192,
     dict(loss_tile_tokens=256, gradient_checkpointing=True), 1),
    ("dense tiled MLP", _cfg(DENSE, intermediate_size=2048, vocab_size=8192), 8192,
     dict(loss_tile_tokens=256, tiled_mlp=True, mlp_tile_tokens=1024), 1),
    ("dense all levers", _cfg(DENSE, num_hidden_layers=4, intermediate_size=2048), 8192,
     dict(loss_tile_tokens=256, gradient_checkpointing=True, tiled_mlp=True, mlp_tile_tokens=1024), 1),
    ("dense MHA 8 layers", _cfg(DENSE, num_hidden_layers=8, num_key_value_heads=4), 4096,
     dict(loss_tile_tokens=256), 1),
    ("MoE chunked", MOE, 4096, dict(loss_tile_tokens=256), 1),
    ("MoE full-logits", MOE, 2048, dict(chunked_loss=False), 1),
    ("MoE checkpointed", _cfg(MOE, num_hidden_layers=4), 4096,
     dict(loss_tile_tokens=256, gradient_checkpointing=True), 1),
    ("MoE wide experts", _cfg(MOE, moe_intermediate_size=512, num_experts_per_tok=4, vocab_size=8192), 4096,
     dict(loss_tile_tokens=128), 1),
    ("dense SP 2", DENSE, 4096, dict(loss_tile_tokens=256), 2),
    ("dense SP 4", DENSE, 8192, dict(loss_tile_tokens=256), 4),
    ("dense SP 4 checkpointed", _cfg(DENSE, intermediate_size=2048), 8192,
     dict(loss_tile_tokens=256, gradient_checkpointing=True), 4),
    # bf16 weights and activations (no autocast): what the GPU rows assume, the norms' float32 copies included
    ("bf16 dense chunked", BF16, 4096, dict(loss_tile_tokens=128), 1, dict(dtype="bf16")),
    ("bf16 dense chunked, norms recomputed", BF16, 4096, dict(loss_tile_tokens=128, recompute_norms=True), 1,
     dict(dtype="bf16")),
    ("bf16 dense full-logits", BF16, 2048, dict(chunked_loss=False), 1, dict(dtype="bf16")),
    ("bf16 dense checkpointed", BF16, 4096, dict(loss_tile_tokens=128, gradient_checkpointing=True), 1,
     dict(dtype="bf16")),
    ("bf16 dense all levers", _cfg(BF16, num_hidden_layers=4), 4096, BF16_ALL, 1, dict(dtype="bf16")),
    ("bf16 dense all levers, norms recomputed", _cfg(BF16, num_hidden_layers=4), 4096,
     dict(BF16_ALL, recompute_norms=True), 1, dict(dtype="bf16")),
    # two layers: the last layer's attention backward sets the peak at 8K, its tiled MLP's at 2K
    ("bf16 dense 2 layers all levers, norms recomputed, 2K", BF16, 2048, dict(BF16_ALL, recompute_norms=True), 1,
     dict(dtype="bf16")),
    ("bf16 dense 2 layers all levers, norms recomputed, 8K", BF16, 8192, dict(BF16_ALL, recompute_norms=True), 1,
     dict(dtype="bf16")),
    ("bf16 Qwen3-MoE all levers, norms recomputed", _cfg(MOE, num_hidden_layers=4), 4096,
     dict(BF16_ALL, recompute_norms=True), 1, dict(dtype="bf16")),
    ("bf16 SP 4 all levers, norms recomputed", BF16, 8192, dict(BF16_ALL, recompute_norms=True), 4,
     dict(dtype="bf16")),
    ("bf16 SP 4 all levers, norms recomputed, budget 1K", BF16, 8192, dict(BF16_ALL, recompute_norms=True), 4,
     dict(dtype="bf16", recv_budget_tokens=1024)),
    # MHA: SAP's buffers set the peak (the attention's backward), with and without a receive budget
    ("bf16 SP 4 MHA all levers, norms recomputed", _cfg(BF16, num_key_value_heads=4), 8192,
     dict(BF16_ALL, recompute_norms=True), 4, dict(dtype="bf16")),
    ("bf16 SP 4 MHA all levers, norms recomputed, budget 2K", _cfg(BF16, num_key_value_heads=4), 8192,
     dict(BF16_ALL, recompute_norms=True), 4, dict(dtype="bf16", recv_budget_tokens=2048)),
    # checkpoint_layers: a block's input kept, its layers recomputed together (one short block of 1 in 3 layers)
    ("dense checkpointed, blocks of 2", _cfg(DENSE, num_hidden_layers=4, intermediate_size=2048), 8192,
     dict(loss_tile_tokens=256, gradient_checkpointing=True, checkpoint_layers=2), 1),
    ("dense checkpointed, 3 layers in blocks of 2", _cfg(DENSE, num_hidden_layers=3, intermediate_size=2048), 8192,
     dict(loss_tile_tokens=256, gradient_checkpointing=True, checkpoint_layers=2), 1),
    ("bf16 dense all levers, norms recomputed, blocks of 2", _cfg(BF16, num_hidden_layers=4), 4096,
     dict(BF16_ALL, recompute_norms=True, checkpoint_layers=2), 1, dict(dtype="bf16")),
    ("bf16 dense 8 layers all levers, norms recomputed, blocks of 4", _cfg(BF16, num_hidden_layers=8), 4096,
     dict(BF16_ALL, recompute_norms=True, checkpoint_layers=4), 1, dict(dtype="bf16")),
    ("bf16 Qwen3-MoE all levers, norms recomputed, blocks of 2", _cfg(MOE, num_hidden_layers=4), 4096,
     dict(BF16_ALL, recompute_norms=True, checkpoint_layers=2), 1, dict(dtype="bf16")),
    ("bf16 SP 4 MHA all levers, norms recomputed, blocks of 2", _cfg(BF16, num_key_value_heads=4,
                                                                    num_hidden_layers=4), 8192,
     dict(BF16_ALL, recompute_norms=True, checkpoint_layers=2), 4, dict(dtype="bf16")),
]
# tiled attention (SP 1): the attention's backward sets the peak; more query heads than the hidden size (WIDE) makes it
# the largest term; tiles smaller than the row, and one tile larger than it
WIDE = _cfg(BF16, num_attention_heads=8)
BF16_TILED = dict(BF16_ALL, recompute_norms=True, tiled_attention=True)
CONFIGS += [
    ("bf16 dense 2 layers all levers, tiled attention 1K, 8K", BF16, 8192, dict(BF16_TILED, attention_tile_tokens=1024),
     1, dict(dtype="bf16")),
    ("bf16 wide attention all levers, 8K", WIDE, 8192, dict(BF16_ALL, recompute_norms=True), 1, dict(dtype="bf16")),
    ("bf16 wide attention all levers, tiled attention 1K, 8K", WIDE, 8192,
     dict(BF16_TILED, attention_tile_tokens=1024), 1, dict(dtype="bf16")),
    ("bf16 wide attention all levers, tiled attention 4K, 8K", WIDE, 8192,
     dict(BF16_TILED, attention_tile_tokens=4096), 1, dict(dtype="bf16")),
    ("bf16 MHA all levers, tiled attention (one tile), 4K", _cfg(WIDE, num_key_value_heads=8), 4096, BF16_TILED, 1,
     dict(dtype="bf16")),
    ("bf16 wide attention chunked, tiled attention 512", WIDE, 4096,
     dict(loss_tile_tokens=128, tiled_attention=True, attention_tile_tokens=512), 1, dict(dtype="bf16")),
    ("dense all levers, tiled attention 2K", _cfg(DENSE, num_hidden_layers=4, intermediate_size=2048), 8192,
     dict(loss_tile_tokens=256, gradient_checkpointing=True, tiled_mlp=True, mlp_tile_tokens=1024,
          tiled_attention=True, attention_tile_tokens=2048), 1),
]
TILED_ATTENTION = [c for c in CONFIGS if "tiled attention" in c[0] or "wide attention" in c[0]]
BLOCK_CONFIGS = [c for c in CONFIGS if c[3].get("checkpoint_layers", 1) > 1]
QUICK = CONFIGS[:2]


def build_model(sizes: dict, dtype: str = "fp32") -> Any:
    """The tiny random model of ``sizes`` (weights in ``dtype``: ``"fp32"`` or ``"bf16"``, attention ``"hsap"``,
    training mode)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3MoeConfig

    from hf_hsap.integrations import register

    register()
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    kw = {k: v for k, v in sizes.items() if k != "model_type"}
    config = (Qwen3MoeConfig if sizes["model_type"] == "qwen3_moe" else LlamaConfig)(
        max_position_embeddings=65536, **kw)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="hsap", dtype=dtypes[dtype]).train()


_SP: dict = {}


def measure_step(sizes: dict, tokens: int, levers: dict, sp_size: int = 1, dtype: str = "fp32",
                 recv_budget_tokens: int | None = None) -> dict:
    """The exact tensor peak of one warm training step on this process (a rank of ``sp_size`` under SP).

    Args:
        sizes: the model's config sizes; tokens: the row; levers: :class:`MemoryLevers` fields; sp_size: ranks;
            dtype: the weights' (and so the activations') dtype, ``"fp32"`` or ``"bf16"`` (no autocast);
            recv_budget_tokens: SAP's receive budget (SP only).

    Returns:
        ``{"peak": bytes, "resident": bytes of weights and AdamW states, "at_peak": the 12 largest (MiB, op)}``.
    """
    import torch

    from hf_hsap.integrations import hsap_model_loss, shard_batch
    from hf_hsap import prepare_model

    from ..tensor_memory import TensorPeak

    torch.set_num_threads(1)
    lev = MemoryLevers(**levers)
    sp: Any = 1
    if sp_size > 1:
        import hf_hsap

        key = (sp_size, recv_budget_tokens)
        if key not in _SP:
            _SP[key] = hf_hsap.init_sequence_parallel(hf_hsap.HSAPConfig(
                sp_size=sp_size, ulysses_size=1, recv_budget_tokens=recv_budget_tokens))
        sp = _SP[key]
    model = build_model(sizes, dtype)
    prepare_model(model, sp_size=sp_size, levers=lev)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, sizes["vocab_size"], (1, tokens), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(tokens).unsqueeze(0)}
    local = shard_batch(batch, sp, check_previous=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        loss = hsap_model_loss(model, local, local["num_items_in_batch"])  # the chunked head's, or the full logits'
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # the optimizer's states, the plan's schedule
    with TensorPeak() as m:
        step()
    resident = sum(p.numel() * p.element_size() for p in model.parameters())
    resident += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                    if torch.is_tensor(v) and v.dim() > 0)
    return {"peak": m.peak_bytes, "resident": resident,
            "at_peak": [(round(n / 2**20, 2), op) for n, op in m.at_peak[:12]]}


def predict_for(sizes: dict, tokens: int, levers: dict, sp_size: int, dtype: str = "fp32",
                recv_budget_tokens: int | None = None) -> Any:
    """The model's prediction for a validation configuration (CPU, weights and activations in ``dtype``, AdamW
    without master weights, no DP wrapper)."""
    return predict_step_memory(sizes, tokens, world=sp_size, sp_size=sp_size, sharding="none",
                               levers=MemoryLevers(**levers), param_dtype=dtype, compute_dtype=dtype,
                               master_weights=False, recv_budget_tokens=recv_budget_tokens, device="cpu")


def run_memory_validation(configs: Sequence[tuple] = CONFIGS, progress: bool = False) -> list[dict]:
    """Measured against predicted for every configuration (module docstring).

    Returns:
        One dict per configuration: ``name``, ``sizes``, ``tokens``, ``levers``, ``sp``, ``measured_mib`` (the
        step's allocations, largest rank), ``predicted_mib`` (the model less the resident weights and states),
        ``error`` (predicted / measured - 1), ``stage``, ``limiting_term``, ``resident_mib`` (measured) and
        ``resident_predicted_mib``, ``at_peak``.
    """
    from hf_hsap.testing import DistPool

    out = []
    pools: dict[int, DistPool] = {}
    try:
        for name, sizes, tokens, levers, sp, *more in configs:
            opts = {"dtype": "fp32", "recv_budget_tokens": None, **(more[0] if more else {})}
            t0 = time.perf_counter()
            if sp == 1:
                res = [measure_step(sizes, tokens, levers, 1, **opts)]
            else:
                if sp not in pools:
                    pools[sp] = DistPool(sp, timeout_s=1200.0, pg_timeout_s=1200.0)
                res = pools[sp].run(measure_step, sizes, tokens, levers, sp, opts["dtype"], opts["recv_budget_tokens"])
            worst = max(res, key=lambda r: r["peak"])
            pred = predict_for(sizes, tokens, levers, sp, **opts)
            step_pred = pred.total - pred.weights - _resident_states(pred)
            row = {"name": name, "sizes": sizes, "tokens": tokens, "levers": levers, "sp": sp, **opts,
                   "measured_mib": worst["peak"] / 2**20, "predicted_mib": step_pred / 2**20,
                   "error": step_pred / worst["peak"] - 1, "stage": pred.stage, "limiting_term": pred.limiting_term(),
                   "resident_mib": worst["resident"] / 2**20,
                   "resident_predicted_mib": (pred.weights + _resident_states(pred)) / 2**20,
                   "terms_mib": {k: v / 2**20 for k, v in pred.as_dict().items() if isinstance(v, float)},
                   "at_peak": worst["at_peak"], "seconds": time.perf_counter() - t0}
            out.append(row)
            if progress:
                print(f"  {name:34s} measured {row['measured_mib']:8.1f} MiB predicted {row['predicted_mib']:8.1f} "
                      f"MiB ({row['error']:+.1%}, {row['stage']}) {row['seconds']:.0f}s", flush=True)
    finally:
        for p in pools.values():
            p.close()
    return out


def _resident_states(pred: Any) -> float:
    """The optimizer states that exist before a warm step (the optimizer stage adds its temporaries to them)."""
    return pred.states


def main(argv: Sequence[str]) -> Outcome:
    """Run the validation and the longest-row table on the command line ``argv``; write the JSON and print the
    longest rows (status 0)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks memory_model", description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--quick", action="store_true", help="two configurations only (a check that it runs)")
    p.add_argument("--no-measure", action="store_true",
                   help="only the longest-row table (the results file's validation is kept)")
    p.add_argument("--no-write-md", action="store_true", help="leave BENCHMARKS.md and the detail files alone")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    validation = [] if args.no_measure else run_memory_validation(QUICK if args.quick else CONFIGS, progress=True)
    rows = longest_rows()
    best = best_rows(rows)
    for r in best:
        print(f"  best {r['model']:12s} {r['gpus']:3d} GPUs: {r['tokens'] / 1e6:6.2f}M tokens (device "
              f"{r['device_tokens'] / 1e6:.2f}M, host {r['host_tokens'] / 1e6:.2f}M: the {r['binds']} binds; "
              f"{r['setting']}, offload {r['offload']}, {r['scheme']}), limited by {r['limiting_term']}"
              + (f"; ALST {r['alst'] / 1e6:.1f}M" if r["alst"] else "") + (f"; goal {r['goal'] / 1e6:.0f}M" if r["goal"]
                                                                          else ""))
    command = command_line("memory_model", argv)
    res_validation, validation_command = validation, command
    if args.no_measure and Path(args.out).exists():  # the longest rows alone: the file's validation stays
        old = json.loads(Path(args.out).read_text())
        res_validation = old.get("validation", [])
        validation_command = old.get("validation_command", old.get("command"))
    res = {"command": command, "validation": res_validation, "validation_command": validation_command,
           "max_abs_error": max((abs(v["error"]) for v in res_validation), default=None),
           # every configuration searched, without its terms (the best rows keep theirs)
           "longest_rows": [{k: v for k, v in r.items() if k not in ("terms_gib", "host_gib")} for r in rows],
           "best_rows": best, "gpu_memory_gib": GPU_MEMORY_GIB, "reserve_gib": RESERVE_GIB,
           "host_memory_gib": DEFAULT_HOST_MEMORY_GIB, "host_reserve_fraction": HOST_RESERVE_FRACTION,
           "gpus_per_node": GPUS_PER_NODE, "footprint_gib": DEFAULT_PROCESS_FOOTPRINT_GIB,
           "settings": [name for name, _, _ in settings_here()],
           "alst_published": {f"{m} x {g}": v for (m, g), v in ALST_PUBLISHED.items()},
           "seconds": time.perf_counter() - t0, **stamp()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(f"wrote {args.out} in {res['seconds']:.0f} s")
    return Outcome(0, res, renders_pages(args.out, DEFAULT_OUT, args.no_write_md or args.quick))
