"""Worker functions for tests/model/test_hybrid_sft.py: TRL SFT of a tiny Qwen3.5 text model (gated delta rule
layers beside full attention) on a generated plain-text set with ``packing=True`` through ``HSAPSFTTrainer``, at
one process and under SP."""
from __future__ import annotations

from typing import Any

import torch

from hf_hsap.model_state import MIXERS, state_of
from helpers import adopt_process_group, environ_kept
from workers.sp_model import VOCAB, make_tokenizer

FAMILY = "qwen3_5_text"


@environ_kept
def hybrid_sft_losses(sp_size: int, out_dir: str, ulysses: str = "1", steps: int = 3, **extra: Any) -> dict[str, Any]:
    """``steps`` optimizer steps; the logged training losses, what the collator packed and what ran the recurrent
    layers.

    Args:
        sp_size: SP size (the world under SP); out_dir: the trainer's output; ulysses: ``hsap_ulysses_size``;
        steps: optimizer steps; extra: more ``HSAPSFTConfig`` fields.
    """
    from datasets import Dataset

    import hf_hsap
    from hf_hsap.integrations import HSAPSFTConfig, HSAPSFTTrainer, register
    from workers.zoo_configs import build_model, tiny_config

    adopt_process_group(sp_size)  # Accelerate adopts the existing process group
    register()
    model = build_model(tiny_config(FAMILY), "hsap", torch.float32, seed=0)
    g = torch.Generator().manual_seed(7)
    lens = torch.randint(2, 24, (40,), generator=g).tolist()
    rows = [{"text": " ".join(f"w{i}" for i in torch.randint(3, VOCAB, (n,), generator=g).tolist())} for n in lens]
    args = HSAPSFTConfig(output_dir=out_dir, packing=True, max_length=64, per_device_train_batch_size=2,
                         max_steps=steps, logging_steps=1, learning_rate=1e-2, report_to=[], use_cpu=True,
                         save_strategy="no", seed=0, data_seed=0, dataloader_num_workers=0, disable_tqdm=True,
                         bf16=False, dataset_num_proc=None, hsap_sp_size=sp_size,
                         hsap_ulysses_size=ulysses if sp_size > 1 else "1", **extra)
    trainer = HSAPSFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=make_tokenizer())
    ctx = state_of(model, MIXERS)  # the recurrent layers' context (prepare_model, at construction)
    cut = []  # every call of a prepared layer that ran document-cut on a batch's layout
    if ctx is not None:
        record = ctx.record
        ctx.record = lambda layer: (cut.append(id(layer)), record(layer))[-1]
    probe = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    trainer.train()
    pos = probe["position_ids"]
    return {"losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "attn": model.config._attn_implementation,
            "mixers": trainer.hsap_prepared.check.mixer_layers,
            "prepared": None if ctx is None else len(ctx.layers),
            "cut_calls": len(cut), "cut_layers": len(set(cut)), "checkpointing": bool(args.gradient_checkpointing),
            "rows": len(trainer.train_dataset),
            "docs": int((pos == 0).sum()), "tokens": int(pos.numel()),
            "row_docs": [len(trainer.train_dataset[i]["seq_lengths"]) for i in range(2)]}
