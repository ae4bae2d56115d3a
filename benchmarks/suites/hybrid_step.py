"""A hybrid model's training step under SP on CPU: per-rank tensor peak and step time of one forward + backward of a
Qwen3.5-like hybrid (gated-delta-rule layers beside full attention) and of a pure-attention model of the same width,
depth and heads (Qwen3), on one packed text row at SP 1, 2 and 4, and the summaries a split document's runs exchange
(:mod:`benchmarks.suites.hybrid_workers`); and the same hybrid on a plan priced for it ("hybrid, planned for it",
``hybrid_priced``: ``shard_batch(batch, sp, config=HSAPConfig(sp_size=P, cost_model=CostModel.from_config(config,
"network", "H100")))``), whose cost model prices the recurrent layers (their tokens and the summary exchange), where
the other two run on the group's default plan (its cost model prices attention only).

Each SP size runs on its own spawned gloo ranks (SP = world size); the three variants run side by side in the same
ranks on the same row (the priced one: the hybrid's own module, so the same loss). Per variant and rank: the exact
tensor peak of one step (:class:`benchmarks.tensor_memory.TensorPeak`, in its own untimed step) and the CPU time of a
step (median of the interleaved timed rounds after a warm-up); reported: the busiest rank (max over ranks). Every rank
runs all its runs at once; when a document is split, each recurrent mixer (convolution, delta rule) of each layer
makes one summary exchange forward and one backward. For both hybrids: the exchanges per layer and the summary bytes,
measured at the exchange (summed over ranks), against the formula ``summaries x row bytes`` per layer, kind and
direction (``Chain.summaries``; the row bytes: :func:`benchmarks.suites.hybrid_workers.state_formula`; backward: one
gradient row back per summary received).

Usage: ``python -m benchmarks hybrid [--quick] [--out benchmarks/results/hybrid_step.json] [--no-write-md]``
(``bash scripts/bench_hybrid.sh``). Writes the results JSON; the entry point then renders it
(:func:`benchmarks.report.hybrid.hybrid_section`) into the detail file ``benchmarks/results/hybrid.md`` and
``BENCHMARKS.md``'s headline.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from hf_hsap.testing import DistPools

from . import hybrid_workers as hw
from .output import RESULTS, Outcome, step_main

DEFAULT_OUT = RESULTS / "hybrid_step.json"
# tokens per document: two long enough to be split at SP 4 (a rank holds a quarter of the row), a tail of short ones
LENGTHS = (1536, 1024, 512, 384, 256, 192, 128, 64)
HYBRIDS = tuple(n for n, (kind, _) in hw.VARIANTS.items() if kind == "hybrid")  # the variants with recurrent layers


@dataclass(frozen=True)
class HybridStepConfig:
    """What :func:`run_hybrid_step` measures.

    Attributes:
        sp_sizes: the SP sizes (each its own world). sizes: both models' hidden size, MLP, heads, head dim and
            ``layer_types`` (the attention model makes every layer full attention), and the hybrid's ``linear_*``
            fields (see :func:`benchmarks.suites.hybrid_workers.model_config`). vocab: the vocabulary. lengths: the row's
            documents. pad_to: the row length's multiple. reps: timed rounds (0: memory and bytes only).
            seed: weights and tokens. loss_tol: largest difference of a model's loss at SP n from its loss at SP 1.
            priced_tol: largest relative difference of the priced plan's loss from the hybrid's (same model, row).
    """

    sp_sizes: tuple[int, ...] = (1, 2, 4)
    sizes: dict[str, Any] = field(default_factory=lambda: dict(
        hidden_size=256, intermediate_size=704, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
        layer_types=("linear_attention",) * 3 + ("full_attention",), linear_num_key_heads=4,
        linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4))
    vocab: int = 4096
    lengths: tuple[int, ...] = LENGTHS
    pad_to: int = 4
    reps: int = 5
    seed: int = 0
    loss_tol: float = 1e-4
    priced_tol: float = 1e-5

    def quick(self) -> "HybridStepConfig":
        """Tiny sizes at SP 1 and 2, no timing: a smoke run of a few seconds (a document split at SP 2)."""
        return dataclasses.replace(self, sp_sizes=(1, 2), vocab=128, reps=0, lengths=(60, 12, 8), sizes=dict(
            hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            layer_types=("linear_attention", "full_attention"), linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4))


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _states(ranks: list[dict[str, Any]], formula: dict[str, int], summaries: int, remote: bool) -> dict[str, Any]:
    """The hybrid's summary exchanges and bytes, summed over ranks, beside the formula.

    Args:
        ranks: every rank's ``hybrid`` record; formula: :func:`benchmarks.suites.hybrid_workers.state_formula`;
        summaries: summary rows sent between ranks per mixer layer (``Chain.summaries``); remote: whether any
        document is split (``Chain.remote``: then each mixer exchanges once per layer and direction).

    Returns:
        ``{"layer": {kind: {"measured", "measured_backward", "formula"}}, "exchanges": {kind: {"forward",
        "backward", "expected"}}, "step": {"measured", "formula"}, "equal"}``: bytes per mixer layer and direction
        (``kind``: ``conv``, ``recurrent``, ``total``), the exchanges each rank makes per mixer layer and direction
        (the same on every rank, checked), and bytes per step (every mixer layer, forward summaries + backward
        gradients). ``equal``: measured = formula everywhere (bytes of both directions, exchanges, no row of
        another size).
    """
    layers = formula["mixer_layers"]
    kinds = ("conv", "recurrent")
    summed = {p: {k: sum(r["states"][p].get(k, {}).get("bytes", 0) for r in ranks) for k in kinds}
              for p in hw.PHASES}
    per_rank = {p: {k: {r["states"][p].get(k, {}).get("exchanges", 0) for r in ranks} for k in kinds}
                for p in hw.PHASES}
    other = any("other" in r["states"][p] for r in ranks for p in hw.PHASES)
    layer: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        per = [summed[p][kind] / layers for p in hw.PHASES]
        layer[kind] = {"measured": per[0], "measured_backward": per[1], "formula": summaries * formula[kind]}
    layer["total"] = {k: layer["conv"][k] + layer["recurrent"][k] for k in ("measured", "measured_backward", "formula")}
    exchanges = {k: {**{p: _one(per_rank[p][k]) / layers for p in hw.PHASES}, "expected": int(remote)}
                 for k in kinds}
    step = {"measured": sum(sum(v.values()) for v in summed.values()),
            "formula": 2 * layers * summaries * formula["per_summary"]}
    equal = (not other and step["measured"] == step["formula"]
             and all(v["measured"] == v["formula"] == v["measured_backward"] for v in layer.values())
             and all(e["forward"] == e["backward"] == e["expected"] for e in exchanges.values()))
    return {"layer": layer, "exchanges": exchanges, "step": step, "equal": equal}


def _one(values: set[int]) -> int:
    """The one value every rank recorded (-1 when the ranks differ)."""
    return next(iter(values)) if len(values) == 1 else -1


def _summary(sp_size: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One SP size's row of the results from every rank's :func:`benchmarks.suites.hybrid_workers.run_sp`."""
    row: dict[str, Any] = {"sp": sp_size}
    for name in hw.VARIANTS:
        rs = [r[name] for r in ranks]
        times = [_median(r["cpu_s"]) for r in rs]
        row[name] = {"peak_mib": max(r["peak_bytes"] for r in rs) / 2**20,
                     "peak_mib_ranks": [r["peak_bytes"] / 2**20 for r in rs],
                     "cpu_s": None if None in times else max(times), "wall_s": _median(rs[0]["wall_s"]),
                     "tokens": [r["tokens"] for r in rs], "loss": rs[0]["loss"], "params": rs[0]["params"],
                     "comm_bytes": sum(r["comm_bytes"] for r in rs), "split_docs": rs[0]["split_docs"],
                     "runs": rs[0]["runs"], "doc_ranks": rs[0]["doc_ranks"],
                     "summaries": rs[0]["summaries"], "remote": rs[0]["remote"],
                     "continued": None if rs[0]["continued"] is None else [r["continued"] for r in rs],
                     "at_peak": rs[0]["at_peak"]}
    for name in HYBRIDS:
        hyb = [r[name] for r in ranks]
        row[name]["states"] = _states(hyb, hyb[0]["formula"], hyb[0]["summaries"], hyb[0]["remote"])
    return row


def model_facts(cfg: HybridStepConfig) -> dict[str, Any]:
    """The sizes of the configuration's two models, read from their Transformers configs (no model built), and the
    priced plan's cost model (``cost``: its fields)."""
    hyb = hw.model_config("hybrid", cfg.sizes, cfg.vocab)
    att = hw.model_config("attention", cfg.sizes, cfg.vocab)
    return {"hidden": hyb.hidden_size, "layers": hyb.num_hidden_layers, "heads": hyb.num_attention_heads,
            "kv_heads": hyb.num_key_value_heads, "head_dim": hyb.head_dim, "mlp": hyb.intermediate_size,
            "vocab": hyb.vocab_size, "layer_types": list(hyb.layer_types), "attention_types": list(att.layer_types),
            "linear_k_heads": hyb.linear_num_key_heads, "linear_v_heads": hyb.linear_num_value_heads,
            "linear_dk": hyb.linear_key_head_dim, "linear_dv": hyb.linear_value_head_dim,
            "conv_kernel": hyb.linear_conv_kernel_dim, "formula": hw.state_formula(hyb),
            "cost": {"link": hw.LINK, "hardware": hw.HARDWARE, **dataclasses.asdict(hw.priced_cost(hyb))}}


def run_hybrid_step(cfg: HybridStepConfig, pools: DistPools | None = None,
                    timeout_s: float = 3600.0) -> dict[str, Any]:
    """Every SP size of ``cfg`` (module docstring).

    Args:
        cfg: what to measure; pools: spawned gloo ranks to use (default: fresh ones, closed at the end);
        timeout_s: how long one SP size may take (the hang guard).

    Returns:
        ``{"config", "model", "row": {"tokens", "documents"}, "rows": [{"sp", "hybrid": {...}, "attention": {...},
        "hybrid_priced": {...}}], "loss_err": {variant: largest |loss at SP n - loss at SP 1|}, "priced_err": largest
        |priced loss - hybrid loss| / |hybrid loss| over SP sizes, "seconds", "load": the 1-minute load average at the
        start and the end, "cpus"}``.
    """
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    own = pools is None
    pools = DistPools(timeout_s=timeout_s, pg_timeout_s=timeout_s) if own else pools
    tokens = -(-sum(cfg.lengths) // cfg.pad_to) * cfg.pad_to
    rows = []
    try:
        for sp_size in cfg.sp_sizes:
            ranks = pools.get(sp_size, timeout_s=timeout_s).run(hw.run_sp, dataclasses.asdict(cfg), sp_size, cfg.reps)
            rows.append(_summary(sp_size, ranks))
            for name in hw.VARIANTS:
                assert sum(rows[-1][name]["tokens"]) == tokens, f"{name}: {rows[-1][name]['tokens']} tokens"
    finally:
        if own:
            pools.close()
    loss_err = {name: max(abs(r[name]["loss"] - rows[0][name]["loss"]) for r in rows) for name in hw.VARIANTS}
    for name, err in loss_err.items():
        assert err <= cfg.loss_tol, f"{name}: the loss moves by {err} across SP sizes"
    priced_err = max(abs(r["hybrid_priced"]["loss"] - r["hybrid"]["loss"]) / abs(r["hybrid"]["loss"]) for r in rows)
    assert priced_err <= cfg.priced_tol, f"the priced plan's loss differs from the hybrid's by {priced_err} (relative)"
    return {"config": dataclasses.asdict(cfg), "model": model_facts(cfg),
            "row": {"tokens": tokens, "documents": len(cfg.lengths)}, "rows": rows, "loss_err": loss_err,
            "priced_err": priced_err,
            "seconds": time.perf_counter() - t0, "load": [load0, os.getloadavg()[0]], "cpus": os.cpu_count()}


def main(argv: Sequence[str]) -> Outcome:
    """``python -m benchmarks hybrid`` with the command line ``argv`` (:func:`benchmarks.suites.output.step_main`)."""
    return step_main(argv, suite="hybrid", description=__doc__.split("\n")[0],
                     config=lambda quick: HybridStepConfig().quick() if quick else HybridStepConfig(),
                     run=run_hybrid_step, out=DEFAULT_OUT, quick_help="tiny sizes, SP 1 and 2, no timing")
