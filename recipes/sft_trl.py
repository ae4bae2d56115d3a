"""Supervised fine-tuning with TRL's ``SFTTrainer``, packing and HSAP sequence parallelism.

    accelerate launch --config_file accelerate_configs/cpu_4proc.yaml recipes/sft_trl.py \\
        --sp_size 4 --ulysses_size 2 --max_steps 10
    python recipes/sft_trl.py --sp_size 1 --max_steps 10                 # the same losses on one process
    python recipes/sft_trl.py --data_format messages                     # chat data, assistant-only loss

TRL packs the tokenized examples into rows of ``--max_length`` tokens (best-fit decreasing, padding-free);
``HSAPSFTTrainer`` shares each packed batch over the SP group and shards it (``SPDataLoader`` +
``shard_batch``), and the loss stays the exact global mean. The loss covers completions only
(``completion_only_loss`` for prompt/completion data, ``assistant_only_loss`` for chat data). A step trains on
``--rows_per_step`` packed rows whatever the number of processes (gradient accumulation makes up the rest).
Writes ``<output_dir>/metrics.jsonl`` (one record per optimizer step) and Trainer checkpoints; resuming
(``--resume_from_checkpoint``) skips the trained batches inside the SP loader (``HSAPTrainerMixin.train``).
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
from hf_hsap.data import load_sft_dataset  # noqa: E402
from hf_hsap.integrations import HSAPSFTTrainer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import SFTConfig  # noqa: E402

from common import (MetricsWriter, add_common_args, attention_flops, build_model, find_checkpoint,  # noqa: E402
                    finish_distributed, guess_peak_flops, init_sp, load_tokenizer, matmul_params, plan_options,
                    parse_common_args, peak_memory_gb)
from pretrain_data import split_train_eval  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (the common ones, see ``common.add_common_args``, plus SFT's own)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(p, default_lr=1e-3, default_max_length=512)
    p.add_argument("--data_format", default="prompt_completion", choices=["prompt_completion", "messages"],
                   help="prompt/completion pairs (default data/sft.jsonl) or chat messages (data/sft_chat.jsonl)")
    p.add_argument("--rows_per_step", type=int, default=8, help="packed rows in the global batch of one step")
    p.add_argument("--micro_batch_rows", type=int, default=1, help="packed rows per micro-batch")
    p.add_argument("--eval_samples", type=int, default=64, help="held-out examples for the eval loss")
    p.add_argument("--gradient_checkpointing", action="store_true")
    return parse_common_args(p, argv)


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
    (and eval_loss on evaluation steps). Every process runs it (it all-reduces the DP groups' counts)."""

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
            self.pending = {"step": state.global_step, "loss": logs["loss"], "lr": logs.get("learning_rate"),
                            "grad_norm": logs.get("grad_norm"), "epoch": logs.get("epoch"), **self.step_numbers}
            if state.is_world_process_zero:
                n = self.pending
                mfu = f"{n['mfu'] * 100:.2f}%" if n.get("mfu") is not None else "n/a"
                print(f"step {n['step']:>5}/{state.max_steps} | loss {n['loss']:.4f} | TGS {n.get('tgs', 0):,.0f} "
                      f"tok/s/device | MFU {mfu} | peak mem {n.get('peak_mem_gb', 0):.2f} GiB", flush=True)
        if "eval_loss" in logs and self.pending is not None:
            self.pending["eval_loss"] = logs["eval_loss"]

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.flush()

    def flush(self) -> None:
        """Write the pending record (eval results of a step arrive in a log call after its train loss)."""
        if self.pending is not None:
            self.writer.write(self.pending)
            self.pending = None


# Transformers 5 renamed gradient_checkpointing (deprecated alias until v6).
_CHECKPOINTING_FIELD = ("activation_checkpointing" if "activation_checkpointing" in SFTConfig.__dataclass_fields__
                        else "gradient_checkpointing")


def make_config(args: argparse.Namespace, dp_size: int) -> SFTConfig:
    """The SFTConfig: packing (BFD, padding-free), completion-only loss, the global batch split over DP."""
    per_step = args.micro_batch_rows * dp_size
    if args.rows_per_step % per_step:
        raise ValueError(f"--rows_per_step {args.rows_per_step} must be a multiple of --micro_batch_rows "
                         f"{args.micro_batch_rows} x dp_size {dp_size} (= world / sp_size)")
    cuda = torch.cuda.is_available()
    precision = ("bf16" if cuda else "no") if args.mixed_precision == "auto" else args.mixed_precision
    chat = args.data_format == "messages"
    return SFTConfig(
        output_dir=args.output_dir, max_steps=args.max_steps, seed=args.seed, data_seed=args.seed,
        per_device_train_batch_size=args.micro_batch_rows, per_device_eval_batch_size=args.micro_batch_rows,
        gradient_accumulation_steps=args.rows_per_step // per_step,
        learning_rate=args.learning_rate, lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": 0.1}, warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm, adam_beta2=0.95,
        packing=True, packing_strategy="bfd", max_length=args.max_length,
        completion_only_loss=None if chat else True, assistant_only_loss=chat,
        **{_CHECKPOINTING_FIELD: args.gradient_checkpointing},
        bf16=precision == "bf16", fp16=precision == "fp16", use_cpu=not cuda,
        logging_steps=1, report_to=[t for t in (args.report_to or "").split(",") if t] or "none",
        eval_strategy="steps" if args.eval_every else "no", eval_steps=args.eval_every or None,
        save_strategy="steps" if args.save_every else "no", save_steps=args.save_every or 500,
        dataloader_num_workers=0, dataset_num_proc=None, disable_tqdm=False,
    )


def run(args: argparse.Namespace) -> None:
    """Fine-tune (see the module docstring); the trainer is freed when it returns, the process groups are not."""
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())  # the process group, before the SP groups
    sp = init_sp(args)
    tokenizer = load_tokenizer(args.model, args.tokenizer)
    data = load_sft_dataset(args.dataset, format=args.data_format)
    if args.max_samples:
        data = data.select(range(min(args.max_samples, len(data))))
    train_rows, eval_rows = split_train_eval(len(data), args.eval_samples if args.eval_every else 0, args.seed)
    model = build_model(args.model, len(tokenizer), args.max_length, args.seed)
    ckpt = find_checkpoint(args.output_dir, args.resume_from_checkpoint)
    resume_step = json.loads((ckpt / "trainer_state.json").read_text())["global_step"] if ckpt else 0

    trainer = RecipeSFTTrainer(
        model=model, args=make_config(args, sp.dp_size), processing_class=tokenizer,
        train_dataset=data.select(train_rows), eval_dataset=data.select(eval_rows) if eval_rows else None,
        sp=sp, sp_placement=args.placement, sp_plan_options=plan_options(args),
    )
    writer = MetricsWriter(args.output_dir, state.is_main_process, resume_step=resume_step if ckpt else None)
    trainer.add_callback(MetricsCallback(trainer, writer, guess_peak_flops(trainer.accelerator.device,
                                                                           args.peak_tflops)))
    if state.is_main_process:
        print(f"[hf_hsap] SFT: world {state.num_processes} = dp {sp.dp_size} x sp {sp.size} (ulysses "
              f"{sp.ulysses_size} x ring {sp.ring_size}) | {args.data_format} | {len(train_rows)} train examples "
              f"| {args.rows_per_step} packed rows of {args.max_length} tokens per step"
              + (f" | resuming from {ckpt}" if ckpt else ""), flush=True)
    trainer.train(resume_from_checkpoint=str(ckpt) if ckpt else None)
    if not args.no_final_model:
        trainer.save_model(str(Path(args.output_dir) / "final_model"))


def main(argv: list[str] | None = None) -> None:
    """Run the recipe, then destroy the process groups (see ``common.finish_distributed``)."""
    run(parse_args(argv))
    finish_distributed()


if __name__ == "__main__":
    main()
