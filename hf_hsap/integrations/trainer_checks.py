"""What the HSAP trainers refuse or change at construction, in one place (no silent surprises).

Each rule refuses before the first step, naming a fix (nothing here changes an argument):

* ``compute_loss_func``: refused. Under SP a rank holds only its shard; its labels are ``shift_labels``
  shifted on the global batch, which a Transformers loss function would shift again.
* label smoothing: refused (Trainer's smoother shifts the labels again).
* ``average_tokens_across_devices=False``: refused (the exact-loss contract counts targets over all ranks).
* unpacked data: refused (TRL without ``packing="bfd"`` / ``padding_free``; for ``HSAPTrainer`` a probe batch of the
  collator without ``position_ids`` / ``cu_seq_lens_q`` or with padding).
* fp32 / fp64 on CUDA without mixed precision: refused (no memory-efficient kernel; see ``select_kernel``).
* an Accelerate ``ParallelismConfig`` with ``cp_size``, ``sp_size`` or ``tp_size`` > 1: refused
  (:func:`~hf_hsap.topology.check_parallelism_config`).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..log import get_logger
from .sharding import batch_cu_seqlens

logger = get_logger(__name__)

__all__ = ["check_trainer_setup", "probe_packed_batch"]


def check_trainer_setup(trainer: Any) -> None:
    """Refuse what the HSAP trainers cannot train exactly (see the module docstring).

    Args:
        trainer: a constructed Trainer / SFTTrainer with the HSAP mixin.

    Raises:
        ValueError: a refused setting, naming the fix.
    """
    from ..topology import check_parallelism_config

    args = trainer.args
    check_parallelism_config(getattr(trainer.accelerator, "parallelism_config", None))
    if getattr(trainer, "compute_loss_func", None) is not None:
        raise ValueError(
            "HSAP trainers refuse compute_loss_func: under sequence parallelism each rank sees only its shard of a "
            "packed row, with targets already shifted on the global batch (inputs['shift_labels']); a Transformers "
            "loss function would shift them again. Override compute_loss(model, inputs, ...) instead and use "
            "inputs['shift_labels'] with num_items_in_batch (hf_hsap.integrations.hsap_causal_lm_loss)")
    if args.label_smoothing_factor:
        raise ValueError("HSAP trainers pass pre-shifted labels; set label_smoothing_factor=0 (label smoothing "
                         "would shift them again)")
    if not args.average_tokens_across_devices:
        raise ValueError("HSAP trainers need average_tokens_across_devices=True (the default): the exact loss "
                         "divides by the valid targets of all ranks; remove average_tokens_across_devices=False")
    if hasattr(args, "packing") and not (getattr(trainer, "padding_free", False) or getattr(args, "padding_free", False)):
        raise ValueError("HSAPSFTTrainer needs packed, padding-free batches: set packing=True with "
                         "packing_strategy='bfd' (the default; 'wrapped' rows carry no document boundaries) or "
                         "padding_free=True")
    if not hasattr(args, "packing"):
        probe_packed_batch(trainer)
    dtype = getattr(trainer.model, "dtype", None)
    mixed = (args.bf16 or args.fp16 or getattr(trainer.accelerator, "mixed_precision", "no") in ("bf16", "fp16")
             or getattr(trainer, "is_deepspeed_enabled", False))  # DeepSpeed's JSON decides its precision
    if trainer.accelerator.device.type == "cuda" and not mixed and dtype in (torch.float32, torch.float64):
        raise ValueError(f"the model runs in {dtype} on CUDA without mixed precision, and hf_hsap's CUDA kernels "
                         "take bf16 / fp16 only (the math kernel's memory is quadratic in the document length): "
                         "set bf16=True (TRL's default) or load the model in bf16")


def probe_packed_batch(trainer: Any) -> None:
    """Collate the first two training examples and refuse a batch ``shard_batch`` could not shard.

    Best effort: when the examples cannot be collated outside the Trainer's own loader (e.g. columns the
    loader would remove first), the check is left to the first step, and that is logged.

    Raises:
        ValueError: a collated batch without ``position_ids`` / ``cu_seq_lens_q``, or with padding.
    """
    data, collate = trainer.train_dataset, trainer.data_collator
    if data is None or collate is None:
        logger.debug("hf_hsap: no %s at init; packing is checked at the first step",
                     "training dataset" if data is None else "data collator")
        return
    if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
        logger.info("hf_hsap: the training dataset (%s) cannot be indexed, so no probe batch is collated at init; "
                    "packing is checked at the first step", type(data).__name__)
        return
    try:
        if hasattr(trainer, "_remove_unused_columns") and hasattr(data, "column_names"):
            data = trainer._remove_unused_columns(data, description="training")
        batch = collate([data[i] for i in range(min(2, len(data)))])
    except Exception as err:  # noqa: BLE001 - a probe; the real loader runs the same check at its first batch
        logger.info("hf_hsap: could not collate a probe batch at init (%s); packing is checked at the first step",
                    err)
        return
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        logger.info("hf_hsap: the data collator's probe batch is not a dict with input_ids (%s); packing is checked "
                    "at the first step", type(batch).__name__)
        return
    try:
        batch_cu_seqlens(batch)  # the layout rule shard_batch applies at every step
    except ValueError as err:
        raise ValueError(
            "HSAPTrainer needs packed, padding-free batches (position_ids restarting at every document, or "
            f"cu_seq_lens_q, and no padding attention_mask); its data collator gave {sorted(batch)}: use "
            f"hf_hsap.data.PackingCollator or transformers.DataCollatorWithFlattening ({err})") from None
