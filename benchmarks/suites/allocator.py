"""How a CPU benchmark's spawned ranks allocate host memory: glibc's malloc keeping what it frees, as the GPU's caching
allocator does, or glibc's defaults.

With its defaults, glibc serves large blocks (a layer's activations, a kernel's chunk tensors) from fresh ``mmap``
regions and gives a freed stretch at the top of its heap back to the system. Every training step then maps its
activations in again: a page fault per 4 KiB page, counted as the rank's system time, and how many depends on where
the step's tensors happen to land in the heap, not on the work. On a GPU, PyTorch's caching allocator keeps freed
blocks for the next step, and PyTorch's CPU performance guide recommends a caching allocator (jemalloc, TCMalloc) for
the same reason. A benchmark whose figure is a ratio of CPU times spawns its ranks with glibc's own tunables set to
keep memory (:data:`KEEP`: nothing is mapped per block, the heap is never trimmed), the same for every row it
compares; where a figure is judged, it is also measured with glibc's defaults (:data:`GLIBC_DEFAULT`) in the same
run and reported beside it.

Probed on the split-document rows (:mod:`.recurrent_split`): the ranks' user time is the same under both settings;
with glibc's defaults the split row's ranks also spend up to twice the whole row's system time in page faults.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["ALLOCATORS", "GLIBC_DEFAULT", "KEEP", "spawn_env"]

KEEP = {"MALLOC_MMAP_THRESHOLD_": str(1 << 31), "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
GLIBC_DEFAULT: dict[str, str] = {}
ALLOCATORS = {"keep": KEEP, "glibc_default": GLIBC_DEFAULT}  # name -> the environment its ranks are spawned with


@contextmanager
def spawn_env(allocator: str) -> Iterator[Mapping[str, str]]:
    """Processes spawned inside get ``allocator``'s malloc tunables (glibc reads them at process start), and none of
    the others; the parent's environment is restored on exit.

    Args:
        allocator: a key of :data:`ALLOCATORS`.

    Yields:
        The tunables set.
    """
    env = ALLOCATORS[allocator]
    names = {k for a in ALLOCATORS.values() for k in a}
    saved = {k: os.environ.get(k) for k in names}
    try:
        for k in names:
            os.environ.pop(k, None)
        os.environ.update(env)
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
