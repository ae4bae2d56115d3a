"""The longest packed row whose modelled step fits in a GPU's memory (:func:`longest_row`, pure)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .levers import MemoryLevers
from .model import StepMemory, predict_step_memory

__all__ = ["FitResult", "longest_row"]

logger = logging.getLogger("hf_hsap")
DEFAULT_RESERVE_GIB = 4.0  # the CUDA context, NCCL's buffers, the caching allocator's fragmentation


@dataclass(frozen=True)
class FitResult:
    """The answer of :func:`longest_row`.

    Attributes:
        tokens: the longest row (a multiple of ``sp_size``; 0 when not even ``sp_size`` tokens fit).
        memory: the modelled step at ``tokens`` (at ``sp_size`` tokens when none fit).
        limiting_term: the largest term one step further (``tokens + sp_size``): what stops a longer row.
    """

    tokens: int
    memory: StepMemory
    limiting_term: str


def longest_row(config: Any, *, gpus: int, memory_per_gpu_gib: float, levers: MemoryLevers = MemoryLevers(),
                sharding: str = "zero3", sp_size: int | None = None, ulysses_size: int = 1,
                reserve_gib: float = DEFAULT_RESERVE_GIB, max_tokens: int = 1 << 40, **kw: Any) -> FitResult:
    """The largest row length whose :func:`~.model.predict_step_memory` total fits ``memory_per_gpu_gib`` less
    ``reserve_gib``, by bisection over multiples of ``sp_size`` (the total grows with the row).

    Args:
        config: a Transformers config or a dict of its sizes.
        gpus: the world size; memory_per_gpu_gib: each GPU's memory; levers, sharding, ulysses_size: as for
            :func:`~.model.predict_step_memory`.
        sp_size: ranks per row (default: every GPU).
        reserve_gib: memory kept free of the model (context, communication buffers, fragmentation).
        max_tokens: the search's upper end.
        **kw: more :func:`~.model.predict_step_memory` arguments (dtypes, optimizer, receive budget, device).

    Returns:
        :class:`FitResult`.
    """
    sp = gpus if sp_size is None else sp_size
    budget = (memory_per_gpu_gib - reserve_gib) * 2**30

    def at(steps: int) -> StepMemory:
        return predict_step_memory(config, steps * sp, world=gpus, sp_size=sp, ulysses_size=ulysses_size,
                                   sharding=sharding, levers=levers, **kw)

    lo, hi = 0, 1  # lo fits (0: nothing), hi does not
    while at(hi).total <= budget:
        lo, hi = hi, hi * 2
        if hi * sp > max_tokens:
            hi = max_tokens // sp + 1
            if at(hi - 1).total <= budget:
                lo = hi - 1
                break
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid).total <= budget else (lo, mid)
    nxt = at(lo + 1)
    result = FitResult(lo * sp, at(max(lo, 1)), nxt.limiting_term())
    logger.info("hf_hsap: longest row %d tokens on %d GPUs of %.0f GiB (%s, SP %d, U %d), limited by %s",
                result.tokens, gpus, memory_per_gpu_gib, sharding, sp, ulysses_size, result.limiting_term)
    return result
