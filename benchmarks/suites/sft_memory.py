"""The SFT recipe's peak resident memory per rank between a short and a long row, beside the pretraining recipe's:
what hf_hsap's chunked loss saves against TRL's fused LM head in ``HSAPSFTTrainer``.

Every variant runs on the same tiny Llama with a 49,152-token vocabulary (built once in a temporary folder, with the
shipped tokenizer), SP 2 on 2 CPU processes, ``--gradient_checkpointing``, rows of 4,096 and 16,384 tokens:

* ``pretrain``: ``recipes/pretrain.py`` (hf_hsap's chunked loss, its default);
* ``sft chunked loss``: ``recipes/sft_trl.py`` with hf_hsap's chunked loss (``--hsap_chunked_loss``, the default);
* ``sft TRL fused head``: ``recipes/sft_trl.py --hsap_chunked_loss false``: TRL's fused LM head, the loss path TRL's
  own ``SFTTrainer`` runs.

Each records the largest rank's peak resident set at both lengths (:func:`benchmarks.suites.recipe_runs.recipe_peak`),
its growth in KB per token per rank and the loss of every step; the two SFT variants must give the same losses
(:data:`LOSS_RTOL`; status 1 when they do not).

Usage: ``python -m benchmarks sft_memory [--quick] [--out benchmarks/results/sft_memory.json] [--no-write-md]``
(``python -m benchmarks memory`` runs it too). Writes the results JSON; the entry point then (unless ``--quick`` or
``--no-write-md``) renders the pages from it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..analytic.memory import SFT_CHUNKED, SFT_PRETRAIN, SFT_TRL, SFT_VARIANTS
from .output import RESULTS, Outcome, command_line, renders_pages, stamp
from .recipe_runs import PROCESSES, kb_per_token, recipe_peak

__all__ = ["DEFAULT_OUT", "LOSS_RTOL", "SftMemoryConfig", "build_model", "loss_check", "main", "recipe_args",
           "run_sft_memory"]

DEFAULT_OUT = RESULTS / "sft_memory.json"
LOSS_RTOL = 1e-5  # the two SFT loss paths, step by step (relative)


@dataclass(frozen=True)
class SftMemoryConfig:
    """What :func:`run_sft_memory` measures.

    Attributes:
        lengths: the short and the long row (tokens). vocab: the model's vocabulary. model: the built-in shape.
        steps: optimizer steps per run. rows_per_step: the SFT recipe's packed rows per step.
    """

    lengths: tuple[int, int] = (4096, 16384)
    vocab: int = 49152
    model: str = "tiny-llama"
    steps: int = 3
    rows_per_step: int = 2

    def quick(self) -> "SftMemoryConfig":
        """Short rows for a smoke run."""
        return dataclasses.replace(self, lengths=(512, 1024), steps=2)


def build_model(path: Path, cfg: SftMemoryConfig) -> Path:
    """Save the built-in model with ``cfg.vocab`` tokens (random init, seed 0, float32) and the shipped tokenizer.

    Args:
        path: the folder. cfg: the config.

    Returns:
        ``path``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_hsap.data import tokenizer_path
    from hf_hsap.examples import builtin_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(builtin_config(cfg.model, cfg.vocab, max(cfg.lengths)),
                                             dtype=torch.float32)
    model.save_pretrained(str(path))
    AutoTokenizer.from_pretrained(str(tokenizer_path())).save_pretrained(str(path))
    return path


def recipe_args(variant: str, length: int, model: Path, cfg: SftMemoryConfig) -> tuple[str, list[str]]:
    """The recipe and its arguments for one variant at one row length."""
    common = ["--sp_size", str(PROCESSES), "--max_length", str(length), "--max_steps", str(cfg.steps), "--model",
              str(model), "--gradient_checkpointing"]
    if variant == SFT_PRETRAIN:
        docs = max(2, length // 330)  # the shipped corpus averages about 283 tokens a document: about one row
        return "pretrain.py", [*common, "--docs_per_step", str(docs), "--eval_docs", "0", "--no_final_model"]
    sft = [*common, "--rows_per_step", str(cfg.rows_per_step)]
    return "sft_trl.py", sft + (["--hsap_chunked_loss", "false"] if variant == SFT_TRL else [])


def loss_check(a: list[float], b: list[float]) -> dict[str, Any]:
    """Whether two runs' losses agree step by step within :data:`LOSS_RTOL`."""
    err = max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=float("inf"))
    return {"max_rel_err": err, "ok": len(a) == len(b) and err <= LOSS_RTOL}


def run_sft_memory(cfg: SftMemoryConfig) -> dict[str, Any]:
    """Measure every variant (module docstring).

    Args:
        cfg: the config.

    Returns:
        ``{"config", "processes", "variants": {name: {"short", "long", "kb_per_token"}}, "same_losses": {length:
        {"max_rel_err", "ok"}}}`` (``short`` / ``long``: :func:`recipe_peak`'s records).
    """
    variants: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model", cfg)
        for i, name in enumerate(SFT_VARIANTS):
            short, long = (recipe_peak(*recipe_args(name, n, model, cfg), Path(tmp) / f"run{i}_{n}") for n in cfg.lengths)
            variants[name] = {"short": short, "long": long, "kb_per_token": kb_per_token(short, long)}
    same = {str(n): loss_check(variants[SFT_CHUNKED][k]["loss"], variants[SFT_TRL][k]["loss"])
            for n, k in zip(cfg.lengths, ("short", "long"))}
    return {"config": dataclasses.asdict(cfg), "processes": PROCESSES, "variants": variants, "same_losses": same}


def main(argv: Sequence[str]) -> Outcome:
    """Measure on the command line ``argv`` and write the results JSON (status 1 when the SFT losses differ)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks sft_memory", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="rows of 512 and 1,024 tokens; BENCHMARKS.md and the detail files left alone")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--no-write-md", action="store_true", help="leave BENCHMARKS.md and the detail files alone")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cfg = SftMemoryConfig().quick() if args.quick else SftMemoryConfig()
    t0 = time.perf_counter()
    res = run_sft_memory(cfg)
    res["seconds"] = time.perf_counter() - t0
    res["command"] = command_line("sft_memory", argv)
    res.update(stamp())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    status = 0 if all(c["ok"] for c in res["same_losses"].values()) else 1
    return Outcome(status, res, renders_pages(args.out, DEFAULT_OUT, args.no_write_md or args.quick))
