"""Pretraining with HSAP sequence parallelism on packed rows: an Accelerate training loop.

    accelerate launch --config_file accelerate_configs/cpu_4proc.yaml recipes/pretrain.py \\
        --sp_size 4 --ulysses_size 2 --max_steps 30
    python recipes/pretrain.py --sp_size 1 --max_steps 30          # the same losses on one process

One optimizer step trains on ``--docs_per_step`` documents, whatever the number of processes: they are dealt
to the DP groups (world / sp_size) and to ``--grad_accum`` micro-batches, each packed into rows of
``--max_length`` tokens and sharded over the SP group by ``shard_batch`` (see ``pretrain_data.py``). The loss
is the exact global mean: every rank scales ``sum(local CE) / N_step`` by the world size W and DDP / FSDP
average the gradients over W. Writes ``<output_dir>/metrics.jsonl`` (one record per step: loss, lr,
grad_norm, TGS, MFU, the largest rank's peak memory, and eval_loss on evaluation steps) and
``checkpoint-<step>/`` (model, optimizer, scheduler, RNG states, data position) for ``--resume_from_checkpoint``.

Memory levers (``--gradient_checkpointing`` with ``--checkpoint_layers``, ``--activation_offloading`` with
``--layers_kept_on_device``, ``--tiled_mlp``, ``--recompute_norms``, ``--tiled_attention``; the loss is computed in
tiles unless ``--no_chunked_loss``): :mod:`hf_hsap.memory`; a ``--max_length`` whose modelled step
does not fit the device is refused before the first step, naming the levers that would make it fit.

Engines: the Accelerate config chooses DDP, FSDP2 or DeepSpeed ZeRO, with the weights and optimizer states offloaded
to host memory by ``accelerate_configs/deepspeed_zero3_offload{,_optimizer}_8.yaml`` / ``fsdp2_offload_8.yaml``
(docs/long-rows.md, Offload); what DeepSpeed needs from a loop like this one is in ``engines.py``.

Checkpoints are atomic (:mod:`hf_hsap.checkpoint`): one counts only once every rank has written it, so
``--resume_from_checkpoint latest`` never picks a save that a kill or a full disk cut short. SIGTERM or SIGUSR1
on any rank makes every rank finish the step, save ``checkpoint-<step>`` and exit with status 75
(``PREEMPTED_EXIT_CODE``); resuming from it logs the losses of the uninterrupted run.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accelerate.utils import send_to_device
from tqdm.auto import tqdm
from transformers import get_cosine_with_min_lr_schedule_with_warmup

sys.path.insert(0, str(Path(__file__).resolve().parent))  # recipes/ helpers when launched as a script

import hf_hsap  # noqa: E402,F401  (registers the "hsap" attention)
from hf_hsap.checkpoint import PREEMPTED_EXIT_CODE, PreemptionHandler, atomic_save, rotate  # noqa: E402
from hf_hsap.data import PackingCollator, load_pretrain_corpus, tokenize_corpus  # noqa: E402
from hf_hsap.integrations import dp_grad_scale, hsap_model_loss, reduce_loss_for_logging, shard_batch  # noqa: E402

from common import (BUILTIN_MODELS, MetricsWriter, add_common_args, add_memory_args, attention_flops,  # noqa: E402
                    build_model, check_row_fits, finish_distributed, guess_peak_flops, init_sp, load_tokenizer,
                    matmul_params, memory_levers, n_params, parse_common_args, peak_memory_gb, resolve_checkpoint)
from engines import (backward_kwargs, deepspeed_launch, fill_deepspeed_config, micro_batch_context,  # noqa: E402
                     random_init_context, scheduled_optimizer)
from pretrain_data import StepData, deal_documents, split_train_eval  # noqa: E402

STATE_FILE = "hsap_state.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line arguments (the common ones, see ``common.add_common_args``, plus the loop's own)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(p, default_lr=3e-3, default_max_length=512)
    p.add_argument("--text_field", default="text", help="text column of the dataset")
    p.add_argument("--docs_per_step", type=int, default=16, help="documents in the global batch of one step")
    p.add_argument("--grad_accum", type=int, default=1, help="micro-batches per DP group per step")
    p.add_argument("--pad_to_multiple_of", type=int, default=8, help="row length rounding of the collator")
    p.add_argument("--eval_docs", type=int, default=64, help="held-out documents for the eval loss")
    p.add_argument("--min_lr_ratio", type=float, default=0.1, help="cosine decay floor, as a fraction of the lr")
    p.add_argument("--log_every", type=int, default=1, help="print a log line every N steps")
    add_memory_args(p)
    return parse_common_args(p, argv)


def make_accelerator(args: argparse.Namespace) -> Any:
    """The Accelerator: CPU + gloo without CUDA, bf16 autocast on GPU (``--mixed_precision auto``); under a DeepSpeed
    config DeepSpeed picks the device and counts the ``--grad_accum`` micro-batches (``engines.py``)."""
    from accelerate import Accelerator

    cuda, deepspeed = torch.cuda.is_available(), deepspeed_launch()
    precision = ("bf16" if cuda else "no") if args.mixed_precision == "auto" else args.mixed_precision
    trackers = [t for t in (args.report_to or "").split(",") if t and t != "none"]
    return Accelerator(cpu=not cuda and not deepspeed, mixed_precision=precision, log_with=trackers or None,
                       project_dir=args.output_dir, gradient_accumulation_steps=args.grad_accum if deepspeed else 1)


def make_optimizer(model: torch.nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    """AdamW, no weight decay on norms and biases (by the parameters' full shapes: ZeRO-3 may have partitioned
    them at construction)."""
    matrix = [len(getattr(p, "ds_shape", p.shape)) >= 2 for p in model.parameters()]
    decay = [p for p, m in zip(model.parameters(), matrix) if p.requires_grad and m]
    no_decay = [p for p, m in zip(model.parameters(), matrix) if p.requires_grad and not m]
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.learning_rate, betas=(0.9, 0.95), eps=1e-8)


def make_scheduler(optimizer: torch.optim.Optimizer, args: argparse.Namespace) -> Any:
    """The warm-up + cosine schedule of ``optimizer``'s learning rate (the one the engine steps:
    ``engines.scheduled_optimizer``)."""
    return get_cosine_with_min_lr_schedule_with_warmup(optimizer, args.warmup_steps, args.max_steps,
                                                       min_lr_rate=args.min_lr_ratio)


def save_checkpoint(accelerator: Any, args: argparse.Namespace, step: int) -> Path:
    """Model, optimizer, scheduler and RNG states (Accelerate) plus the data position, complete only once every
    rank has written its files (:func:`hf_hsap.checkpoint.atomic_save`); then ``--save_total_limit``
    (collective)."""
    path = Path(args.output_dir) / f"checkpoint-{step}"
    with atomic_save(path, step, is_main=accelerator.is_main_process):
        accelerator.save_state(str(path))
        if accelerator.is_main_process:
            state = {"step": step, "docs_consumed": step * args.docs_per_step, "seed": args.seed,
                     "docs_per_step": args.docs_per_step, "max_length": args.max_length,
                     "dataset": args.dataset, "max_samples": args.max_samples, "eval_docs": args.eval_docs}
            (path / STATE_FILE).write_text(json.dumps(state, indent=1))
    if accelerator.is_main_process:
        rotate(args.output_dir, args.save_total_limit)
    return path


def load_checkpoint(accelerator: Any, args: argparse.Namespace, path: Path) -> int:
    """Restore a checkpoint; returns its step. Refuses one whose data order differs from this run's."""
    state = json.loads((path / STATE_FILE).read_text())
    for key in ("seed", "docs_per_step", "max_length", "dataset", "max_samples", "eval_docs"):
        if state[key] != getattr(args, key):
            raise ValueError(f"checkpoint {path} was trained with --{key} {state[key]}, this run has "
                             f"{getattr(args, key)}; the data position would not match: pass the same value")
    accelerator.load_state(str(path))
    return int(state["step"])


# The model inputs of a sharded batch (the targets stay out: the recipe computes the loss itself); under SP
# hsap_plan_use is the record each attention layer fills (checked by hsap_model_loss).
MODEL_INPUTS = ("input_ids", "position_ids", "hsap_plan", "use_cache", "hsap_plan_use")


def to_device(local: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The model inputs of a sharded batch, on ``device`` (the plan stays a host object)."""
    return send_to_device({k: local[k] for k in MODEL_INPUTS if k in local}, device)


def batch_loss(model: torch.nn.Module, local: dict[str, Any], n: Any, scale: float, sp: Any,
               accelerator: Any) -> torch.Tensor:
    """``scale * sum(local CE) / n`` of one sharded batch (:func:`hsap_model_loss`: through the chunked LM head, the
    logits never whole, unless ``--no_chunked_loss``)."""
    with accelerator.autocast():
        return hsap_model_loss(model, {**to_device(local, accelerator.device), "shift_labels": local["shift_labels"]},
                               n, grad_scale=scale, sp=sp)


def eval_batches(data: StepData, eval_rows: list[int], sp: Any) -> list[dict[str, Any]]:
    """This DP group's packed eval batches: chunks of ``docs_per_step`` held-out documents, dealt over DP."""
    if not eval_rows:
        return []
    if len(eval_rows) < sp.dp_size:
        raise ValueError(f"--eval_docs={len(eval_rows)} is fewer than the {sp.dp_size} DP groups")
    size = max(data.docs_per_step, sp.dp_size)
    chunks = [eval_rows[i:i + size] for i in range(0, len(eval_rows), size)]
    if len(chunks) > 1 and len(chunks[-1]) < sp.dp_size:
        chunks[-2] += chunks.pop()  # every DP group needs a document in every chunk (same number of forwards)
    out = []
    for chunk in chunks:
        docs = data.dataset[chunk]["input_ids"]
        mine = deal_documents([len(d) for d in docs], sp.dp_size)[sp.dp_rank]
        out.append(data.collator([{"input_ids": docs[i]} for i in sorted(mine)]))
    return out


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[dict[str, Any]], sp: Any, accelerator: Any,
             args: argparse.Namespace) -> float:
    """Mean next-token loss over all held-out targets (collective over the world)."""
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64)  # [sum of CE, targets]
    for batch in batches:
        local = shard_batch(batch, sp, verify=False)  # plans with sp.config
        totals[0] += float(batch_loss(model, local, 1, 1.0, sp, accelerator))
        if sp.rank == 0:  # the count is of the global batch, the same on every SP rank: add it once
            totals[1] += int(local["num_items_in_batch"])
    model.train()
    if dist.is_initialized():
        dist.all_reduce(totals)
    return float(totals[0] / totals[1].clamp_min(1))


def train_step(model: torch.nn.Module, micro: list[Any], sp: Any, accelerator: Any,
               args: argparse.Namespace, verify: bool, offload: Any = nullcontext) -> dict[str, float]:
    """Forward + backward of one step's micro-batches; returns the global loss and the step's counts."""
    counts = torch.tensor([sum(m.targets for m in micro), sum(m.tokens for m in micro),
                           sum(m.sum_sq for m in micro)], dtype=torch.int64)
    if sp.dp_size > 1:
        dist.all_reduce(counts, group=sp.dp_group)  # the whole step's targets, tokens, sum(len^2)
    n_targets = int(counts[0])
    scale = dp_grad_scale(sp)  # W: DDP / FSDP / DeepSpeed average gradients over all ranks
    loss_sum = torch.zeros((), dtype=torch.float32, device=accelerator.device)
    for i, m in enumerate(micro):
        local = shard_batch(m.batch, sp, verify=verify)
        with micro_batch_context(accelerator, model, last=i == len(micro) - 1), offload():
            loss = batch_loss(model, local, n_targets, scale, sp, accelerator)
            accelerator.backward(loss, **backward_kwargs(accelerator))
        loss_sum += loss.detach()
    return {"loss": reduce_loss_for_logging(loss_sum, sp, grad_scale=scale), "targets": n_targets,
            "tokens": int(counts[1]), "sum_sq": int(counts[2])}


def largest_rank(value: float, device: torch.device) -> float:
    """The largest ``value`` over the world's ranks (collective; the value itself in one process)."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def run(args: argparse.Namespace) -> int:
    """Train (see the module docstring); the model is freed when it returns, the process groups are not.

    Returns:
        The exit status: 0, or ``PREEMPTED_EXIT_CODE`` when a signal stopped the run after a checkpoint.
    """
    accelerator = make_accelerator(args)
    sp = init_sp(args)
    world = accelerator.num_processes
    main_proc = accelerator.is_main_process

    tokenizer = load_tokenizer(args.model, args.tokenizer)
    with accelerator.main_process_first():  # the main process fills the datasets cache, the others read it
        corpus = load_pretrain_corpus(args.dataset, text_field=args.text_field)
        if args.max_samples:
            corpus = corpus.select(range(min(args.max_samples, len(corpus))))
        dataset = tokenize_corpus(corpus, tokenizer)
    train_rows, eval_rows = split_train_eval(len(dataset), args.eval_docs, args.seed)
    collator = PackingCollator(max_length=args.max_length, pad_to_multiple_of=args.pad_to_multiple_of,
                               pad_token_id=tokenizer.pad_token_id)
    data = StepData(dataset, train_rows, args.docs_per_step, collator, args.seed)
    if args.docs_per_step < sp.dp_size * args.grad_accum:
        raise ValueError(f"--docs_per_step {args.docs_per_step} < dp_size {sp.dp_size} x grad_accum {args.grad_accum}")

    with random_init_context(accelerator, random_init=args.model in BUILTIN_MODELS):
        model = build_model(args.model, len(tokenizer), args.max_length, args.seed)
    # the one step that changes the model (recurrent layers, plan relay, memory levers), before accelerator.prepare
    # (DDP / FSDP wrap what it did); it refuses before the first step what "hsap" cannot run exactly
    offload = hf_hsap.prepare_model(model, sp_size=sp.size, levers=memory_levers(args)).offload
    check_row_fits(args, model.config, sp, accelerator)  # ... and a row that cannot fit, naming the lever that would
    config, n_matmul = model.config, matmul_params(model)
    optimizer = make_optimizer(model, args)
    fill_deepspeed_config(accelerator, grad_accum=args.grad_accum, max_grad_norm=args.max_grad_norm)
    model, prepared = accelerator.prepare(model, optimizer)
    scheduler = make_scheduler(scheduled_optimizer(accelerator, model, optimizer), args)
    optimizer = prepared
    accelerator.register_for_checkpointing(scheduler)  # not prepared: Accelerate would step it once per process

    start_step = 0
    ckpt = resolve_checkpoint(args.output_dir, args.resume_from_checkpoint)
    if ckpt is not None:
        start_step = load_checkpoint(accelerator, args, ckpt)
    metrics = MetricsWriter(args.output_dir, main_proc, resume_step=start_step if ckpt is not None else None)
    if args.report_to:
        accelerator.init_trackers("hf_hsap_pretrain", config={k: v for k, v in vars(args).items()
                                                              if isinstance(v, (int, float, str, bool))})
    peak = guess_peak_flops(accelerator.device, args.peak_tflops)
    evals = eval_batches(data, eval_rows, sp)
    if main_proc:
        print(f"[hf_hsap] {accelerator.distributed_type.value} world {world} = dp {sp.dp_size} x sp {sp.size} "
              f"(ulysses {sp.ulysses_size} x ring {sp.ring_size}) | {accelerator.device} "
              f"{accelerator.mixed_precision} | model {args.model} "
              f"{n_params(model.parameters()) / 1e6:.2f}M params | {len(train_rows)} train / "
              f"{len(eval_rows)} eval docs | {args.docs_per_step} docs/step, max_length {args.max_length} | "
              f"memory levers: {', '.join(memory_levers(args).names) or 'none'}"
              + (f" | resumed from {ckpt} at step {start_step}" if ckpt is not None else ""), flush=True)

    bar = tqdm(total=args.max_steps, initial=start_step, desc="pretrain", dynamic_ncols=True,
               disable=None if main_proc else True)  # None: a bar on a terminal, plain log lines otherwise
    first_loss, tgs_seen, preempted = None, [], False
    with PreemptionHandler() as preemption:  # SIGTERM / SIGUSR1: finish the step, save, exit 75
        for step in range(start_step, args.max_steps):
            t0 = time.perf_counter()
            micro = data.micro_batches(step, sp.dp_size, sp.dp_rank, args.grad_accum)
            out = train_step(model, micro, sp, accelerator, args, verify=step == start_step, offload=offload)
            grad_norm = None
            if args.max_grad_norm > 0:
                norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)  # DeepSpeed: its step's
                grad_norm = None if norm is None else float(norm)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            flops = 6.0 * n_matmul * out["tokens"] + attention_flops(config, out["sum_sq"])
            tgs = out["tokens"] / dt / world
            record: dict[str, Any] = {
                "step": step + 1, "loss": out["loss"], "lr": lr, "grad_norm": grad_norm,
                "epoch": round(data.epoch_of(step), 4), "tokens": out["tokens"], "targets": out["targets"],
                "step_time_s": dt, "tgs": tgs, "mfu": flops / dt / (world * peak) if peak else None,
                "peak_mem_gb": largest_rank(peak_memory_gb(accelerator.device), accelerator.device),
            }
            if args.eval_every and ((step + 1) % args.eval_every == 0 or step + 1 == args.max_steps):
                record["eval_loss"] = evaluate(model, evals, sp, accelerator, args)
            first_loss = out["loss"] if first_loss is None else first_loss
            tgs_seen.append(tgs)
            metrics.write(record)
            if args.report_to:
                accelerator.log({k: v for k, v in record.items() if v is not None and k != "step"}, step=step + 1)
            bar.update(1)
            bar.set_postfix(loss=f"{out['loss']:.4f}", tgs=f"{tgs:.0f}")
            if main_proc and ((step + 1) % args.log_every == 0 or step + 1 == args.max_steps):
                mfu = f"{record['mfu'] * 100:.2f}%" if record["mfu"] is not None else "n/a"
                ev = f" | eval {record['eval_loss']:.4f}" if "eval_loss" in record else ""
                bar.write(f"step {step + 1:>5}/{args.max_steps} | loss {out['loss']:.4f}{ev} | lr {lr:.2e} | "
                          f"grad_norm {grad_norm if grad_norm is None else round(grad_norm, 3)} | TGS {tgs:,.0f} "
                          f"tok/s/device | MFU {mfu} | peak mem {record['peak_mem_gb']:.2f} GiB")
            saved = args.save_every and (step + 1) % args.save_every == 0
            if saved:
                save_checkpoint(accelerator, args, step + 1)
            if preemption.should_stop(device=accelerator.device):  # every rank, every step: they stop together
                if not saved:
                    save_checkpoint(accelerator, args, step + 1)
                preempted = step + 1 < args.max_steps
                if main_proc and preempted:
                    bar.write(f"[hf_hsap] preempted: saved checkpoint-{step + 1}; exiting with status "
                              f"{PREEMPTED_EXIT_CODE} (resume with --resume_from_checkpoint latest)")
                break
    bar.close()

    if not args.no_final_model and not preempted:
        accelerator.wait_for_everyone()
        final = Path(args.output_dir) / "final_model"
        accelerator.unwrap_model(model).save_pretrained(
            final, is_main_process=main_proc, save_function=accelerator.save,
            state_dict=accelerator.get_state_dict(model))
        if main_proc:
            tokenizer.save_pretrained(final)
    if main_proc and tgs_seen and not preempted:
        steady = tgs_seen[1:] or tgs_seen
        print(f"[hf_hsap] done: loss {first_loss:.4f} (first step of this run) -> {out['loss']:.4f} (step "
              f"{args.max_steps}); mean TGS {sum(steady) / len(steady):,.0f} tokens/s/device; metrics in "
              f"{metrics.path}", flush=True)
    for tracker in accelerator.trackers:  # not accelerator.end_training(): see common.finish_distributed
        tracker.finish()
    return PREEMPTED_EXIT_CODE if preempted else 0


def main(argv: list[str] | None = None) -> None:
    """Run the recipe, then destroy the process groups (see ``common.finish_distributed``); exit with
    ``PREEMPTED_EXIT_CODE`` (75) after a preemption."""
    status = run(parse_args(argv))
    finish_distributed()
    if status:
        sys.exit(status)


if __name__ == "__main__":
    main()
