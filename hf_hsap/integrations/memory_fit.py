"""The trainers' check, before the first step, that a packed row fits the device (the recipes run the same check).

A micro-batch of ``HSAPSFTTrainer`` is ``per_device_train_batch_size`` packed rows of ``max_length`` tokens, flattened
into one row (padding-free), so that is the row the memory model (:mod:`hf_hsap.memory.model`) is asked about. The
device's memory: ``hsap_memory_per_device_gib``, else the GPU's less a reserve; on CPU without the field the device
is not checked. The host's (:mod:`hf_hsap.memory.host`): ``hsap_host_memory_gib`` per node, else this machine's
physical memory; the processes sharing it: the SP group's ranks per node (``gpus_per_node``, else the launcher's
``LOCAL_WORLD_SIZE``, else the GPUs), at most the world. ``HSAPTrainer`` (whose collator sets the row) is not checked.
"""
from __future__ import annotations

from typing import Any

import psutil
import torch

__all__ = ["HOST_FLAGS", "TRAINER_LEVER_FLAGS", "check_device_row_fits", "check_trainer_row_fits", "detect_offload",
           "detect_offload_pinned", "machine_memory_gib", "process_footprint_gib"]

# How a trainer's user turns each lever on (hsap-sft flags / HSAPSFTConfig fields)
TRAINER_LEVER_FLAGS = {"chunked_loss": "--hsap_chunked_loss", "gradient_checkpointing": "--gradient_checkpointing",
                       "tiled_mlp": "--hsap_tiled_mlp", "recompute_norms": "--hsap_recompute_norms",
                       "tiled_attention": "--hsap_tiled_attention",
                       "activation_offloading": "--activation_offloading"}
# How a trainer's user sets the host's memory and the offload (the fit check's advice)
HOST_FLAGS = {"host_memory_gib": "--hsap_host_memory_gib",
              "offload": "the Accelerate config's offload (DeepSpeed offload_optimizer / offload_param, FSDP "
                         "fsdp_offload_params)"}


def machine_memory_gib() -> float:
    """This machine's physical memory (GiB): the host memory of the node the process runs on."""
    return psutil.virtual_memory().total / 2**30


def process_footprint_gib(config: Any, param_dtype: str) -> float:
    """This process's own host footprint (GiB), measured before the first step: its resident set now less the
    model's weights, built whole in host memory before ``accelerator.prepare`` (the memory model counts them). Used
    on CPU; on CUDA the weights may already be on the device and the CUDA runtime's, NCCL's and the data loader's
    memory grows after this point, so the stated default (:data:`~hf_hsap.memory.host.DEFAULT_PROCESS_FOOTPRINT_GIB`)
    is used there."""
    from ..memory.model import DTYPE_BYTES
    from ..model_shape import ModelShape

    weights = ModelShape.from_config(config).params * DTYPE_BYTES[param_dtype]
    return max(0.0, psutil.Process().memory_info().rss - weights) / 2**30


def detect_offload(accelerator: Any) -> str:
    """What the engine ``accelerator`` runs keeps in host memory: ``"none"``, ``"optimizer"`` or ``"params"``.

    Read from the Accelerate state: DeepSpeed's config (``zero_optimization.offload_optimizer`` /
    ``offload_param``, accelerate_configs/deepspeed/zero3_offload*.json) or the FSDP plugin's ``cpu_offload``
    (FSDP2's ``CPUOffloadPolicy``, ``fsdp_offload_params: true``; FSDP1's ``CPUOffload(offload_params=True)``). Any
    other distributed type (DDP, one process, CPU processes, where Accelerate selects no FSDP) offloads nothing.

    Args:
        accelerator: an ``accelerate.Accelerator`` (or anything with its ``distributed_type`` and ``state``).

    Returns:
        ``"optimizer"``: the optimizer state (master weights, moments) and its step are on the host, the weights
        on the device (DeepSpeed ``offload_optimizer`` alone); ``"params"``: the weight shards too (DeepSpeed
        ``offload_param`` with ``offload_optimizer``; FSDP's CPU offload, which always moves parameters, gradients
        and optimizer state together); ``"none"``. DeepSpeed's ``device: nvme`` counts as offloaded (off the device;
        its host share is then smaller than the memory model's host terms say).

    Raises:
        ValueError: DeepSpeed's ``offload_param`` without ``offload_optimizer`` (the weights on the host while
            their optimizer state stays on the device), which hf_hsap does not model.
    """
    kind = getattr(getattr(accelerator, "distributed_type", None), "name", "NO")
    state = getattr(accelerator, "state", None)
    if kind == "DEEPSPEED":
        zero = getattr(getattr(state, "deepspeed_plugin", None), "deepspeed_config", None) or {}
        zero = zero.get("zero_optimization", {})
        on = {k: str((zero.get(k) or {}).get("device", "none")).lower() not in ("none", "")
              for k in ("offload_optimizer", "offload_param")}
        if on["offload_param"] and not on["offload_optimizer"]:
            raise ValueError("DeepSpeed offloads the parameters (offload_param) but not the optimizer state: hf_hsap's "
                             "memory model has no such term; add \"offload_optimizer\": {\"device\": \"cpu\"} as in "
                             "accelerate_configs/deepspeed/zero3_offload.json")
        return "params" if on["offload_param"] else "optimizer" if on["offload_optimizer"] else "none"
    if kind == "FSDP":
        from torch.distributed.fsdp import CPUOffloadPolicy

        policy = getattr(getattr(state, "fsdp_plugin", None), "cpu_offload", None)
        # FSDP2: CPUOffloadPolicy (the base OffloadPolicy() offloads nothing); FSDP1: CPUOffload(offload_params=...)
        moved = isinstance(policy, CPUOffloadPolicy) or bool(getattr(policy, "offload_params", False))
        return "params" if moved else "none"
    return "none"


def detect_offload_pinned(accelerator: Any) -> bool:
    """Whether the engine's offload buffers are page-locked (pinned): DeepSpeed's ``offload_optimizer`` /
    ``offload_param`` ``pin_memory`` (DeepSpeed's default: false; the shipped configs set true), FSDP2's
    ``CPUOffloadPolicy.pin_memory`` (default true). Pinned buffers come from torch's caching host allocator, rounded
    up to powers of two (:func:`hf_hsap.memory.host.pinned_bytes`); unpinned ones take their bytes (their copies run
    at pageable bandwidth).

    Args:
        accelerator: as for :func:`detect_offload`.

    Returns:
        True where any offloaded buffer is pinned (or nothing is offloaded).
    """
    kind = getattr(getattr(accelerator, "distributed_type", None), "name", "NO")
    state = getattr(accelerator, "state", None)
    if kind == "DEEPSPEED":
        zero = (getattr(getattr(state, "deepspeed_plugin", None), "deepspeed_config", None) or {}).get(
            "zero_optimization", {})
        offloads = [zero.get(k) or {} for k in ("offload_optimizer", "offload_param")]
        on = [o for o in offloads if str(o.get("device", "none")).lower() not in ("none", "")]
        return not on or any(bool(o.get("pin_memory", False)) for o in on)
    if kind == "FSDP":
        policy = getattr(getattr(state, "fsdp_plugin", None), "cpu_offload", None)
        return bool(getattr(policy, "pin_memory", True))
    return True


def _processes_per_node(sp: Any, world: int) -> int:
    """The training processes sharing this node's host memory: the SP group's ranks per node
    (:func:`hf_hsap.init_sequence_parallel`'s rule: ``gpus_per_node``, ``LOCAL_WORLD_SIZE``, the GPUs), at most the
    world."""
    return max(1, min(world, getattr(sp, "gpus_per_node", None) or world))


def check_device_row_fits(accelerator: Any, config: Any, row_tokens: int, *, memory_gib: float | None, sp: Any,
                          levers: Any, host_memory_gib: float | None = None, offload: str | None = None,
                          footprint_gib: float | None = None, **kw: Any) -> None:
    """Refuse a row of ``row_tokens`` whose modelled step does not fit one of ``accelerator``'s devices or the host
    memory of its node (the recipes' and the trainers' check; :func:`hf_hsap.memory.advice.check_row_fits`).

    Args:
        accelerator: Accelerate's (its device, process count and distributed type give the sharding).
        config: the model's config. row_tokens: tokens of one micro-batch's packed row.
        memory_gib: the device's memory; None: the GPU's less :data:`~hf_hsap.memory.fit.DEFAULT_RESERVE_GIB`, and
            on CPU nothing is checked.
        sp: the SP group. levers: the :class:`~hf_hsap.MemoryLevers`.
        host_memory_gib: one node's host memory; None: this machine's (:func:`machine_memory_gib`).
        offload: what the engine offloads, ``"none"``, ``"optimizer"`` or ``"params"``
            (:data:`hf_hsap.memory.host.OFFLOADS`); None: read from the accelerator's plugin (:func:`detect_offload`).
        footprint_gib: one process's own host footprint; None: on CUDA the stated default
            (:data:`~hf_hsap.memory.host.DEFAULT_PROCESS_FOOTPRINT_GIB`), on CPU measured
            (:func:`process_footprint_gib`).
        **kw: more :func:`~hf_hsap.memory.model.predict_step_memory` arguments (dtypes, receive budget) and
            ``spelling``.

    Raises:
        ValueError: it does not fit; the message names the levers that would make it fit.
    """
    from ..memory.advice import check_row_fits
    from ..memory.fit import DEFAULT_RESERVE_GIB
    from ..memory.host import DEFAULT_PROCESS_FOOTPRINT_GIB

    device = accelerator.device
    if memory_gib is None and device.type == "cuda":
        memory_gib = torch.cuda.get_device_properties(device).total_memory / 2**30 - DEFAULT_RESERVE_GIB
    world = accelerator.num_processes
    sharding = {"FSDP": "fsdp2", "DEEPSPEED": "zero3"}.get(accelerator.distributed_type.name,
                                                         "ddp" if world > 1 else "none")
    on_cuda = device.type == "cuda"
    footprint = footprint_gib if footprint_gib is not None else DEFAULT_PROCESS_FOOTPRINT_GIB if on_cuda else \
        process_footprint_gib(config, kw.get("param_dtype", "bf16"))
    if not detect_offload_pinned(accelerator):  # unpinned offload buffers: their bytes, not powers of two
        kw.setdefault("pinned_round_limit_mb", 0)
    check_row_fits(config, row_tokens, memory_gib=memory_gib, world=world, sp_size=sp.size,
                   ulysses_size=sp.ulysses_size, levers=levers, sharding=sharding,
                   device="cuda" if on_cuda else "cpu",
                   offload=detect_offload(accelerator) if offload is None else offload,
                   host_memory_gib=machine_memory_gib() if host_memory_gib is None else host_memory_gib,
                   gpus_per_node=_processes_per_node(sp, world), footprint_gib=footprint, **kw)


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
                          host_memory_gib=getattr(args, "hsap_host_memory_gib", None),
                          levers=args.memory_levers().replace(chunked_loss=True),  # either head: no logits
                          param_dtype="bf16" if half else "fp32", master_weights=False,
                          compute_dtype="bf16" if half or autocast else "fp32",
                          recv_budget_tokens=args.hsap_recv_budget_tokens,
                          spelling={**TRAINER_LEVER_FLAGS, **HOST_FLAGS})
