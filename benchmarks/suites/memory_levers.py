"""The memory levers measured side by side on CPU: exact tensor peak and step time per rank against row
length, hf_hsap with and without each lever and DeepSpeed's pure-torch ALST levers, on the same model and rows; and
the pretraining recipe's peak resident memory per rank between a short and a long row.

Part 1 (:func:`run_levers`): SP 2 on spawned gloo ranks, a Llama-shaped model, long-tail packed rows of
``2 x tokens_per_rank`` tokens; the schemes of :mod:`benchmarks.suites.lever_workers`, each checked against the path without
levers (loss and every gradient) before its tensor peak (:class:`benchmarks.tensor_memory.TensorPeak`) and its
interleaved timed rounds (this rank's CPU time; median).

Part 2 (:func:`run_recipe_growth`): ``recipes/pretrain.py`` on 2 CPU processes at SP 2 (the built-in tiny-llama),
rows of 2,048 and 16,384 tokens, without levers (``--no_chunked_loss``) and with ``--gradient_checkpointing`` (the
chunked loss is the default): the largest rank's peak resident set per token per rank between the two.

DeepSpeed is not an hf_hsap dependency: ``bash scripts/bench_memory.sh`` runs this in DeepSpeed's environment
(``.venv-ds``); without DeepSpeed the ``alst`` scheme is left out, with the reason in the results.

Usage: ``python -m benchmarks memory_levers [--quick] [--out benchmarks/results/memory_levers.json]
[--no-write-md]`` (``python -m benchmarks memory`` runs it, then :mod:`benchmarks.suites.memory_model`). Writes the
results JSON; the entry point then (unless ``--quick`` or ``--no-write-md``) renders it
(:func:`benchmarks.report.memory.levers_section`) into the detail file ``benchmarks/results/memory.md`` and
``BENCHMARKS.md``'s headline.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hf_hsap.testing import DistPool

from . import lever_workers as lw
from ..analytic.memory import RECIPE_LENGTHS
from .output import RESULTS, Outcome, renders_pages, stamp
from .recipe_runs import kb_per_token, recipe_peak

DEFAULT_OUT = RESULTS / "memory_levers.json"


@dataclass(frozen=True)
class LeversConfig:
    """What :func:`run_levers` measures.

    Attributes:
        world: ranks (the SP size). tokens_per_rank: the row lengths, per rank. model: the Llama shape
        (:func:`benchmarks.suites.lever_workers.model_config`'s fields) and ``tile`` (MLP tile tokens, both tiled MLPs) /
        ``loss_tile`` (loss tile tokens; ALST's loss shards get as many tokens). reps: timed rounds. schemes.
    """

    world: int = 2
    tokens_per_rank: tuple[int, ...] = (2048, 4096, 8192)
    model: dict[str, Any] = field(default_factory=lambda: dict(vocab=32000, hidden=128, layers=4, heads=4,
                                                               kv_heads=2, inter=352, tile=1024, loss_tile=512,
                                                               seed=0))
    reps: int = 3
    schemes: tuple[str, ...] = lw.SCHEMES

    def quick(self) -> "LeversConfig":
        """Small sizes for a smoke run."""
        return dataclasses.replace(self, tokens_per_rank=(512, 1024), reps=1,
                                   model={**self.model, "vocab": 4096, "tile": 256, "loss_tile": 128})


def run_levers(cfg: LeversConfig) -> dict[str, Any]:
    """Part 1 (module docstring). Returns ``{"config", "deepspeed", "rows": [{tokens_per_rank, scheme, ...}]}``."""
    rows = []
    with DistPool(cfg.world, timeout_s=3600.0, pg_timeout_s=3600.0) as pool:
        missing = pool.run(lw.deepspeed_available)[0]
        schemes = tuple(s for s in cfg.schemes if s != "alst" or missing is None)
        for t in cfg.tokens_per_rank:
            per_rank = pool.run(lw.run_row, schemes, cfg.model, t * cfg.world, cfg.world, cfg.reps, True)
            for name in schemes:
                ranks = [r[name] for r in per_rank]
                rows.append({"tokens_per_rank": t, "scheme": name,
                             "peak_mib": max(r["peak_bytes"] for r in ranks) / 2**20,
                             "cpu_s": max(statistics.median(r["cpu_s"]) for r in ranks),
                             "wall_s": statistics.median(ranks[0]["wall_s"]),
                             "loss_err": max(r["loss_err"] for r in ranks),
                             "grad_err": max(r["grad_err"] for r in ranks),
                             "at_peak": ranks[0]["at_peak"][:3]})
    return {"config": dataclasses.asdict(cfg), "deepspeed": missing or "ok", "rows": rows}


def _recipe(length: int, levers: list[str], out: Path, steps: int = 3) -> dict[str, Any]:
    """One run of the pretraining recipe at SP 2 on 2 processes: the largest rank's peak RSS and its tokens."""
    docs = max(2, length // 330)  # the shipped corpus averages about 283 tokens a document: about one row
    return recipe_peak("pretrain.py", ["--sp_size", "2", "--max_length", str(length), "--docs_per_step", str(docs),
                                       "--max_steps", str(steps), "--eval_docs", "0", "--no_final_model", *levers],
                       out)


def run_recipe_growth() -> dict[str, Any]:
    """Part 2 (module docstring): ``{variant: {"short", "long", "kb_per_token"}}``."""
    out: dict[str, Any] = {}
    variants = {"no levers": ["--no_chunked_loss"], "--gradient_checkpointing": ["--gradient_checkpointing"]}
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in variants.items():
            short, long = (_recipe(n, flags, Path(tmp) / f"{name[:4]}{n}") for n in RECIPE_LENGTHS)
            out[name] = {"short": short, "long": long, "kb_per_token": kb_per_token(short, long)}
    return out


def main(argv: Sequence[str]) -> Outcome:
    """Run both parts on the command line ``argv`` and write the results JSON (status 0)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks memory_levers", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, one round, no recipe runs")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--no-write-md", action="store_true", help="leave BENCHMARKS.md and the detail files alone")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cfg = LeversConfig().quick() if args.quick else LeversConfig()
    t0 = time.perf_counter()
    res: dict[str, Any] = {"levers": run_levers(cfg)}
    res["recipe"] = None if args.quick else run_recipe_growth()
    res["seconds"] = time.perf_counter() - t0
    res.update(stamp())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return Outcome(0, res, renders_pages(args.out, DEFAULT_OUT, args.no_write_md or args.quick))
