"""The trainers' check, before the first step, that a packed row fits the device (the recipes run the same check).

A micro-batch of ``HSAPSFTTrainer`` is ``per_device_train_batch_size`` packed rows of ``max_length`` tokens, flattened
into one row (padding-free), so that is the row the memory model (:mod:`hf_hsap.memory.model`) is asked about. The
device's memory: ``hsap_memory_per_device_gib``, else the GPU's less a reserve; on CPU without the field, and for
``HSAPTrainer`` (whose collator sets the row), nothing is checked.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["TRAINER_LEVER_FLAGS", "check_device_row_fits", "check_trainer_row_fits"]

# How a trainer's user turns each lever on (hsap-sft flags / HSAPSFTConfig fields)
TRAINER_LEVER_FLAGS = {"chunked_loss": "--hsap_chunked_loss", "gradient_checkpointing": "--gradient_checkpointing",
                       "tiled_mlp": "--hsap_tiled_mlp", "recompute_norms": "--hsap_recompute_norms",
                       "tiled_attention": "--hsap_tiled_attention",
                       "activation_offloading": "--activation_offloading"}


def check_device_row_fits(accelerator: Any, config: Any, row_tokens: int, *, memory_gib: float | None, sp: Any,
                          levers: Any, **kw: Any) -> None:
    """Refuse a row of ``row_tokens`` whose modelled step does not fit one of ``accelerator``'s devices (the recipes'
    and the trainers' check; :func:`hf_hsap.memory.advice.check_row_fits`).

    Args:
        accelerator: Accelerate's (its device, process count and distributed type give the sharding).
        config: the model's config. row_tokens: tokens of one micro-batch's packed row.
        memory_gib: the device's memory; None: the GPU's less :data:`~hf_hsap.memory.fit.DEFAULT_RESERVE_GIB`, and
            on CPU nothing is checked.
        sp: the SP group. levers: the :class:`~hf_hsap.MemoryLevers`.
        **kw: more :func:`~hf_hsap.memory.model.predict_step_memory` arguments (dtypes, receive budget) and
            ``spelling``.

    Raises:
        ValueError: it does not fit; the message names the levers that would make it fit.
    """
    from ..memory.advice import check_row_fits
    from ..memory.fit import DEFAULT_RESERVE_GIB

    device = accelerator.device
    if memory_gib is None and device.type == "cuda":
        memory_gib = torch.cuda.get_device_properties(device).total_memory / 2**30 - DEFAULT_RESERVE_GIB
    if memory_gib is None:
        return
    world = accelerator.num_processes
    sharding = {"FSDP": "fsdp2", "DEEPSPEED": "zero3"}.get(accelerator.distributed_type.name,
                                                         "ddp" if world > 1 else "none")
    check_row_fits(config, row_tokens, memory_gib=memory_gib, world=world, sp_size=sp.size,
                   ulysses_size=sp.ulysses_size, levers=levers, sharding=sharding,
                   device="cuda" if device.type == "cuda" else "cpu", **kw)


def check_trainer_row_fits(trainer: Any, model: Any, sft: bool) -> None:
    """Refuse a row that cannot fit (module docstring).

    Args:
        trainer: the HSAP trainer (its ``args``, ``accelerator`` and ``sp``). model: the unwrapped model.
        sft: the trainer is ``HSAPSFTTrainer`` (hf_hsap's chunked loss, or TRL's fused LM head where the chunked
            loss is off: the loss never builds the logits).

    Raises:
        ValueError: the modelled step exceeds the device, naming the levers that would make it fit.
    """
    args = trainer.args
    max_length = getattr(args, "max_length", None)
    if not sft or not max_length or not hasattr(args, "memory_levers"):
        return
    half = next(model.parameters()).dtype in (torch.bfloat16, torch.float16)
    autocast = bool(getattr(args, "bf16", False) or getattr(args, "fp16", False))
    check_device_row_fits(trainer.accelerator, model.config, int(max_length) * int(args.per_device_train_batch_size),
                          memory_gib=getattr(args, "hsap_memory_per_device_gib", None), sp=trainer.sp,
                          levers=args.memory_levers().replace(chunked_loss=True),  # either head: no logits
                          param_dtype="bf16" if half else "fp32", master_weights=False,
                          compute_dtype="bf16" if half or autocast else "fp32",
                          recv_budget_tokens=args.hsap_recv_budget_tokens, spelling=TRAINER_LEVER_FLAGS)
