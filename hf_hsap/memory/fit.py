"""The longest packed row whose modelled step fits in a GPU's memory and, where the host is counted, in its node's
host memory (:func:`longest_row`, pure)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from .host import (DEFAULT_PROCESS_FOOTPRINT_GIB, HOST_RESERVE_FRACTION, HostMemory, host_budget_bytes, host_memory)
from .levers import MemoryLevers
from .model import StepMemory, predict_step_memory

__all__ = ["FitResult", "largest_fitting", "longest_row"]

logger = logging.getLogger("hf_hsap")
DEFAULT_RESERVE_GIB = 4.0  # the CUDA context, NCCL's buffers, the caching allocator's fragmentation


@dataclass(frozen=True)
class FitResult:
    """The answer of :func:`longest_row`.

    Attributes:
        tokens: the longest row (a multiple of ``sp_size``; 0 when not even ``sp_size`` tokens fit): the smaller of
            :attr:`device_tokens` and :attr:`host_tokens`.
        memory: the modelled step at ``tokens`` (at ``sp_size`` tokens when none fit).
        limiting_term: what stops a longer row: the device's largest term one step past :attr:`device_tokens`, or
            where the host binds ``"host: <term>"`` (the host's largest term one step past :attr:`host_tokens`).
        device_tokens: the longest row the device allows.
        host_tokens: the longest row the host allows (None: the host not counted).
        binds: ``"device"`` or ``"host"`` (the host on a tie).
        host: the host memory at ``tokens`` (None: not counted).
    """

    tokens: int
    memory: StepMemory
    limiting_term: str
    device_tokens: int = 0
    host_tokens: int | None = None
    binds: str = "device"
    host: HostMemory | None = None


def largest_fitting(fits: Callable[[int], bool], *, step: int = 1, max_tokens: int = 1 << 40) -> int:
    """The largest multiple of ``step`` (up to ``max_tokens``) for which ``fits`` holds, by doubling and bisection
    (``fits`` must be monotone: true up to a length, false past it); 0 when ``step`` does not fit."""
    lo, hi = 0, 1  # lo fits (0: nothing), hi does not
    while fits(hi * step):
        lo, hi = hi, hi * 2
        if hi * step > max_tokens:
            hi = max_tokens // step + 1
            if fits((hi - 1) * step):
                return (hi - 1) * step
            break
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * step) else (lo, mid)
    return lo * step


def longest_row(config: Any, *, gpus: int, memory_per_gpu_gib: float, levers: MemoryLevers = MemoryLevers(),
                sharding: str = "zero3", sp_size: int | None = None, ulysses_size: int = 1,
                reserve_gib: float = DEFAULT_RESERVE_GIB, max_tokens: int = 1 << 40,
                host_memory_gib: float | None = None, gpus_per_node: int | None = None,
                footprint_gib: float = DEFAULT_PROCESS_FOOTPRINT_GIB,
                host_reserve_fraction: float = HOST_RESERVE_FRACTION, **kw: Any) -> FitResult:
    """The largest row length whose :func:`~.model.predict_step_memory` total fits ``memory_per_gpu_gib`` less
    ``reserve_gib`` and, with ``host_memory_gib``, whose host memory (:func:`~.host.host_memory`) fits the node's less
    ``host_reserve_fraction``, by bisection over multiples of ``sp_size`` (both grow with the row).

    Args:
        config: a Transformers config or a dict of its sizes.
        gpus: the world size; memory_per_gpu_gib: each GPU's memory; levers, sharding, ulysses_size: as for
            :func:`~.model.predict_step_memory`.
        sp_size: ranks per row (default: every GPU).
        reserve_gib: memory kept free of the model (context, communication buffers, fragmentation).
        max_tokens: the search's upper end.
        host_memory_gib: one node's host memory (None: the host not counted).
        gpus_per_node: processes per node (default ``min(gpus, 8)``).
        footprint_gib: one process's own host footprint. host_reserve_fraction: the node's share kept for the OS.
        **kw: more :func:`~.model.predict_step_memory` arguments (dtypes, optimizer, receive budget, device,
            offload).

    Returns:
        :class:`FitResult`.
    """
    sp = gpus if sp_size is None else sp_size
    budget = (memory_per_gpu_gib - reserve_gib) * 2**30
    per_node = gpus_per_node or min(gpus, 8)
    device = kw.get("device", "cuda")

    def at(tokens: int) -> StepMemory:
        return predict_step_memory(config, max(tokens, sp), world=gpus, sp_size=sp, ulysses_size=ulysses_size,
                                   sharding=sharding, levers=levers, **kw)

    def host_at(tokens: int) -> HostMemory:
        return host_memory(at(tokens), gpus_per_node=per_node, footprint_gib=footprint_gib, device=device)

    dev = largest_fitting(lambda n: at(n).total <= budget, step=sp, max_tokens=max_tokens)
    if host_memory_gib is None:
        result = FitResult(dev, at(dev), at(dev + sp).limiting_term(), device_tokens=dev)
    else:
        host_budget = host_budget_bytes(host_memory_gib, gpus_per_node=per_node, reserve_fraction=host_reserve_fraction)
        host = largest_fitting(lambda n: host_at(n).per_process <= host_budget, step=sp, max_tokens=max_tokens)
        tokens = min(dev, host)
        binds = "host" if host <= dev else "device"
        term = ("host: " + host_at(host + sp).limiting_term()) if binds == "host" else at(dev + sp).limiting_term()
        result = FitResult(tokens, at(tokens), term, device_tokens=dev, host_tokens=host, binds=binds,
                           host=host_at(tokens))
    logger.info("hf_hsap: longest row %d tokens on %d GPUs of %.0f GiB (%s, SP %d, U %d, offload %s), limited by %s",
                result.tokens, gpus, memory_per_gpu_gib, sharding, sp, ulysses_size, kw.get("offload", "none"),
                result.limiting_term)
    return result
