"""Worker functions for tests/model/test_vlm_sft.py: TRL SFT of a tiny VLM of TRL's set (:data:`TRL_VLMS`, its own
processor) on a generated image + text set with ``packing=True`` through ``HSAPSFTTrainer``, at one process and
under SP."""
from __future__ import annotations

from typing import Any

from helpers import adopt_process_group, environ_kept

ROW = 512  # tokens per packed row: a LLaVA-NeXT document of three any-resolution images is 314 tokens
ROWS = 24  # examples: 6 batches of 4, at least one for each of 4 SP ranks (the SP loader takes one from each)


@environ_kept
def vlm_sft_losses(sp_size: int, out_dir: str, ulysses: str = "1", steps: int = 3, family: str = "llava",
                   **extra: Any) -> dict[str, Any]:
    """``steps`` optimizer steps; the logged training losses and what the collator packed.

    Args:
        sp_size: SP size (the world under SP); out_dir: the trainer's output; ulysses: ``hsap_ulysses_size``;
        steps: optimizer steps; family: a key of :data:`hf_hsap.examples.TRL_VLMS`; extra: more
            ``HSAPSFTConfig`` fields.

    Returns:
        ``losses`` and ``num_tokens`` (TRL's logged ones, per step), ``attn`` (decoder, vision tower), and for
        the first batch: ``images``, ``docs``, ``trained`` (tokens with a label) and ``tokens``.
    """
    from datasets import Dataset

    from hf_hsap.examples import tiny_trl_vlm, vlm_sft_rows
    from hf_hsap.integrations import HSAPSFTConfig, HSAPSFTTrainer

    adopt_process_group(sp_size)  # Accelerate adopts the existing process group
    model, processor = tiny_trl_vlm(family, seed=0)
    args = HSAPSFTConfig(output_dir=out_dir, packing=True, max_length=ROW, per_device_train_batch_size=4,
                         max_steps=steps, logging_steps=1, learning_rate=1e-2, report_to=[], use_cpu=True,
                         save_strategy="no", seed=0, data_seed=0, dataloader_num_workers=0, disable_tqdm=True,
                         bf16=False, assistant_only_loss=True, hsap_sp_size=sp_size,
                         hsap_ulysses_size=ulysses if sp_size > 1 else "1", **extra)
    trainer = HSAPSFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(vlm_sft_rows(ROWS)),
                             processing_class=processor)
    examples = [trainer.train_dataset[i] for i in range(4)]
    images = sum(len(ex["images"]) for ex in examples)
    probe = trainer.data_collator(examples)
    trainer.train()
    text = model.config.get_text_config()._attn_implementation
    logged = [h for h in trainer.state.log_history if "loss" in h]
    return {"losses": [h["loss"] for h in logged], "num_tokens": [h["num_tokens"] for h in logged],
            "attn": (text, model.config.vision_config._attn_implementation), "images": images,
            "docs": int(probe["cu_seq_lens_q"].numel() - 1), "trained": int((probe["labels"] != -100).sum()),
            "tokens": int(probe["input_ids"].numel())}


def family_losses(family: str, out_dir: str, steps: int = 2) -> dict[str, Any]:
    """One family at one process (the reference) in float32: :func:`vlm_sft_losses` at SP 1."""
    return vlm_sft_losses(1, out_dir, steps=steps, family=family)


def sp_losses(family: str, out_dir: str, ulysses: str, steps: int = 2) -> dict[str, Any]:
    """One family's :func:`vlm_sft_losses` at SP = the pool's world, Ulysses ``ulysses`` (a pool rank runs it)."""
    import torch.distributed as dist

    return vlm_sft_losses(dist.get_world_size(), out_dir, ulysses=ulysses, steps=steps, family=family)

