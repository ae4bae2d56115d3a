"""Worker functions for tests/model/test_sp_model.py: tiny HF models under HSAP sequence parallelism."""
from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from helpers import adopt_process_group, environ_kept

import hf_hsap
from hf_hsap.integrations import register, shard_batch

VOCAB = 61
# 11 documents, 1 token up to 40 (longer than a shard at SP = 4: 144 / 4 = 36)
DOC_LENS = [1, 3, 40, 2, 17, 1, 9, 24, 5, 1, 41]
_GROUPS: dict = {}  # per-process cache of SP groups (worker processes only)


def get_sp(sp_size: int, ulysses: int | str = 1, cost: dict | None = None) -> hf_hsap.SPGroup:
    """This process's SP group of that shape; ``ulysses="per_batch"`` groups plan with ``cost`` (CostModel fields)
    and the tiny models' 4 heads, the fastest degree by time alone (the memory cap off: its own test is
    tests/distributed/test_degree_memory_measured.py)."""
    key = (sp_size, ulysses, None if cost is None else tuple(sorted(cost.items())))
    if key not in _GROUPS:
        _GROUPS[key] = hf_hsap.init_sequence_parallel(hf_hsap.HSAPConfig(
            sp_size=sp_size, ulysses_size=ulysses, cost_model=None if cost is None else hf_hsap.CostModel(**cost),
            per_batch_memory_cap=False), num_heads=4 if ulysses == "per_batch" else None)
    return _GROUPS[key]


def make_model(kind: str, attn: str = "hsap", layers: int = 2) -> torch.nn.Module:
    """The same random tiny model of ``layers`` decoder layers on every process (seeded CPU init)."""
    register()
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                  num_attention_heads=4, max_position_embeddings=256, pad_token_id=0, tie_word_embeddings=False)
    config = LlamaConfig(num_key_value_heads=4, **common) if kind == "llama" else \
        Qwen2Config(num_key_value_heads=2, **common)  # GQA
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)
    return model.train()


def global_batch(lens: list[int] = DOC_LENS, seed: int = 1) -> dict[str, torch.Tensor]:
    """One packed row: input_ids / labels / position_ids ``[1, T]``, labels -100 at document starts."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (1, sum(lens)), generator=g)
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    labels = ids.clone()
    labels[pos == 0] = -100
    return {"input_ids": ids, "position_ids": pos, "labels": labels}


def loss_weights(total: int) -> torch.Tensor:
    """Fixed ``[T, V]`` weights of the per-token test loss ``sum(w * logits)``."""
    return torch.randn(total, VOCAB, generator=torch.Generator().manual_seed(2))


def documents_alone(kind: str, dtype: torch.dtype = torch.float32, weighted: bool = True) -> dict[str, Any]:
    """The reference: the model in eager attention on each document of :func:`global_batch` alone, in ``dtype``.

    Returns:
        ``{"logits": [T, V], "loss": sum(CE) / N, "n_items": N, "grads"}``, the gradients of the loss (plus
        ``sum(loss_weights * logits)`` with ``weighted``).
    """
    import torch.nn.functional as F

    model = make_model(kind, attn="eager").to(dtype)
    ids = global_batch()["input_ids"]
    pieces, ce_sum, start = [], 0.0, 0
    for n in DOC_LENS:
        doc = ids[:, start:start + n]
        logits = model(input_ids=doc, use_cache=False).logits[0]  # [n, V]
        ce_sum = ce_sum + F.cross_entropy(logits[:-1], doc[0, 1:], reduction="sum")
        pieces.append(logits)
        start += n
    logits = torch.cat(pieces)  # [T, V]
    n_items = ids.numel() - len(DOC_LENS)
    loss = ce_sum / n_items
    (loss + (logits * loss_weights(ids.numel()).to(dtype)).sum() if weighted else loss).backward()
    return {"logits": logits.detach(), "loss": loss.item(), "n_items": n_items,
            "grads": {k: p.grad.clone() for k, p in model.named_parameters()}}


def sp_forward_backward(kind: str, sp_size: int, ulysses: int | str = 1, placement: str = "auto",
                        cost: dict | None = None) -> dict[str, Any]:
    """Run the packed row under SP: local logits with their global indices, the model's loss, and every
    parameter's gradient summed over the SP group (of ``model.loss + sum(w * logits)``); ``ulysses="per_batch"``
    with ``cost``: the group's cost model, and the degree the batch ran at is in the result."""
    sp = get_sp(sp_size, ulysses, cost) if sp_size > 1 else sp_size
    model = make_model(kind)
    batch = global_batch()
    local = shard_batch(batch, sp, placement=placement)
    plan = local["hsap_plan"]
    idx = plan.local_token_indices(None if sp_size > 1 else 0)
    out = model(**local)
    w = loss_weights(batch["input_ids"].numel())[idx]  # [T_local, V]
    (out.loss + (out.logits[0] * w).sum()).backward()
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad.detach().clone()
        if sp_size > 1:
            dist.all_reduce(g, group=sp.group)
        grads[name] = g
    loss = out.loss.detach().clone()
    if sp_size > 1:
        dist.all_reduce(loss, group=sp.group)
    return {"index": idx, "logits": out.logits.detach()[0], "loss": float(loss), "grads": grads,
            "num_items": int(local["num_items_in_batch"]), "rank": getattr(sp, "rank", 0),
            "ulysses": plan.ulysses_size}


def all_ignored_and_refusals(sp_size: int) -> dict[str, Any]:
    """All labels -100 -> finite zero loss and zero gradients; refusals raise ValueError on every rank."""
    sp = get_sp(sp_size)
    model = make_model("llama")
    batch = global_batch()
    batch["labels"] = torch.full_like(batch["labels"], -100)
    out = model(**shard_batch(batch, sp))
    out.loss.backward()
    zero = all(float(p.grad.abs().max()) == 0.0 for p in model.parameters() if p.grad is not None)
    errors = {}
    bad = global_batch(seed=1 + dist.get_rank())  # different tokens on every rank
    for name, b in (("differ", bad),
                    ("padding", {**global_batch(), "attention_mask": torch.tensor([[1] * 143 + [0]])}),
                    ("no_layout", {"input_ids": global_batch()["input_ids"]})):
        try:
            shard_batch(b, sp)
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    return {"loss": out.loss.item(), "zero_grads": zero, "errors": errors}


def loader_order(sp_size: int, n_batches: int) -> dict[str, Any]:
    """SPDataLoader over a per-rank list of batches: what each rank yields, and the loader length."""
    from hf_hsap.integrations import SPDataLoader

    sp = get_sp(sp_size)
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = [global_batch([3, 5], seed=100 + i) for i in range(rank, n_batches, world)]  # interleaved by rank
    loader = SPDataLoader(mine, sp, check_previous=False)  # no forward runs on these batches
    seen = [int(b["num_items_in_batch"]) for b in loader]
    firsts = []
    for b in SPDataLoader(mine, sp, check_previous=False):
        full = b["hsap_plan"].gather(b["input_ids"][0])  # [T] global tokens back
        firsts.append(int(full[0]))
    return {"len": len(loader), "yielded": len(seen), "firsts": firsts}


@environ_kept  # a pool rank runs later tests: Trainer / Accelerate set launch variables
def sft_losses(sp_size: int, out_dir: str, steps: int = 3, **extra: Any) -> list[float]:
    """TRL SFTTrainer (packing, padding-free) for ``steps`` steps; the logged training losses (``extra``: more
    ``HSAPSFTConfig`` fields)."""
    from datasets import Dataset

    from hf_hsap.integrations import HSAPSFTConfig as SFTConfig

    from hf_hsap.integrations import HSAPSFTTrainer

    adopt_process_group(sp_size)  # Accelerate adopts the existing process group
    tokenizer = make_tokenizer()
    g = torch.Generator().manual_seed(5)
    lens = torch.randint(1, 40, (48,), generator=g).tolist()
    rows = [{"input_ids": torch.randint(3, VOCAB, (n,), generator=g).tolist()} for n in lens]
    args = SFTConfig(output_dir=out_dir, packing=True, max_length=96, per_device_train_batch_size=2,
                     max_steps=steps, logging_steps=1, learning_rate=1e-2, report_to=[], use_cpu=True,
                     save_strategy="no", seed=0, data_seed=0, dataloader_num_workers=0,
                     disable_tqdm=True, bf16=False, dataset_num_proc=None, **extra)
    trainer = HSAPSFTTrainer(model=make_model("llama"), args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tokenizer, sp=sp_size)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@environ_kept  # a pool rank runs later tests: Trainer / Accelerate set launch variables
def sft_logs(sp_size: int, out_dir: str, *, plain_trl: bool = False, steps: int = 3,
             **extra: Any) -> dict[str, Any]:
    """The training logs of :func:`sft_losses`'s run (loss, entropy, mean token accuracy, tokens per logged step),
    by ``HSAPSFTTrainer`` or, with ``plain_trl``, by TRL's own ``SFTTrainer`` on one process (its fused LM head,
    sdpa attention), and the class of the model's output embedding after training."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from hf_hsap.integrations import HSAPSFTConfig, HSAPSFTTrainer

    adopt_process_group(sp_size)
    g = torch.Generator().manual_seed(5)
    lens = torch.randint(1, 40, (48,), generator=g).tolist()
    rows = [{"input_ids": torch.randint(3, VOCAB, (n,), generator=g).tolist()} for n in lens]
    config_class = SFTConfig if plain_trl else HSAPSFTConfig
    args = config_class(output_dir=out_dir, packing=True, max_length=96, per_device_train_batch_size=2,
                        max_steps=steps, logging_steps=1, learning_rate=1e-2, report_to=[], use_cpu=True,
                        save_strategy="no", seed=0, data_seed=0, dataloader_num_workers=0, disable_tqdm=True,
                        bf16=False, dataset_num_proc=None, **extra)
    model = make_model("llama", attn="sdpa" if plain_trl else "hsap")
    kwargs = {} if plain_trl else {"sp": sp_size}
    trainer = (SFTTrainer if plain_trl else HSAPSFTTrainer)(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                                            processing_class=make_tokenizer(), **kwargs)
    trainer.train()
    keys = ("loss", "entropy", "mean_token_accuracy", "num_tokens")
    return {"logs": [{k: h[k] for k in keys} for h in trainer.state.log_history if "loss" in h],
            "head": type(model.get_output_embeddings()).__name__}


def make_tokenizer() -> Any:
    """A word-level tokenizer built in memory (no hub): ids 0 pad, 1 eos, 2 unk, 3.. words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def _trainer_rows(sp_size: int, seed: int, n: int) -> Any:
    """A Dataset of ``n`` random documents (1-49 tokens); under SP, the env vars Trainer's Accelerator
    reads to join the already initialised process group."""
    from datasets import Dataset

    adopt_process_group(sp_size)  # Accelerate adopts the existing process group
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 50, (n,), generator=g).tolist()
    return Dataset.from_list([{"input_ids": torch.randint(3, VOCAB, (k,), generator=g).tolist()} for k in lens])


@environ_kept  # a pool rank runs later tests: Trainer / Accelerate set launch variables
def trainer_resume_losses(sp_size: int, out_dir: str) -> dict[str, Any]:
    """HSAPTrainer: 4 steps with a checkpoint at step 2, then a fresh trainer resumed from it for steps 3-4."""
    from transformers import TrainingArguments

    from hf_hsap.data import PackingCollator
    from hf_hsap.integrations import HSAPTrainer

    rows = _trainer_rows(sp_size, seed=11, n=48)

    def run(resume: Any) -> list[float]:
        args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=4, max_steps=4, logging_steps=1,
                                 learning_rate=1e-2, report_to=[], use_cpu=True, save_strategy="steps", save_steps=2,
                                 seed=0, data_seed=0, disable_tqdm=True, remove_unused_columns=False)
        trainer = HSAPTrainer(model=make_model("qwen2"), args=args, train_dataset=rows,
                              data_collator=PackingCollator(max_length=64), sp=sp_size)
        trainer.train(resume_from_checkpoint=resume)
        first = 3 if resume else 1  # a resumed state carries the checkpoint's log history too
        return [h["loss"] for h in trainer.state.log_history if "loss" in h and h["step"] >= first]

    full = run(None)
    resumed = run(os.path.join(out_dir, "checkpoint-2"))
    return {"full": full, "resumed": resumed}


@environ_kept  # a pool rank runs later tests: Trainer / Accelerate set launch variables
def trainer_losses(sp_size: int, out_dir: str, steps: int = 3, **extra: Any) -> dict[str, Any]:
    """transformers Trainer (HSAPTrainer) with hf_hsap's PackingCollator: logged train losses and eval loss
    (``extra``: more ``HSAPTrainingArguments`` fields, e.g. the memory levers)."""
    from hf_hsap.data import PackingCollator
    from hf_hsap.integrations import HSAPTrainer
    from hf_hsap.integrations import HSAPTrainingArguments as TrainingArguments

    rows = _trainer_rows(sp_size, seed=7, n=40)
    args = TrainingArguments(output_dir=out_dir, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                             max_steps=steps, logging_steps=1, learning_rate=1e-2, report_to=[], use_cpu=True,
                             save_strategy="no", seed=0, data_seed=0, disable_tqdm=True,
                             remove_unused_columns=False, **extra)
    trainer = HSAPTrainer(model=make_model("qwen2"), args=args, train_dataset=rows, eval_dataset=rows.select(range(16)),
                          data_collator=PackingCollator(max_length=64), sp=sp_size)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"train": losses, "eval": trainer.evaluate()["eval_loss"]}
