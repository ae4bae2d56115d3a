"""The trainers' check, before the first step, that a packed row fits the device (the recipes run the same check).

A micro-batch of ``HSAPSFTTrainer`` is ``per_device_train_batch_size`` packed rows of ``max_length`` tokens, flattened
into one row (padding-free), so that is the row the memory model (:mod:`hf_hsap.memory.model`) is asked about. The
device's memory: ``hsap_memory_per_device_gib``, else the GPU's less a reserve; on CPU without the field, and for
``HSAPTrainer`` (whose collator sets the row), nothing is checked.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["TRAINER_LEVER_FLAGS", "check_trainer_row_fits"]

# How a trainer's user turns each lever on (hsap-sft flags / HSAPSFTConfig fields)
TRAINER_LEVER_FLAGS = {"chunked_loss": "--hsap_chunked_loss", "gradient_checkpointing": "--gradient_checkpointing",
                       "tiled_mlp": "--hsap_tiled_mlp", "recompute_norms": "--hsap_recompute_norms",
                       "activation_offloading": "--activation_offloading"}


def check_trainer_row_fits(trainer: Any, model: Any, sft: bool) -> None:
    """Refuse a row that cannot fit (module docstring).

    Args:
        trainer: the HSAP trainer (its ``args``, ``accelerator`` and ``sp``). model: the unwrapped model.
        sft: the trainer is ``HSAPSFTTrainer`` (TRL's fused LM head: the loss never builds the logits).

    Raises:
        ValueError: the modelled step exceeds the device, naming the levers that would make it fit.
    """
    from ..memory.advice import check_row_fits
    from ..memory.fit import DEFAULT_RESERVE_GIB

    args = trainer.args
    max_length = getattr(args, "max_length", None)
    if not sft or not max_length or not hasattr(args, "memory_levers"):
        return
    device = trainer.accelerator.device
    memory = getattr(args, "hsap_memory_per_device_gib", None)
    if memory is None and device.type == "cuda":
        memory = torch.cuda.get_device_properties(device).total_memory / 2**30 - DEFAULT_RESERVE_GIB
    if memory is None:
        return
    world = trainer.accelerator.num_processes
    sharding = {"FSDP": "fsdp2", "DEEPSPEED": "zero3"}.get(trainer.accelerator.distributed_type.name,
                                                         "ddp" if world > 1 else "none")
    levers = args.memory_levers().replace(chunked_loss=True)  # TRL's fused head never builds the logits either
    half = next(model.parameters()).dtype in (torch.bfloat16, torch.float16)
    autocast = bool(getattr(args, "bf16", False) or getattr(args, "fp16", False))
    check_row_fits(model.config, int(max_length) * int(args.per_device_train_batch_size), memory_gib=memory,
                   world=world, sp_size=trainer.sp.size, ulysses_size=trainer.sp.ulysses_size, levers=levers,
                   sharding=sharding, param_dtype="bf16" if half else "fp32", master_weights=False,
                   compute_dtype="bf16" if half or autocast else "fp32",
                   recv_budget_tokens=args.hsap_recv_budget_tokens, device=device.type if device.type in ("cuda", "cpu") else "cuda", spelling=TRAINER_LEVER_FLAGS)
