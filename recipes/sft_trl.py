"""Supervised fine-tuning with TRL and HSAP: a thin wrapper of ``hsap-sft`` (:mod:`hf_hsap.cli.sft`).

    accelerate launch --config_file accelerate_configs/cpu_4proc.yaml recipes/sft_trl.py \
        --sp_size 4 --ulysses_size 2 --max_steps 10
    python recipes/sft_trl.py --sp_size 1 --max_steps 10                 # the same losses on one process
    python recipes/sft_trl.py --data_format messages                     # chat data, assistant-only loss

What this adds to ``hsap-sft`` (every other flag goes to it unchanged: any ``SFTConfig`` / ``TrainingArguments``
field, ``--hsap_*``, ``--config file.yaml``):

* ``--model``: a built-in config (``tiny-llama``, ...; random init, saved with the shipped tokenizer to
  ``<output_dir>/base_model``), a local directory or a Hub name;
* ``--dataset`` / ``--data_format`` / ``--max_samples`` / ``--eval_samples``: the shipped SFT sets (or a file),
  written as ``<output_dir>/data/{train,test}.jsonl`` with a seeded held-out split;
* ``--rows_per_step`` / ``--micro_batch_rows``: packed rows per optimizer step whatever the number of
  processes (gradient accumulation makes up the rest); ``--sp_size`` / ``--ulysses_size`` alias ``--hsap_*``;
* ``--eval_every`` / ``--save_every`` / ``--save_total_limit``, ``--resume_from_checkpoint latest`` (the newest
  complete checkpoint); SIGTERM / SIGUSR1 on any rank: every rank finishes the step, saves, exits with 75;
* ``<output_dir>/metrics.jsonl`` (one record per optimizer step: loss, lr, TGS, MFU, peak memory).

TRL packs the examples into rows of ``--max_length`` tokens (best-fit decreasing, padding-free); the loss covers
completions only (``completion_only_loss``; ``assistant_only_loss`` for chat data) and is the exact global mean.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))  # recipes/ helpers when launched as a script

import hf_hsap  # noqa: E402,F401  (registers the "hsap" attention)
from hf_hsap.checkpoint import PREEMPTED_EXIT_CODE  # noqa: E402
from hf_hsap.cli.sft import make_parser, run as run_sft  # noqa: E402
from hf_hsap.data import load_sft_dataset  # noqa: E402
from hf_hsap.examples import BUILTIN_MODELS, save_tiny_model, write_splits  # noqa: E402
from hf_hsap.integrations import HSAPSFTTrainer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from common import (MetricsWriter, attention_flops, finish_distributed, guess_peak_flops,  # noqa: E402
                    matmul_params, peak_memory_gb, positive_int, resolve_checkpoint)
from pretrain_data import split_train_eval  # noqa: E402


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The recipe's own flags, and the rest (for ``hsap-sft``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-llama", help=f"built-in ({', '.join(BUILTIN_MODELS)}), a directory or a Hub name")
    p.add_argument("--dataset", default=None, help="a prompt/completion or messages JSONL file (default: shipped)")
    p.add_argument("--data_format", default="prompt_completion", choices=["prompt_completion", "messages"])
    p.add_argument("--max_samples", type=int, default=None, help="use only the first N examples")
    p.add_argument("--eval_samples", type=int, default=64, help="held-out examples (with --eval_every)")
    p.add_argument("--rows_per_step", type=int, default=8, help="packed rows in the global batch of one step")
    p.add_argument("--micro_batch_rows", type=int, default=1, help="packed rows per micro-batch")
    p.add_argument("--sp_size", type=int, default=1, help="alias of --hsap_sp_size")
    p.add_argument("--ulysses_size", default=None,
                   help="alias of --hsap_ulysses_size (default: per_batch, the model's heads being known)")
    p.add_argument("--eval_every", type=int, default=0, help="evaluate every N steps (0 = never)")
    p.add_argument("--save_every", type=int, default=0, help="save a checkpoint every N steps (0 = never)")
    p.add_argument("--resume_from_checkpoint", default=None,
                   help="a checkpoint-<step> directory, or 'latest' (the newest complete one; none: start at 0)")
    p.add_argument("--save_total_limit", type=positive_int, default=None,
                   help="keep only the newest N complete checkpoints (default: all; the newest is never deleted)")
    p.add_argument("--output_dir", default="runs/sft")
    p.add_argument("--max_length", type=int, default=512)
    p.add_argument("--max_steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peak_tflops", type=float, default=None, help="peak TFLOP/s of a device, for MFU")
    return p.parse_known_args(argv)


class RecipeSFTTrainer(HSAPSFTTrainer):  # type: ignore[misc,valid-type]
    """``HSAPSFTTrainer`` plus step statistics for TGS / MFU (the SP-aware resume is the mixin's).

    Args:
        *args, **kwargs: ``HSAPSFTTrainer``'s arguments.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step_stats = torch.zeros(2, dtype=torch.int64)  # [tokens, sum of squared document lengths]

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        """Count the global batch's tokens and attention work (from its plan), then train on it."""
        plan = inputs.get("hsap_plan")
        if plan is not None:
            lens = torch.from_numpy(plan.layout.doc_lengths).to(torch.int64)
            self.step_stats += torch.stack([lens.sum(), (lens * lens).sum()])
        return super().training_step(model, inputs, num_items_in_batch)


class MetricsCallback(TrainerCallback):
    """Writes one ``metrics.jsonl`` record per optimizer step: loss, lr, grad_norm, TGS, MFU, peak memory
    (and eval_loss on evaluation steps), as soon as the step's last log arrived. Every process runs it (it
    all-reduces the DP groups' counts)."""

    def __init__(self, trainer: RecipeSFTTrainer, writer: MetricsWriter, peak_flops: float | None) -> None:
        self.trainer, self.writer, self.peak = trainer, writer, peak_flops
        model = trainer.accelerator.unwrap_model(trainer.model)
        self.config, self.n_matmul = model.config, matmul_params(model)
        self.t0 = time.perf_counter()
        self.pending: dict[str, Any] | None = None
        self.step_numbers: dict[str, float] = {}

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.t0 = time.perf_counter()
        self.trainer.step_stats.zero_()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        dt = time.perf_counter() - self.t0
        sp = self.trainer.sp
        stats = self.trainer.step_stats.clone()
        if sp.dp_size > 1:
            dist.all_reduce(stats, group=sp.dp_group)  # the SP ranks of a group saw the same global batches
        world = self.trainer.accelerator.num_processes
        flops = 6.0 * self.n_matmul * int(stats[0]) + attention_flops(self.config, int(stats[1]))
        self.step_numbers = {"tokens": int(stats[0]), "step_time_s": dt, "tgs": int(stats[0]) / dt / world,
                             "mfu": flops / dt / (world * self.peak) if self.peak else None,
                             "peak_mem_gb": peak_memory_gb(self.trainer.accelerator.device)}

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        logs = logs or {}
        if "loss" in logs:
            self.flush()
            n = {"step": state.global_step, "loss": logs["loss"], "lr": logs.get("learning_rate"),
                 "grad_norm": logs.get("grad_norm"), "epoch": logs.get("epoch"), **self.step_numbers}
            self.pending = n
            if not control.should_evaluate:  # nothing more comes for this step: on disk now (a crash keeps it)
                self.flush()
            if state.is_world_process_zero:
                mfu = f"{n['mfu'] * 100:.2f}%" if n.get("mfu") is not None else "n/a"
                print(f"step {n['step']:>5}/{state.max_steps} | loss {n['loss']:.4f} | TGS {n.get('tgs', 0):,.0f} "
                      f"tok/s/device | MFU {mfu} | peak mem {n.get('peak_mem_gb', 0):.2f} GiB", flush=True)
        if "eval_loss" in logs and self.pending is not None:
            self.pending["eval_loss"] = logs["eval_loss"]
            self.flush()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.flush()

    def flush(self) -> None:
        """Write the pending record (eval results of a step arrive in a log call after its train loss)."""
        if self.pending is not None:
            self.writer.write(self.pending)
            self.pending = None


def hsap_sft_argv(args: argparse.Namespace, rest: list[str], model: str, data: str, world: int) -> list[str]:
    """The ``hsap-sft`` command line: the recipe's defaults first, then the user's flags (the last one wins)."""
    both = [f for f in ("--hsap_sp_size", "--hsap_ulysses_size") if any(a.split("=")[0] == f for a in rest)]
    if both:
        raise ValueError(f"pass {both[0].replace('hsap_', '')} to the recipe (its batch arithmetic uses it), not {both[0]}")
    dp_size = world // args.sp_size
    per_step = args.micro_batch_rows * dp_size
    if args.rows_per_step % per_step:
        raise ValueError(f"--rows_per_step {args.rows_per_step} must be a multiple of --micro_batch_rows "
                         f"{args.micro_batch_rows} x dp_size {dp_size} (= world / sp_size)")
    chat = args.data_format == "messages"
    cuda = torch.cuda.is_available()
    argv = [
        "--model_name_or_path", model, "--dataset_name", data, "--output_dir", args.output_dir,
        "--max_steps", str(args.max_steps), "--seed", str(args.seed), "--data_seed", str(args.seed),
        "--max_length", str(args.max_length), "--packing", "--packing_strategy", "bfd",
        "--per_device_train_batch_size", str(args.micro_batch_rows),
        "--per_device_eval_batch_size", str(args.micro_batch_rows),
        "--gradient_accumulation_steps", str(args.rows_per_step // per_step),
        "--learning_rate", "1e-3", "--lr_scheduler_type", "cosine_with_min_lr",
        "--lr_scheduler_kwargs", json.dumps({"min_lr_rate": 0.1}), "--warmup_steps", str(max(1, args.max_steps // 10)),
        "--weight_decay", "0.1", "--adam_beta2", "0.95", "--logging_steps", "1", "--report_to", "none",
        "--bf16", str(cuda), "--use_cpu", str(not cuda), "--dataloader_num_workers", "0",
        "--hsap_sp_size", str(args.sp_size),
        *(["--hsap_ulysses_size", str(args.ulysses_size)] if args.ulysses_size is not None else []),
        *(["--assistant_only_loss", "true"] if chat else ["--completion_only_loss", "true"]),
        *(["--eval_strategy", "steps", "--eval_steps", str(args.eval_every)] if args.eval_every else []),
        *(["--save_strategy", "steps", "--save_steps", str(args.save_every)] if args.save_every
          else ["--save_strategy", "no"]),
        *(["--save_total_limit", str(args.save_total_limit)] if args.save_total_limit else []),
    ]
    ckpt = resolve_checkpoint(args.output_dir, args.resume_from_checkpoint)
    if ckpt is not None:
        argv += ["--resume_from_checkpoint", str(ckpt)]
    return argv + rest


def prepare_inputs(args: argparse.Namespace, main_process: bool) -> tuple[str, str]:
    """The model directory (a built-in model saved once) and the data directory (train / test split)."""
    out = Path(args.output_dir)
    model = args.model
    if main_process:
        if model in BUILTIN_MODELS:
            save_tiny_model(out / "base_model", model, seed=args.seed, max_length=args.max_length)
        data = load_sft_dataset(args.dataset, format=args.data_format)
        if args.max_samples:
            data = data.select(range(min(args.max_samples, len(data))))
        train, test = split_train_eval(len(data), args.eval_samples if args.eval_every else 0, args.seed)
        write_splits(out / "data", {"train": data.select(train), "test": data.select(test)})
    return (str(out / "base_model") if model in BUILTIN_MODELS else model), str(out / "data")


def main(argv: list[str] | None = None) -> None:
    """Prepare the model and data, then run ``hsap-sft`` with the metrics callback (see the module docstring)."""
    from accelerate import PartialState

    args, rest = parse_args(argv)
    state = PartialState(cpu=not torch.cuda.is_available())  # the process group, before the SP groups
    with state.main_process_first():
        model, data = prepare_inputs(args, state.is_main_process)
    parsed = make_parser().parse_args_and_config(
        args=hsap_sft_argv(args, rest, model, data, state.num_processes), fail_with_unknown_args=True)
    ckpt = parsed[1].resume_from_checkpoint
    resume_step = json.loads((Path(ckpt) / "trainer_state.json").read_text())["global_step"] if ckpt else None
    writer = MetricsWriter(args.output_dir, state.is_main_process, resume_step=resume_step)

    def metrics(trainer: Any) -> MetricsCallback:
        return MetricsCallback(trainer, writer, guess_peak_flops(trainer.accelerator.device, args.peak_tflops))

    if state.is_main_process:
        print(f"[hf_hsap] SFT: world {state.num_processes}, sp {args.sp_size} | {args.data_format} | "
              f"{args.rows_per_step} packed rows of {args.max_length} tokens per step"
              + (f" | resuming from {ckpt}" if ckpt else ""), flush=True)
    trainer = run_sft(*parsed, callbacks=[metrics], trainer_class=RecipeSFTTrainer)
    finish_distributed()
    if trainer.hsap_preempted:
        sys.exit(PREEMPTED_EXIT_CODE)


if __name__ == "__main__":
    main()
