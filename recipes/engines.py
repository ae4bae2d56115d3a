"""The pretraining recipe under DeepSpeed (``accelerate launch`` with a DeepSpeed config, e.g.
``accelerate_configs/deepspeed_zero3_offload_8.yaml``): what an Accelerate loop without a DataLoader or a
DeepSpeed-built optimizer must do for Accelerate's DeepSpeed plugin. DDP and FSDP (FSDP2 with or without
``CPUOffloadPolicy``) need nothing here: Accelerate's config alone selects them.

* The config's ``"auto"`` fields Accelerate would take from a prepared DataLoader: one packed row per micro-batch,
  ``--grad_accum`` micro-batches per step (and their product with the processes), ``--max_grad_norm`` (DeepSpeed
  clips inside its step; 0: no clipping).
* Gradient accumulation: DeepSpeed steps at the end of every ``backward`` Accelerate marks as a boundary, so the
  recipe's micro-batches run under ``accelerator.accumulate`` (the last one is the boundary), and DeepSpeed must not
  divide the loss by the accumulation steps again (the recipe's loss is already the step's exact global mean share).
* A built-in config's random initialisation runs outside ZeRO-3's partitioned construction (``zero3_init_flag``),
  which initialises each layer in its own way: the recipe's weights are then those of one process (they are small);
  a pretrained model still loads partitioned.
* With ``offload_optimizer`` Accelerate replaces the recipe's torch AdamW by DeepSpeedCPUAdam over the same parameter
  groups (the same update, vectorised on the host). A checkpoint's load gives that optimizer new groups, which a
  scheduler of the torch AdamW would no longer reach (the run resumed from step 2 trained step 4 at step 3's learning
  rate), so the scheduler is made after ``prepare``, of the optimizer DeepSpeed steps.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

__all__ = ["backward_kwargs", "deepspeed_launch", "fill_deepspeed_config", "micro_batch_context",
           "random_init_context", "scheduled_optimizer"]


def deepspeed_launch() -> bool:
    """``accelerate launch`` runs a DeepSpeed config (before the Accelerator exists: it decides how to build it)."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"


def _is_deepspeed(accelerator: Any) -> bool:
    return accelerator.distributed_type.name == "DEEPSPEED"


def fill_deepspeed_config(accelerator: Any, *, grad_accum: int, max_grad_norm: float) -> None:
    """Fill the DeepSpeed config's ``"auto"`` batch, accumulation and clipping fields (before ``prepare``; values
    the config sets stay, and a ``gradient_accumulation_steps`` other than ``grad_accum`` is refused).

    Args:
        accelerator: the recipe's Accelerator (nothing is done unless it runs DeepSpeed).
        grad_accum: micro-batches per step (``--grad_accum``). max_grad_norm: ``--max_grad_norm`` (0: none).

    Raises:
        ValueError: the config fixes ``gradient_accumulation_steps`` to another value than ``--grad_accum``.
    """
    if not _is_deepspeed(accelerator):
        return
    plugin = accelerator.state.deepspeed_plugin
    # DeepSpeed's batch is per process: one row, grad_accum micro-batches, every process (it knows no SP groups)
    plugin.deepspeed_config_process(must_match=False, train_micro_batch_size_per_gpu=1,
                                    gradient_accumulation_steps=grad_accum, gradient_clipping=float(max_grad_norm),
                                    train_batch_size=grad_accum * accelerator.num_processes)
    fixed = plugin.deepspeed_config["gradient_accumulation_steps"]
    if int(fixed) != grad_accum:
        raise ValueError(f"the DeepSpeed config sets gradient_accumulation_steps={fixed} but --grad_accum is "
                         f"{grad_accum}: set it to \"auto\" in the JSON file or pass --grad_accum {fixed}")


def random_init_context(accelerator: Any, *, random_init: bool) -> Any:
    """The context the model is built in: ZeRO-3's partitioned construction off for a ``random_init`` (the weights
    of the same seed on one process), else unchanged.

    Accelerate (1.16) registers its DeepSpeed config with Transformers whatever ``zero3_init_flag`` says (its
    ``zero3_init_context_manager(enable=False)`` registers it again), and Transformers then builds every model inside
    ``deepspeed.zero.Init``; so the registration is lifted for the construction and restored after it.

    Args:
        accelerator: the recipe's Accelerator. random_init: the model is a built-in config initialised from the seed.
    """
    if not (random_init and _is_deepspeed(accelerator)):
        return nullcontext()
    return _unregistered(accelerator.state.deepspeed_plugin)


@contextmanager
def _unregistered(plugin: Any) -> Iterator[None]:
    from transformers.integrations.deepspeed import set_hf_deepspeed_config, unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if getattr(plugin, "dschf", None) is not None:
            set_hf_deepspeed_config(plugin.dschf)


def scheduled_optimizer(accelerator: Any, model: Any, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer whose learning rate the schedule sets: under DeepSpeed the engine's own (``model``, prepared:
    the recipe's ``optimizer`` or the DeepSpeedCPUAdam Accelerate put in its place), else ``optimizer``."""
    return model.basic_optimizer if _is_deepspeed(accelerator) else optimizer


def micro_batch_context(accelerator: Any, model: torch.nn.Module, last: bool) -> Any:
    """The context of one micro-batch's forward + backward: DDP / FSDP skip the gradient sync but on the ``last``;
    DeepSpeed counts micro-batches in ``accelerator.accumulate`` (the Accelerator is made with ``--grad_accum``)."""
    if _is_deepspeed(accelerator):
        return accelerator.accumulate(model)
    return nullcontext() if last else accelerator.no_sync(model)


def backward_kwargs(accelerator: Any) -> dict[str, Any]:
    """``accelerator.backward`` keywords: DeepSpeed must not divide the loss by the accumulation steps."""
    return {"scale_wrt_gas": False} if _is_deepspeed(accelerator) else {}
