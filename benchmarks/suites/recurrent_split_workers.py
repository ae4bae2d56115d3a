"""Worker side of :mod:`benchmarks.suites.recurrent_split`: one training step of a recurrent-only model (every layer a
gated delta rule, every layer Mamba2, or every layer KDA) on one row of ``T`` tokens under HSAP SP (spawned gloo ranks),
laid out two ways: row A, one document of ``T`` tokens split over the SP group; row B, ``P`` documents of ``T / P``,
each held whole by one rank. Both rows are sharded with ``shard_batch(batch, sp, config=HSAPConfig(sp_size=P,
placement=...))`` (:func:`split_config`) and run interleaved in the same ranks.

What the split costs each rank is timed per step: its CPU time, its wall time, and the wall time it spends inside the
summary exchanges (:class:`benchmarks.suites.hybrid_workers.StateMeter` around
:meth:`hf_hsap.mixers.handoff.StateExchange.exchange`), which is its wait for the other ranks. The bytes of the
exchanges are compared with :func:`summary_rows`.

:data:`MODES` names how a split document's recurrent layers run, each the SP group's ``HSAPConfig.recurrent_mode``
(:data:`MODE_SETUP`): ``summary_exchange`` (every rank runs its runs at once, one exchange of summaries per layer and
direction) and ``heads_all_to_all`` (an all-to-all to head shards, every rank the whole row for its heads); the
all-to-all bytes are counted by the group's ``CommStats``.
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import hf_hsap

from . import hybrid_workers as hw

MODELS = ("gated_delta_rule", "mamba2", "kda")  # every layer of the model one of these
ROWS = ("A", "B")  # A: one document split over the group; B: P documents, one whole per rank
MODES = ("summary_exchange", "heads_all_to_all")  # how a split document's recurrent layers run
MODE_SETUP = {"summary_exchange": "summaries", "heads_all_to_all": "heads"}  # mode -> the group's recurrent_mode
_GROUPS: dict[tuple[int, str], Any] = {}


def model_config(name: str, sizes: dict[str, Any], vocab: int) -> Any:
    """The Transformers config of one of :data:`MODELS` (no hub; float32, no cache, untied embeddings).

    Args:
        name: ``"gated_delta_rule"`` (``Qwen3_5TextConfig``, every ``layer_types`` entry ``"linear_attention"``),
            ``"mamba2"`` (``Mamba2Config``) or ``"kda"`` (``KimiLinearConfig``, every layer ``"linear_attention"``,
            dense MLPs).
        sizes: ``{"layers", "hidden", name: {the family's own fields}}``.
        vocab: the vocabulary.

    Returns:
        The config.
    """
    from transformers import KimiLinearConfig, Mamba2Config, Qwen3_5TextConfig

    n = sizes["layers"]
    common = dict(vocab_size=vocab, num_hidden_layers=n, hidden_size=sizes["hidden"], use_cache=False,
                  tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    own = dict(sizes[name])
    if name == "gated_delta_rule":
        return Qwen3_5TextConfig(layer_types=["linear_attention"] * n, max_position_embeddings=65536, **own, **common)
    if name == "mamba2":
        return Mamba2Config(**own, **common)
    if name == "kda":
        return KimiLinearConfig(layer_types=["linear_attention"] * n, mlp_layer_types=["dense"] * n, **own, **common)
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")


def summary_rows(name: str, config: Any) -> dict[str, int]:
    """The bytes of one summary row ``[B | A]`` of each recurrent mixer of a layer, from the config (float32).

    Every layer runs two recurrent mixers: a short convolution of kernel ``k`` over ``C`` channels (B: its last
    ``k - 1`` inputs ``[1, C, k - 1]``, A: a ``(k - 1) x (k - 1)`` shift: ``(C * (k - 1) + (k - 1) ** 2) * 4`` bytes)
    and the recurrence: the delta rule's (gated delta rule, KDA: B ``[1, H_v, D_k, D_v]``, A ``[1, H_v, D_k, D_k]``:
    ``(H_v * D_k * D_v + H_v * D_k * D_k) * 4``) or Mamba2's SSD (B ``[1, H, P, N]``, A ``[1, H]``:
    ``(H * P * N + H) * 4``). ``C``: the gated delta rule's ``2 * H_k * D_k + H_v * D_v``, KDA's ``3 * H * D``,
    Mamba2's ``expand * hidden + 2 * n_groups * N``.

    Args:
        name: one of :data:`MODELS`. config: its config (:func:`model_config`).

    Returns:
        ``{"conv", "recurrent", "per_summary", "layers", "channels"}``: bytes of a row of each and their sum,
        recurrent layers, the convolution's channels.
    """
    c = config
    if name == "gated_delta_rule":
        h, dk, dv, k = (c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim,
                        c.linear_conv_kernel_dim)
        channels = 2 * c.linear_num_key_heads * dk + h * dv
        rec = h * dk * dv + h * dk * dk
    elif name == "kda":
        h, d, k = c.linear_num_heads, c.linear_head_dim, c.linear_conv_kernel_dim
        channels = 3 * h * d
        rec = h * d * d + h * d * d
    elif name == "mamba2":
        h, p, n, k = c.num_heads, c.head_dim, c.state_size, c.conv_kernel
        channels = int(c.expand * c.hidden_size) + 2 * c.n_groups * n
        rec = h * p * n + h
    else:
        raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")
    conv = (channels * (k - 1) + (k - 1) ** 2) * 4
    return {"conv": conv, "recurrent": rec * 4, "per_summary": conv + rec * 4, "layers": c.num_hidden_layers,
            "channels": channels}


def row_lengths(row: str, tokens: int, sp_size: int) -> list[int]:
    """The documents of a row: A ``[T]``, B ``[T / P] * P``."""
    if row == "A":
        return [tokens]
    assert tokens % sp_size == 0, f"{tokens} tokens do not split into {sp_size} equal documents"
    return [tokens // sp_size] * sp_size


def split_config(sp_size: int, placement: str) -> hf_hsap.HSAPConfig:
    """The :class:`hf_hsap.HSAPConfig` both rows are sharded with: the SP size and ``placement``, every other field at
    its default."""
    return hf_hsap.HSAPConfig(sp_size=sp_size, placement=placement)


def _docs_per_rank(plan: Any, sp_size: int) -> list[list[int]]:
    """The documents each rank holds tokens of."""
    cu = np.asarray(plan.layout.cu_seqlens, dtype=np.int64)
    out = []
    for r in range(sp_size):
        idx = plan.local_token_indices(r).numpy()
        out.append(sorted({int(d) for d in np.searchsorted(cu, idx, side="right") - 1}))
    return out


def _timed_step(model: torch.nn.Module, local: dict[str, Any], sp: Any, meter: hw.StateMeter) -> dict[str, float]:
    """One forward + backward after a barrier: ``{"cpu_s", "wall_s", "wait_s"}`` (``wait_s``: in the exchanges)."""
    meter.calls.clear()
    if getattr(sp, "size", 1) > 1:
        dist.barrier()
    c0, w0 = time.process_time(), time.perf_counter()
    with meter.active():
        hw.step(model, local, sp, meter)
    out = {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0, "wait_s": meter.seconds()}
    model.zero_grad(set_to_none=True)
    return out


def reference_loss(cfg: dict[str, Any], sp_size: int) -> dict[str, dict[str, float]]:
    """Every model's loss at SP 1 on the rows of SP ``sp_size`` (forward only, no SP group; run on one rank).

    Args:
        cfg: :class:`benchmarks.suites.recurrent_split.RecurrentSplitConfig` as a dict. sp_size: the P whose rows
            (B: ``P`` documents) are scored.

    Returns:
        ``{model: {row: loss}}``.
    """
    torch.set_num_threads(1)
    out: dict[str, dict[str, float]] = {}
    for name in cfg["models"]:
        model = hw.build(model_config(name, cfg["sizes"], cfg["vocab"]), cfg["seed"])
        hf_hsap.prepare_model(model, sp_size=1)
        out[name] = {}
        for row in ROWS:
            batch = hw.packed_row(row_lengths(row, cfg["tokens"], sp_size), cfg["vocab"], cfg["seed"], 1)
            with torch.no_grad():
                out[name][row] = float(model(**hf_hsap.shard_batch(batch, 1)).loss)
        del model
    return out


def run_split(cfg: dict[str, Any], sp_size: int, mode: str) -> dict[str, dict[str, Any]]:
    """Rows A and B of every model at one SP size on this rank (collective over the SP group).

    Per model: build it (``attn_implementation="hsap"``, ``prepare_model(model, sp_size=P)``), one step of each row
    with the exchanges metered (bytes, rows, exchanges) and the summary chain recorded; then ``cfg["reps"]``
    interleaved timed rounds (A then B; 0: none). Each step shards its row anew (untimed).

    Args:
        cfg: :class:`benchmarks.suites.recurrent_split.RecurrentSplitConfig` as a dict. sp_size: P (the world).
        mode: one of :data:`MODE_SETUP`.

    Returns:
        ``{model: {"params", "formula", row: {"loss", "tokens", "states", "a2a_bytes", "summaries", "remote", "segments",
        "continued", "split_docs", "runs", "doc_ranks", "docs_per_rank", "cpu_s": [...], "wall_s": [...],
        "wait_s": [...]}}}`` (``states``: this rank's :meth:`~benchmarks.suites.hybrid_workers.StateMeter.summary`).
    """
    torch.set_num_threads(1)
    if (sp_size, mode) not in _GROUPS:
        _GROUPS[sp_size, mode] = hf_hsap.init_sequence_parallel(
            hf_hsap.HSAPConfig(sp_size=sp_size, recurrent_mode=MODE_SETUP[mode]))
    sp = _GROUPS[sp_size, mode]
    plan_cfg = split_config(sp_size, cfg["placement"])
    batches = {row: hw.packed_row(row_lengths(row, cfg["tokens"], sp_size), cfg["vocab"], cfg["seed"], 1)
               for row in ROWS}
    out: dict[str, dict[str, Any]] = {}
    for name in cfg["models"]:
        config = model_config(name, cfg["sizes"], cfg["vocab"])
        model = hw.build(config, cfg["seed"])
        hf_hsap.prepare_model(model, sp_size=sp_size)
        f = summary_rows(name, config)
        assert f["conv"] != f["recurrent"], "the two mixers' rows must differ in size to be told apart"
        meter = hw.StateMeter({f["conv"]: "conv", f["recurrent"]: "recurrent"})
        res: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters()), "formula": f}
        for row in ROWS:
            local = hf_hsap.shard_batch(batches[row], sp, config=plan_cfg)
            meter.calls.clear()
            a2a = sp.comm_stats.a2a_bytes_sent
            with meter.active():
                loss = float(hw.step(model, local, sp, meter))
            a2a = sp.comm_stats.a2a_bytes_sent - a2a
            model.zero_grad(set_to_none=True)
            assert math.isfinite(loss), f"{name} row {row}: loss {loss}"
            res[row] = {"loss": loss, "tokens": int(local["input_ids"].shape[1]), "states": meter.summary(),
                        "a2a_bytes": a2a,
                        **hw.chain_facts(model), **hw.doc_placement(local["hsap_plan"], sp_size),
                        "docs_per_rank": _docs_per_rank(local["hsap_plan"], sp_size),
                        "cpu_s": [], "wall_s": [], "wait_s": []}
        for _ in range(cfg["reps"]):
            for row in ROWS:
                local = hf_hsap.shard_batch(batches[row], sp, config=plan_cfg)
                for k, v in _timed_step(model, local, sp, meter).items():
                    res[row][k].append(v)
        out[name] = res
        del model
    return out
