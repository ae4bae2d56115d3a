"""Launch checks: refuse an Accelerate set-up under which HSAP's groups would be silently wrong.

Run by :func:`hf_hsap.init_sequence_parallel` before any group is made (and by the trainers and ``hsap-sft``
on their own configs): a ``ParallelismConfig`` that would split the sequence or the heads a second time, and an
Accelerate state that counts other processes than ``torch.distributed`` has.
"""
from __future__ import annotations

from typing import Any

__all__ = ["check_parallelism_config", "check_accelerate_world"]


def check_parallelism_config(pc: Any = None) -> None:
    """Refuse an Accelerate ``ParallelismConfig`` that would split the sequence (or the heads) a second time.

    Args:
        pc: an ``accelerate.ParallelismConfig`` (e.g. ``accelerator.parallelism_config``); ``None`` reads
            what ``accelerate launch`` exported from a config file (``PARALLELISM_CONFIG_*``).

    Raises:
        ValueError: ``cp_size > 1`` (PyTorch context parallelism drops the document mask), ``sp_size > 1``
            (ALST / DeepSpeed Ulysses, whose sharding HSAP replaces) or ``tp_size > 1`` (not composed).
    """
    import os

    if pc is None:
        if os.environ.get("ACCELERATE_USE_PARALLELISM_CONFIG", "").lower() not in ("1", "true"):
            return
        sizes = {k: int(os.environ.get(f"PARALLELISM_CONFIG_{k.upper()}", "1")) for k in ("cp_size", "sp_size", "tp_size")}
        backend = os.environ.get("PARALLELISM_CONFIG_SP_BACKEND", "deepspeed")
    else:
        sizes = {k: int(getattr(pc, k, 1) or 1) for k in ("cp_size", "sp_size", "tp_size")}
        backend = getattr(pc, "sp_backend", "deepspeed")
    where = ("remove the parallelism_config block's {key} from the Accelerate config (or ParallelismConfig) and "
             "pass the size to HSAP instead: --hsap_sp_size {n} (HSAPTrainingArguments / HSAPSFTConfig), "
             "HSAPConfig(sp_size={n}) or the recipes' --sp_size {n}")
    if sizes["cp_size"] > 1:
        raise ValueError("Accelerate's context parallelism (cp_size=%d) replaces the document mask of packed rows by "
                         "plain causal attention; " % sizes["cp_size"]
                         + where.format(key="parallelism_config_cp_size", n=sizes["cp_size"]))
    if sizes["sp_size"] > 1:
        raise ValueError(f"an ALST-style parallelism_config (sp_size={sizes['sp_size']}, sp_backend={backend}) would "
                         "shard every sequence a second time under HSAP's own sequence parallelism; "
                         + where.format(key="parallelism_config_sp_size / sp_backend", n=sizes["sp_size"]))
    if sizes["tp_size"] > 1:
        raise ValueError(f"tensor parallelism (tp_size={sizes['tp_size']}) is not composed with HSAP; remove "
                         "parallelism_config_tp_size (HSAP's SP groups with data parallelism or FSDP2 across them)")


def check_accelerate_world(world: int) -> None:
    """Refuse an Accelerate state that counts other processes than torch.distributed has.

    A bare ``Accelerator()`` on a CPU machine under ``accelerate launch`` with a multi-process config
    initialises the process group but reports one process (``DistributedType.NO``): ``prepare()`` then
    returns the model without DDP and the ranks train apart, silently.
    """
    try:
        from accelerate.state import PartialState
    except ImportError:  # pragma: no cover - accelerate is a dependency
        return
    import os

    shared = getattr(PartialState, "_shared_state", {})
    n = shared.get("num_processes")
    if n is None or int(n) == world:
        return
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        raise ValueError(
            f"Accelerate's state counts {n} process(es) but torch.distributed has {world}: under DeepSpeed on a machine "
            "without GPUs, Accelerate (1.16) picks no backend and reports one process, so the ranks would train apart. "
            "Run DeepSpeed on GPUs; on CPU launch the script through scripts/cpu_engine.py (the harness of "
            "scripts/deepspeed_cpu_check.sh: it makes Accelerate use gloo)")
    raise ValueError(
        f"Accelerate's state counts {n} process(es) but torch.distributed has {world}: prepare() would not wrap "
        "the model for data parallelism and the ranks would train apart. On CPU create the Accelerator with "
        "Accelerator(cpu=True) (or PartialState(cpu=True)) before init_sequence_parallel; on GPUs launch with "
        "a config whose distributed_type matches (accelerate_configs/)"
    )
