"""The longest rows the memory model predicts for big models on H100-80GB clusters, the GPU's limit and the host's side
by side (part of :mod:`benchmarks.suites.memory_model`; pure arithmetic, no measurement).

For every model x GPU count the best configuration is searched over :data:`LEVER_SETTINGS` (a list of lever settings,
easy to extend: a setting naming a :class:`~hf_hsap.memory.MemoryLevers` field this branch lacks is skipped) x the
offloads (none / optimizer / params) x the SAP set-ups (:data:`SCHEMES`), ZeRO-3, bf16 weights with float32 master
weights and AdamW, SP over all GPUs, 80 GiB per GPU less 4 GiB, and a DGX-H100 node's host memory (2,048 GiB less
10 % for the OS, 8 GPU processes per node; one GPU: the node's host for that one process; each process's own
footprint the stated default). The answer of a configuration is the smaller of its device and host limits; the best
is the longest answer (the first on a tie, in the lists' order: fewer levers, less offload first).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from hf_hsap.memory.fit import longest_row
from hf_hsap.memory.host import DEFAULT_HOST_MEMORY_GIB, OFFLOADS
from hf_hsap.memory.levers import MemoryLevers

from ..analytic.memory import ROW_GOALS

__all__ = ["ALST_PUBLISHED", "BIG_MODELS", "GPU_COUNTS", "LEVER_SETTINGS", "SCHEMES", "best_rows", "longest_rows",
           "settings_here"]

# Hugging Face configs' sizes (no hub access)
LLAMA3_8B = dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                 tie_word_embeddings=False)
QWEN3_8B = dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                tie_word_embeddings=False)
LLAMA3_70B = dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                  num_attention_heads=64, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                  tie_word_embeddings=False)
BIG_MODELS = {"Llama-3-8B": LLAMA3_8B, "Qwen3-8B": QWEN3_8B, "Llama-3-70B": LLAMA3_70B}
GPU_COUNTS = (1, 8, 32)
# ALST (Arctic Long Sequence Training, arXiv 2506.13996): Llama-3.1-8B, every lever on, H100-80GB
ALST_PUBLISHED = {("Llama-3-8B", 1): 500_000, ("Llama-3-8B", 8): 3_700_000, ("Llama-3-8B", 32): 15_000_000}
SCHEMES = {"flat SAP (U=1)": dict(ulysses_size=1), "flat SAP (U=1), receive budget 64K": dict(
    ulysses_size=1, recv_budget_tokens=65536), "Ulysses (U=8)": dict(ulysses_size=8)}
GPU_MEMORY_GIB, RESERVE_GIB, GPUS_PER_NODE = 80.0, 4.0, 8

ALL = dict(chunked_loss=True, gradient_checkpointing=True, activation_offloading=True, tiled_mlp=True,
           recompute_norms=True)
# (name, MemoryLevers fields, more predict_step_memory arguments): every lever on, then what else may lengthen the
# row (a setting naming a field MemoryLevers lacks is skipped). The offloaded activations take their bytes (hf_hsap's
# slab, hf_hsap.memory.offload). "offload buffers unpinned": the engine's offload buffers are pageable, at their bytes
# (DeepSpeed "pin_memory": false in offload_optimizer / offload_param, FSDP2 CPUOffloadPolicy(pin_memory=False): a
# config key, priced by pinned_round_limit_mb=0); otherwise they are pinned, rounded up to powers of two (the shipped
# configs)
UNPINNED = dict(pinned_round_limit_mb=0)
LEVER_SETTINGS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("all", ALL, {}),
    ("all, checkpoints on the GPU", dict(ALL, activation_offloading=False), {}),
    ("all + tiled attention, checkpoints on the GPU", dict(ALL, tiled_attention=True, activation_offloading=False), {}),
] + [  # every lever and the tiled attention, by layers per checkpoint x layers kept on the GPU x pinned rounding
    (f"all + tiled attention, {b} layer{'s' * (b > 1)} per checkpoint, {k} kept on the GPU"
     + (", offload buffers unpinned" if unpinned else ""),
     dict(ALL, tiled_attention=True, checkpoint_layers=b, layers_kept_on_device=k), UNPINNED if unpinned else {})
    for unpinned in (False, True) for b in (1, 2, 3, 4) for k in (0, 4, 8)
]


def settings_here(settings: Sequence[tuple] = LEVER_SETTINGS) -> list[tuple[str, MemoryLevers, dict[str, Any]]]:
    """The settings whose fields this branch's :class:`MemoryLevers` has, as levers."""
    fields = {f.name for f in dataclasses.fields(MemoryLevers)}
    return [(name, MemoryLevers(**lev), kw) for name, lev, kw in settings if set(lev) <= fields]


def longest_rows(gpu_counts: Sequence[int] = GPU_COUNTS, models: dict[str, dict] | None = None,
                 settings: Sequence[tuple] = LEVER_SETTINGS, host_memory_gib: float = DEFAULT_HOST_MEMORY_GIB
                 ) -> list[dict[str, Any]]:
    """Every configuration's longest row (module docstring).

    Returns:
        One dict per model x GPU count x setting x offload x SAP set-up: ``model``, ``gpus``, ``setting``,
        ``offload``, ``scheme``, ``tokens`` (the smaller limit), ``device_tokens``, ``host_tokens``, ``binds``,
        ``limiting_term``, ``alst``, ``goal``.
    """
    rows = []
    for name, cfg in (models or BIG_MODELS).items():
        for gpus in gpu_counts:
            for setting, levers, extra in settings_here(settings):
                for offload in OFFLOADS:
                    for scheme, kw in SCHEMES.items():
                        if gpus % kw["ulysses_size"] or (gpus == 1 and scheme != "flat SAP (U=1)"):
                            continue
                        fit = longest_row(cfg, gpus=gpus, memory_per_gpu_gib=GPU_MEMORY_GIB, levers=levers,
                                          sharding="zero3", reserve_gib=RESERVE_GIB, param_dtype="bf16",
                                          compute_dtype="bf16", master_weights=True, offload=offload,
                                          host_memory_gib=host_memory_gib,
                                          gpus_per_node=min(gpus, GPUS_PER_NODE), **kw, **extra)
                        rows.append({"model": name, "gpus": gpus, "setting": setting, "offload": offload,
                                     "scheme": scheme, "tokens": fit.tokens, "device_tokens": fit.device_tokens,
                                     "host_tokens": fit.host_tokens, "binds": fit.binds,
                                     "limiting_term": fit.limiting_term,
                                     "terms_gib": {k: v / 2**30 for k, v in fit.memory.as_dict().items()
                                                   if isinstance(v, float)},
                                     "host_gib": {k: v / 2**30 for k, v in fit.host.as_dict().items()
                                                  if isinstance(v, float)},
                                     "alst": ALST_PUBLISHED.get((name, gpus)), "goal": ROW_GOALS.get((name, gpus)),
                                     "unpinned": extra.get("pinned_round_limit_mb") == 0})
    return rows


def best_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The longest of :func:`longest_rows` per model and GPU count (the first on a tie), with ``device_only``: the
    longest device limit over every configuration (the row were the host not counted), and ``default``: the longest
    with the shipped configs' pinned offload buffers (rounded up to powers of two): ``{"tokens", "setting",
    "offload", "scheme", "binds"}``."""
    best: dict[tuple[str, int], dict[str, Any]] = {}
    default: dict[tuple[str, int], dict[str, Any]] = {}
    device_only: dict[tuple[str, int], int] = {}
    for r in rows:
        key = (r["model"], r["gpus"])
        device_only[key] = max(device_only.get(key, 0), r["device_tokens"])
        if key not in best or r["tokens"] > best[key]["tokens"]:
            best[key] = r
        if not r.get("unpinned") and (key not in default or r["tokens"] > default[key]["tokens"]):
            default[key] = r
    keep = ("tokens", "device_tokens", "host_tokens", "setting", "offload", "scheme", "binds", "limiting_term")
    return [{**r, "device_only": device_only[k], "default": {f: default[k][f] for f in keep} if k in default else None}
            for k, r in best.items()]
