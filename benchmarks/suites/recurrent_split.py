"""Recurrent layers under SP on CPU: what splitting one document over the SP group costs a recurrent-only model
(every layer a gated delta rule, every layer Mamba2, or every layer KDA;
:mod:`benchmarks.suites.recurrent_split_workers`).

Row A: one document of ``T`` tokens split over the group; row B: the same ``T`` tokens as ``P`` documents of ``T / P``,
each held whole by one rank (checked). Both rows use the same placement (``contiguous`` by default, so A's runs are
the ranks' slices in order), run interleaved in the same ranks (SP = world size on spawned gloo ranks, one thread
each). Per rank and row: the CPU time and wall time of one forward + backward (median of the timed rounds after a
warm-up) and the wall time spent inside the summary exchanges (its wait for the other ranks). Reported per model and
SP size: A / B of the busiest rank's CPU time and of the wall time, the wait per rank, and the summary bytes per
layer measured at the exchange (summed over ranks, forward and backward) against ``summaries x row bytes``
(:func:`benchmarks.suites.recurrent_split_workers.summary_rows`). Each row's loss at SP P is checked against the same
model's loss at SP 1 on the same row. Each mode of :data:`~benchmarks.suites.recurrent_split_workers.MODES` has its
slot in the results; a mode that is not built yet is recorded as not measured.

Usage: ``python -m benchmarks hybrid [--quick]`` runs it after the hybrid step (``bash scripts/bench_hybrid.sh``), or
``python -m benchmarks recurrent_split [--quick] [--out PATH]`` alone. Writes
``benchmarks/results/recurrent_split.json``; the entry point renders it
(:func:`benchmarks.report.recurrent_split.split_section`) into ``benchmarks/results/hybrid.md`` and a headline of
``BENCHMARKS.md``.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hf_hsap.testing import DistPools

from . import recurrent_split_workers as rw
from .output import RESULTS, Outcome, step_main

DEFAULT_OUT = RESULTS / "recurrent_split.json"


def _sizes() -> dict[str, Any]:
    return {"layers": 4, "hidden": 256,
            "gated_delta_rule": dict(intermediate_size=704, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                                     linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32,
                                     linear_value_head_dim=32, linear_conv_kernel_dim=4),
            "mamba2": dict(num_heads=8, head_dim=64, state_size=64, n_groups=1, expand=2, conv_kernel=4,
                           chunk_size=256),
            "kda": dict(intermediate_size=704, num_attention_heads=8, num_key_value_heads=8, head_dim=32,
                        linear_num_heads=8, linear_head_dim=32, linear_conv_kernel_dim=4)}


@dataclass(frozen=True)
class RecurrentSplitConfig:
    """What :func:`run_recurrent_split` measures.

    Attributes:
        sp_sizes: the SP sizes (each its own world). tokens: ``T``, the row's tokens. models: which of
            :data:`~benchmarks.suites.recurrent_split_workers.MODELS`. sizes: ``layers``, ``hidden`` and each model's
            own config fields (:func:`~benchmarks.suites.recurrent_split_workers.model_config`). vocab: the
            vocabulary. placement: the planner's placement for both rows. reps: timed rounds (0: bytes and losses
            only). seed: weights and tokens. loss_tol: largest relative difference of a row's loss at SP P from its
            loss at SP 1.
    """

    sp_sizes: tuple[int, ...] = (2, 4)
    tokens: int = 8192
    models: tuple[str, ...] = rw.MODELS
    sizes: dict[str, Any] = field(default_factory=_sizes)
    vocab: int = 4096
    placement: str = "contiguous"
    reps: int = 3
    seed: int = 0
    loss_tol: float = 1e-4

    def quick(self) -> "RecurrentSplitConfig":
        """Tiny models and rows at SP 2 and 4, no timing: a smoke run of seconds (A's document still split; every
        kernel's heads divide 4, so the heads mode runs them all)."""
        return dataclasses.replace(self, tokens=48, vocab=128, reps=0, sizes={
            "layers": 2, "hidden": 32,
            "gated_delta_rule": dict(intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                     linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=8,
                                     linear_value_head_dim=8, linear_conv_kernel_dim=4),
            "mamba2": dict(num_heads=4, head_dim=16, state_size=8, n_groups=1, expand=2, conv_kernel=4,
                           chunk_size=16),
            "kda": dict(intermediate_size=64, num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                        linear_num_heads=4, linear_head_dim=8, linear_conv_kernel_dim=4)})


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _max(xs: list[float | None]) -> float | None:
    return None if not xs or None in xs else max(xs)  # type: ignore[type-var]


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _exchanges(ranks: list[dict[str, Any]], formula: dict[str, int], summaries: int, remote: bool) -> dict[str, Any]:
    """One row's summary exchanges, summed over ranks, beside the formula.

    Args:
        ranks: every rank's record of the row; formula: :func:`~benchmarks.suites.recurrent_split_workers.summary_rows`;
        summaries: summaries sent over the group per layer (``Chain.summaries``); remote: whether a run continues one
        held by another rank (0 and ``False`` in the heads mode: every kernel runs whole documents).

    Returns:
        ``{"bytes": {kind: {"forward", "backward", "formula"}}, "exchanges": {kind: {"forward", "backward",
        "expected"}}, "equal"}``: bytes per layer (``kind``: ``conv``, ``recurrent``, ``total``), exchanges per layer
        and direction of each rank (-1: the ranks differ), and whether all equal the formula.
    """
    layers, kinds = formula["layers"], ("conv", "recurrent")
    got = {k: {p: sum(r["states"][p].get(k, {}).get("bytes", 0) for r in ranks) / layers for p in rw.hw.PHASES}
           for k in kinds}
    per = {k: {p: {r["states"][p].get(k, {}).get("exchanges", 0) for r in ranks} for p in rw.hw.PHASES} for k in kinds}
    nbytes = {k: {**got[k], "formula": summaries * formula[k]} for k in kinds}
    nbytes["total"] = {p: nbytes["conv"][p] + nbytes["recurrent"][p] for p in ("forward", "backward", "formula")}
    exchanges = {k: {p: (next(iter(v)) / layers if len(v) == 1 else -1) for p, v in per[k].items()}
                 for k in kinds}
    for v in exchanges.values():
        v["expected"] = int(remote)
    other = any("other" in r["states"][p] for r in ranks for p in rw.hw.PHASES)
    equal = (not other and all(v["forward"] == v["backward"] == v["formula"] for v in nbytes.values())
             and all(v["forward"] == v["backward"] == v["expected"] for v in exchanges.values()))
    return {"bytes": nbytes, "exchanges": exchanges, "equal": equal}


def _model_row(sp_size: int, name: str, ranks: list[dict[str, Any]], ref: dict[str, float], mode: str
               ) -> dict[str, Any]:
    """One model's rows A and B at one SP size in ``mode`` from every rank's record (the heads mode exchanges no
    summaries: its all-to-all bytes per layer are ``a2a_kib``)."""
    heads = mode == "heads_all_to_all"
    out: dict[str, Any] = {"params": ranks[0]["params"], "formula": ranks[0]["formula"]}
    for row in rw.ROWS:
        rs = [r[row] for r in ranks]
        cpu = [_median(r["cpu_s"]) for r in rs]
        wall = [_median(r["wall_s"]) for r in rs]
        first = rs[0]
        out[row] = {"loss": first["loss"], "loss_sp1": ref[row],
                    "loss_rel_err": abs(first["loss"] - ref[row]) / abs(ref[row]),
                    "tokens": [r["tokens"] for r in rs], "cpu_s_ranks": cpu, "wall_s_ranks": wall,
                    "wait_s_ranks": [_median(r["wait_s"]) for r in rs], "cpu_s": _max(cpu), "wall_s": _max(wall),
                    "summaries": first["summaries"], "remote": first["remote"],
                    "continued": [r["continued"] for r in rs], "segments": [r["segments"] for r in rs],
                    "split_docs": first["split_docs"], "runs": first["runs"], "doc_ranks": first["doc_ranks"],
                    "docs_per_rank": first["docs_per_rank"],
                    "a2a_bytes_per_layer": sum(r["a2a_bytes"] for r in rs) / out["formula"]["layers"],
                    **_exchanges(rs, out["formula"], 0 if heads else first["summaries"],
                                 False if heads else first["remote"])}
    a, b = out["A"], out["B"]
    out["cpu_ratio"], out["wall_ratio"] = _ratio(a["cpu_s"], b["cpu_s"]), _ratio(a["wall_s"], b["wall_s"])
    # the rows are what they claim: A's document on every rank, continued there; B's documents one whole per rank
    assert a["split_docs"] == 1 and sum(a["continued"]) == sp_size - 1 and a["remote"], f"{name}: A is not split"
    assert b["split_docs"] == 0 and not b["remote"] and b["docs_per_rank"] == [[r] for r in range(sp_size)], \
        f"{name}: B's documents are not one per rank: {b['docs_per_rank']}"
    return out


def run_recurrent_split(cfg: RecurrentSplitConfig, pools: DistPools | None = None,
                        timeout_s: float = 3600.0) -> dict[str, Any]:
    """Every SP size and model of ``cfg`` in each built mode (module docstring).

    Args:
        cfg: what to measure; pools: spawned gloo ranks to use (default: fresh ones, closed at the end);
        timeout_s: how long one SP size may take (the hang guard).

    Returns:
        ``{"config", "models": {name: {"config": the family's fields, "formula", "params"}}, "modes": {mode:
        {"status": "measured" | "not built", "rows": [{"sp", "models": {name: {"A", "B", "cpu_ratio",
        "wall_ratio", ...}}}]}}, "loss_err": largest relative loss difference from SP 1, "seconds", "load": the
        1-minute load average at the start and the end, "cpus"}``.
    """
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    own = pools is None
    pools = DistPools(timeout_s=timeout_s, pg_timeout_s=timeout_s) if own else pools
    args = dataclasses.asdict(cfg)
    modes: dict[str, dict[str, Any]] = {m: {"status": "not built", "rows": []} for m in rw.MODES}
    try:
        for sp_size in cfg.sp_sizes:
            ref = pools.get(1, timeout_s=timeout_s).run(rw.reference_loss, args, sp_size)[0]
            for mode in rw.MODE_SETUP:
                ranks = pools.get(sp_size, timeout_s=timeout_s).run(rw.run_split, args, sp_size, mode)
                modes[mode]["status"] = "measured"
                modes[mode]["rows"].append({"sp": sp_size, "models": {
                    name: _model_row(sp_size, name, [r[name] for r in ranks], ref[name], mode)
                    for name in cfg.models}})
    finally:
        if own:
            pools.close()
    errs = [m[row]["loss_rel_err"] for mode in modes.values() for r in mode["rows"] for m in r["models"].values()
            for row in rw.ROWS]
    loss_err = max(errs)
    assert loss_err <= cfg.loss_tol, f"a row's loss at SP P differs from SP 1 by {loss_err} (relative)"
    first = modes["summary_exchange"]["rows"][0]["models"]
    models = {name: {"config": cfg.sizes[name], "formula": first[name]["formula"], "params": first[name]["params"]}
              for name in cfg.models}
    return {"config": args, "models": models, "modes": modes, "loss_err": loss_err,
            "seconds": time.perf_counter() - t0, "load": [load0, os.getloadavg()[0]], "cpus": os.cpu_count()}


def _own_out(argv: Sequence[str]) -> list[str]:
    """``argv`` with a given ``--out PATH`` (the first step's results file, when run by ``python -m benchmarks
    hybrid``) turned into ``PATH``'s folder / ``<stem>.recurrent_split.json``, so that the two steps never write one
    file."""
    args = list(argv)
    for i, a in enumerate(args):
        if a == "--out" and i + 1 < len(args):
            p = Path(args[i + 1])
            args[i + 1] = str(p.with_name(f"{p.stem}.recurrent_split.json"))
        elif a.startswith("--out="):
            p = Path(a.split("=", 1)[1])
            args[i] = f"--out={p.with_name(f'{p.stem}.recurrent_split.json')}"
    return args


def main(argv: Sequence[str]) -> Outcome:
    """``python -m benchmarks recurrent_split`` with the command line ``argv``
    (:func:`benchmarks.suites.output.step_main`)."""
    return step_main(argv, suite="recurrent_split", description=__doc__.split("\n")[0],
                     config=lambda quick: RecurrentSplitConfig().quick() if quick else RecurrentSplitConfig(),
                     run=run_recurrent_split, out=DEFAULT_OUT, quick_help="tiny models and rows, SP 2 and 4, no timing")


def main_after_hybrid(argv: Sequence[str]) -> Outcome:
    """The second step of ``python -m benchmarks hybrid``: :func:`main` with the step's ``--out`` moved aside
    (:func:`_own_out`)."""
    return main(_own_out(argv))
