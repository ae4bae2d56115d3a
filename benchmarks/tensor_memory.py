"""The exact peak of tensor memory allocated during a step on CPU: the figure a GPU's caching allocator reports as
``torch.cuda.max_memory_allocated``, without the heap's noise.

The resident set (``VmHWM``) of a CPU step moves by a few MiB with glibc's state (the order of the schemes, what the
process ran before), about the gap between two schemes that hold the same tensors. :class:`TensorPeak` instead
follows every storage an aten operator creates while it is active (a ``TorchDispatchMode``: it sees the operators of
forward and backward, the collectives' buffers included) and drops it when the storage is freed (a weak reference to
the storage). What it counts: storages created inside the block, views and in-place results of storages that existed
before (the inputs) left out. What it cannot see: scratch memory an operator allocates inside its own kernel and
frees before returning (the same for every scheme that runs the same kernel).

PyTorch has no allocator statistics for CPU tensors (``torch.cuda.memory_stats`` is CUDA's), hence this by-hand
tracker; it is slow (every operator scans the live storages) and only meant for memory runs, never timed ones.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _storages(xs: Any) -> list[torch.UntypedStorage]:
    return [t.untyped_storage() for t in tree_flatten(xs)[0] if isinstance(t, torch.Tensor)]


class TensorPeak(TorchDispatchMode):
    """Peak bytes of the storages created while the mode is active and still alive, over the block.

    Use as ``with TensorPeak() as m: step()``; then ``m.peak_bytes`` (largest live total), ``m.live_bytes``
    (what is still alive at the end: the step's results) and ``m.at_peak`` (``[(bytes, operator)]`` of the live
    storages at the peak, largest first).
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[StorageWeakRef, int, str]] = {}  # data_ptr -> (ref, bytes, operator)
        self.peak_bytes = 0
        self.at_peak: list[tuple[int, str]] = []

    @property
    def live_bytes(self) -> int:
        """Bytes of the tracked storages alive now."""
        self._drop_freed()
        return sum(n for _, n, _ in self._live.values())

    def _drop_freed(self) -> None:
        self._live = {k: v for k, v in self._live.items() if not v[0].expired()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        before = {s.data_ptr() for s in _storages((args, kwargs))}  # views / in-place results of existing storages
        for s in _storages(out):
            key = s.data_ptr()
            if s.nbytes() and key not in before and (key not in self._live or self._live[key][0].expired()):
                self._live[key] = (StorageWeakRef(s), s.nbytes(), str(func))
        self._drop_freed()
        live = sum(n for _, n, _ in self._live.values())
        if live > self.peak_bytes:
            self.peak_bytes = live
            self.at_peak = sorted(((n, op) for _, n, op in self._live.values()), reverse=True)
        return out
