"""Worker functions for tests/model/test_vlm_sft.py: TRL SFT of a tiny LLaVA on a generated image + text set with
``packing=True`` through ``HSAPSFTTrainer``, at one process and under SP."""
from __future__ import annotations

from typing import Any

import torch

from helpers import adopt_process_group, environ_kept


@environ_kept
def vlm_sft_losses(sp_size: int, out_dir: str, ulysses: str = "1", steps: int = 3, **extra: Any) -> dict[str, Any]:
    """``steps`` optimizer steps; the logged training losses and what the collator packed.

    Args:
        sp_size: SP size (the world under SP); out_dir: the trainer's output; ulysses: ``hsap_ulysses_size``;
        steps: optimizer steps; extra: more ``HSAPSFTConfig`` fields.
    """
    from datasets import Dataset
    from transformers import AutoModelForImageTextToText

    from hf_hsap.examples import tiny_vlm_config, tiny_vlm_processor, vlm_sft_rows
    from hf_hsap.integrations import HSAPSFTConfig, HSAPSFTTrainer

    adopt_process_group(sp_size)  # Accelerate adopts the existing process group
    processor = tiny_vlm_processor()
    config = tiny_vlm_config("llava", vocab_size=len(processor.tokenizer))
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa")
    args = HSAPSFTConfig(output_dir=out_dir, packing=True, max_length=160, per_device_train_batch_size=4,
                         max_steps=steps, logging_steps=1, learning_rate=1e-2, report_to=[], use_cpu=True,
                         save_strategy="no", seed=0, data_seed=0, dataloader_num_workers=0, disable_tqdm=True,
                         bf16=False, assistant_only_loss=True, hsap_sp_size=sp_size,
                         hsap_ulysses_size=ulysses if sp_size > 1 else "1", **extra)
    trainer = HSAPSFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(vlm_sft_rows(24)),
                             processing_class=processor)
    probe = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    trainer.train()
    text = model.config.get_text_config()._attn_implementation
    return {"losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "attn": (text, model.config.vision_config._attn_implementation),
            "images": int(probe["pixel_values"].shape[0]), "docs": int(probe["cu_seq_lens_q"].numel() - 1),
            "trained": int((probe["labels"] != -100).sum()), "tokens": int(probe["input_ids"].numel())}
