"""Worker side of :mod:`benchmarks.suites.memory_levers`: one training step (forward + backward) of a Llama-shaped model on
a packed row under HSAP SP (spawned gloo ranks), with each scheme's memory levers.

Schemes (every one on the same model, row, plan and attention):

* ``full``: today's path, the full ``[T_local, V]`` logits and :func:`hf_hsap.integrations.hsap_causal_lm_loss`;
* ``checkpointing``: the same with Transformers' gradient checkpointing;
* ``chunked``: hf_hsap's chunked LM head (:func:`hf_hsap.integrations.hsap_model_loss`);
* ``trl_fused``: TRL's fused LM head (``trl.trainer.utils.add_fused_lm_head`` with the outputs ``SFTTrainer`` asks
  for: what ``HSAPSFTTrainer`` inherits), the loss from its per-token log-probabilities;
* ``checkpointing+chunked``; ``all``: checkpointing, chunked loss, the tiled MLP and recomputed norms (hf_hsap's
  every lever on CPU);
* ``alst``: DeepSpeed's ALST levers on CPU: gradient checkpointing, ``TiledMLP`` on every MLP and
  ``TiledFusedLogitsLoss`` over the LM head (DeepSpeed in the environment of ``scripts/bench_peers.sh``).

Every scheme's loss and gradients are checked against ``full`` before anything is measured.
"""
from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

import hf_hsap
from hf_hsap.integrations import check_plan_used, hsap_model_loss, shard_batch
from hf_hsap.integrations.loss import TARGET_KEYS

from ..tensor_memory import TensorPeak

SCHEMES = ("full", "checkpointing", "chunked", "trl_fused", "checkpointing+chunked", "all", "alst")
_GROUPS: dict[int, Any] = {}


def model_config(vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, inter: int) -> Any:
    """The benchmark's Llama config (no hub)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=1 << 20,
                       tie_word_embeddings=False)


def deepspeed_available() -> str | None:
    """None when DeepSpeed's ALST levers import, else why not."""
    try:
        from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss, TiledMLP  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure means: not here
        return f"{type(e).__name__}: {e}"
    return None


def _alst_mlp(module: torch.nn.Module, tile: int) -> None:
    """DeepSpeed's ``TiledMLP`` on this MLP instance (as ALST's docs patch ``LlamaMLP.forward``)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    def forward(x: torch.Tensor) -> torch.Tensor:
        shards = max(1, math.ceil(x.shape[-2] / tile))
        return TiledMLP.apply(lambda mod, h: type(mod).forward(mod, h), module, x, shards,
                              [p for p in module.parameters()])

    module.forward = forward


def _alst_loss(model: torch.nn.Module, inputs: dict[str, Any], labels: torch.Tensor, n: torch.Tensor,
               tile: int) -> torch.Tensor:
    """ALST's loss: the backbone's hidden states, then ``TiledFusedLogitsLoss`` over the LM head (summed CE / N)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss

    hidden = model.model(**inputs).last_hidden_state  # [1, T_local, H]
    head = model.lm_head

    def loss_fn(mod: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # normalised inside: the head's gradient is added to .grad inside the forward, before any outer scale
        return F.cross_entropy(mod(x).float(), y, ignore_index=-100, reduction="sum") / n

    shards = max(1, math.ceil(hidden.shape[1] / tile))
    return TiledFusedLogitsLoss.apply(loss_fn, head, hidden, labels.to(hidden.device), None, shards,
                                      [head.weight], "sum")


def build(scheme: str, config: Any, tile: int, loss_tile: int, *, sp_size: int = 1, seed: int = 0) -> torch.nn.Module:
    """The model of ``scheme`` (the same weights for every scheme), prepared for SP ``sp_size``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="hsap", dtype=torch.float32).train()
    levers = {"full": None, "trl_fused": None, "checkpointing": dict(chunked_loss=False, gradient_checkpointing=True),
              "chunked": dict(), "checkpointing+chunked": dict(gradient_checkpointing=True),
              "all": dict(gradient_checkpointing=True, tiled_mlp=True, mlp_tile_tokens=tile, recompute_norms=True),
              "alst": dict(chunked_loss=False, gradient_checkpointing=True)}[scheme]
    if levers is not None:
        hf_hsap.prepare_model(model, sp_size=sp_size, levers=hf_hsap.MemoryLevers(loss_tile_tokens=loss_tile, **levers))
    if scheme == "trl_fused":
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    if scheme == "alst":
        for name, module in model.named_modules():
            if name.endswith(".mlp"):
                _alst_mlp(module, tile)
    return model


def step(model: torch.nn.Module, scheme: str, local: dict[str, Any], sp: Any, loss_tile: int) -> torch.Tensor:
    """Forward + backward of one sharded row (ALST's loss in shards of ``loss_tile`` tokens); returns the global
    loss (collective)."""
    n = local["num_items_in_batch"]
    inputs = {k: v for k, v in local.items() if k not in TARGET_KEYS}
    group = sp if getattr(sp, "size", 1) > 1 else None
    if scheme == "alst":
        loss = _alst_loss(model, {k: v for k, v in inputs.items() if k != "use_cache"} | {"use_cache": False},
                          local["shift_labels"], n, loss_tile)
    elif scheme == "trl_fused":
        out = model(**inputs, shift_labels=local["shift_labels"], num_items_in_batch=n, fused_lm_head=True)
        loss = out.loss
        if group is not None:
            check_plan_used(local)
    else:  # the chunked head's loss, or the full logits'
        loss = hsap_model_loss(model, local, n, sp=group)
    loss.backward()
    total = loss.detach().clone()
    if group is not None:
        dist.all_reduce(total, group=sp.group)
    return total


def _row(T: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """A packed row of ``T`` tokens: long-tail document lengths (a few long, many short)."""
    g = torch.Generator().manual_seed(seed)
    lens, left = [], T
    while left > 0:
        n = min(left, int(torch.randint(16, max(17, T // 3), (1,), generator=g)))
        lens.append(n)
        left -= n
    ids = torch.randint(0, vocab, (1, T), generator=g)
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    labels = ids.clone()
    return {"input_ids": ids, "position_ids": pos, "labels": labels}


def run_row(schemes: tuple[str, ...], cfg: dict[str, Any], T: int, sp_size: int, reps: int,
            memory: bool) -> dict[str, dict[str, Any]]:
    """Every scheme at one row length on this rank (collective over the SP group).

    First one step of each, checked against ``full`` (loss and every parameter gradient of this rank, relative);
    then the tensor peak of one step per scheme (``memory``); then ``reps`` interleaved rounds of one step per
    scheme, timed (this rank's CPU time and wall time).

    Returns:
        ``{scheme: {"loss", "loss_err", "grad_err", "peak_bytes", "at_peak", "cpu_s": [...], "wall_s": [...]}}``.
    """
    torch.set_num_threads(1)
    if sp_size > 1 and sp_size not in _GROUPS:
        _GROUPS[sp_size] = hf_hsap.init_sequence_parallel(sp_size)
    sp = _GROUPS.get(sp_size, 1)
    config = model_config(cfg["vocab"], cfg["hidden"], cfg["layers"], cfg["heads"], cfg["kv_heads"], cfg["inter"])
    row = _row(T, cfg["vocab"], cfg["seed"])
    models = {s: build(s, config, cfg["tile"], cfg["loss_tile"], sp_size=sp_size) for s in ("full", *schemes)}
    out: dict[str, dict[str, Any]] = {}
    ref = None
    for name, model in models.items():
        loss = float(step(model, name, shard_batch(row, sp), sp, cfg["tile"]))
        grads = {k: p.grad.detach().clone() for k, p in model.named_parameters()}
        if ref is None:
            ref = (loss, grads)
        out[name] = {"loss": loss, "loss_err": abs(loss - ref[0]) / abs(ref[0]),
                     "grad_err": max(float((grads[k] - g).abs().max() / g.abs().max().clamp_min(1e-30))
                                     for k, g in ref[1].items())}
        model.zero_grad(set_to_none=True)
    del ref
    if memory:
        for name, model in models.items():
            local = shard_batch(row, sp)
            with TensorPeak() as peak:
                step(model, name, local, sp, cfg["loss_tile"])
            model.zero_grad(set_to_none=True)
            out[name]["peak_bytes"] = peak.peak_bytes
            out[name]["at_peak"] = [(n, op) for n, op in peak.at_peak[:6]]
    for name in out:
        out[name]["cpu_s"], out[name]["wall_s"] = [], []
    for _ in range(reps):
        for name, model in models.items():
            local = shard_batch(row, sp)
            if sp_size > 1:
                dist.barrier()
            c0, w0 = time.process_time(), time.perf_counter()
            step(model, name, local, sp, cfg["loss_tile"])
            out[name]["cpu_s"].append(time.process_time() - c0)
            out[name]["wall_s"].append(time.perf_counter() - w0)
            model.zero_grad(set_to_none=True)
    return {k: v for k, v in out.items() if k in schemes}
