"""Subnormal floats flushed to zero while a split run's summary is computed on the CPU.

A continued run's transition is a product of its tokens' decays (``exp(sum g)`` for Mamba2 and the gated delta rule,
``exp(-slope n)`` for lightning attention): over a run of thousands of tokens it falls below float32's smallest normal
number (1.2e-38) long before it reaches zero, and so do the terms that the initial state contributes to the run's
later outputs. x86 CPUs take a slow microcode path for every arithmetic operation on a subnormal operand (what that
costs a split row: ``bash scripts/bench_hybrid.sh``). Flushing them changes values below 1.2e-38 (2.2e-308 in
float64) to zero, far below any tolerance a float32 or float64 result is held to.

torch exposes the CPU's flush-to-zero mode only as a per-thread switch (:func:`torch.set_flush_denormal`) with no
getter, so :func:`flush_subnormals` probes the current mode and puts it back. GPUs are left alone: their kernels
handle subnormals at full speed.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

__all__ = ["flush_subnormals", "flushing"]

log = logging.getLogger("hf_hsap")

# float32's smallest normal number is 2**-126; half of it is subnormal
_SUBNORMAL = 2.0 ** -127


def flushing() -> bool:
    """Whether this thread's CPU arithmetic flushes subnormal floats to zero now."""
    return bool((torch.tensor([_SUBNORMAL], dtype=torch.float32) * 1.0).item() == 0.0)


@contextlib.contextmanager
def flush_subnormals(device: torch.device) -> Iterator[None]:
    """Flush subnormal floats to zero on this thread while the block runs on ``device`` (the CPU only), then restore
    the mode the thread had.

    Args:
        device: where the block's tensors are; nothing changes unless it is the CPU.
    """
    if device.type != "cpu" or flushing():
        yield
        return
    if not torch.set_flush_denormal(True):  # this CPU has no flush-to-zero mode (torch says so); nothing to restore
        log.debug("hf_hsap: this CPU cannot flush subnormal floats; summaries run at the CPU's own speed")
        yield
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
