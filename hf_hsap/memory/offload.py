"""Activation offloading into one host slab of exactly the step's bytes.

TRL's offloading context (``trl.models.activation_offloading``) pins one host tensor per saved tensor through
PyTorch's caching host allocator, which rounds every allocation up to a power of two: a checkpointed layer input of
6 GB takes 8 GiB of host memory, so a node's memory holds up to half as many checkpoints as their bytes would fill
(:func:`~.host.pinned_bytes`). No library offers offloading into exactly sized pinned memory, so hf_hsap writes the
context itself, with the same contract (``saved_tensors_hooks`` around every forward + backward; TRL's
``NoOpManager`` inside still keeps a layer's tensors on the device, :func:`~.blocks.keep_layers_on_device`):

* **The slab** (:class:`HostSlab`): every offloaded tensor of a step is a 512-byte aligned slice of one host buffer,
  cut end to end. A step that needs more than the buffer holds gets exactly sized overflow buffers; when the next
  step begins they are all freed and one buffer of the step's high-water bytes replaces them, so from the second
  step of a run of equal rows the host holds exactly the offloaded bytes and nothing is allocated again. On CUDA the
  buffer is ordinary (pageable) host memory registered with the driver (``cudaHostRegister``), which makes it
  pinned without the caching allocator's rounding.
* **The copies**: device -> host on a side stream after the compute stream's pending work, the device tensor's
  memory held until that copy is done (``record_stream``); host -> device in backward on the side stream, the
  compute stream waiting for it. A tensor is offloaded when it lives on the device, has at least
  ``min_offload_bytes`` and is not a parameter; it is moved as the span of storage it covers (its strides come
  back, from offset 0: a broadcast view moves only what it stores), unless that span is over 25 % larger than its
  elements (a sparse view: it stays on the device). A tensor saved again while it is alive and unchanged is not
  copied twice.

Host bytes of a step: the offloaded tensors' bytes, each rounded up to 512 (what :func:`~.model.predict_step_memory`
counts for ``activation_offloading``).
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from ..log import get_logger

__all__ = ["ALIGN_BYTES", "HostSlab", "SlabOffload", "slab_bytes"]

logger = get_logger(__name__)

ALIGN_BYTES = 512  # every slice starts at a multiple of this (DMA-friendly; any dtype's alignment)
PAGE_BYTES = 4096  # a registered buffer starts and ends on a page
MIN_OFFLOAD_BYTES = 1024  # smaller saved tensors stay where they are (TRL's default threshold)
MAX_SPAN_OVERHEAD = 1.25  # a view whose storage span exceeds its elements by more stays on the device (sparse)


def slab_bytes(nbytes: float) -> float:
    """Host bytes one offloaded tensor of ``nbytes`` takes in the slab (rounded up to :data:`ALIGN_BYTES`)."""
    return float(-(-int(nbytes) // ALIGN_BYTES) * ALIGN_BYTES) if nbytes > 0 else 0.0


class HostSlab:
    """Host memory cut into a step's offloaded tensors end to end (module docstring).

    Args:
        pin: register the buffers with CUDA (page-locked); off where no CUDA device takes the copies.
    """

    def __init__(self, *, pin: bool) -> None:
        self.pin = pin
        self.buffers: list[torch.Tensor] = []  # [0]: the main buffer; the rest: this step's overflow
        self.used = 0  # bytes cut from the main buffer this step
        self.step_bytes = 0  # bytes this step took in all (aligned)
        self.high_water = 0
        self.allocations = 0  # host buffers ever allocated (the tests read it)

    @property
    def capacity(self) -> int:
        """Bytes of the main buffer."""
        return self.buffers[0].numel() if self.buffers else 0

    @property
    def held(self) -> int:
        """Host bytes held now (every buffer)."""
        return sum(b.numel() for b in self.buffers)

    def _allocate(self, nbytes: int) -> torch.Tensor:
        if not self.pin:
            self.allocations += 1
            return torch.empty(nbytes, dtype=torch.uint8)
        # page-aligned start and length for cudaHostRegister: two pages more than asked, the view cut inside
        raw = torch.empty(nbytes + 2 * PAGE_BYTES, dtype=torch.uint8)
        start = -raw.data_ptr() % PAGE_BYTES
        length = -(-nbytes // PAGE_BYTES) * PAGE_BYTES
        buf = raw[start:start + length]
        err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), length, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of {length} host bytes failed ({err}): the node's host memory or "
                               "its locked-memory limit (ulimit -l) is too small for the offloaded tensors; train "
                               "with less offloaded (layers_kept_on_device) or without activation_offloading")
        self.allocations += 1
        return buf[:nbytes]

    def _free(self, buf: torch.Tensor) -> None:
        if self.pin:
            torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())

    def take(self, nbytes: int) -> torch.Tensor:
        """A ``[nbytes]`` uint8 slice for one tensor: from the main buffer, else a new exactly sized buffer."""
        size = int(slab_bytes(nbytes))
        self.step_bytes += size
        if self.buffers and self.used + size <= self.capacity:
            out = self.buffers[0][self.used:self.used + nbytes]
            self.used += size
            return out
        buf = self._allocate(size)
        if not self.buffers:  # the first tensor ever: it starts the main buffer
            self.used = size
        self.buffers.append(buf)
        return buf[:nbytes]

    def reset(self) -> None:
        """Start a step: every slice is free again. With overflow last step, one buffer of the high water replaces
        them all (the caller has waited for every copy)."""
        self.high_water = max(self.high_water, self.step_bytes)
        if len(self.buffers) > 1 or (self.buffers and self.capacity < self.high_water):
            for buf in self.buffers:
                self._free(buf)
            self.buffers = [self._allocate(self.high_water)]
            logger.info("hf_hsap: activation offloading holds %.3f GiB of host memory for a step's saved tensors",
                        self.high_water / 2**30)
        self.used = 0
        self.step_bytes = 0


class SlabOffload(torch.autograd.graph.saved_tensors_hooks):
    """Saved tensors of every forward to the host slab, back to the device in backward (module docstring).

    Args:
        model: the model (its parameters are never offloaded).
        device_type: where the activations live (default: the current accelerator). ``"cpu"`` offloads CPU
            tensors into an unpinned slab with no streams: the copies and their bookkeeping are then checked on a
            machine without an accelerator; it saves no memory.
        min_offload_bytes: smaller tensors stay.

    Use ``with offload:`` around each forward + backward (entering starts a step).
    """

    def __init__(self, model: nn.Module | None = None, *, device_type: str | None = None,
                 min_offload_bytes: int = MIN_OFFLOAD_BYTES) -> None:
        if device_type is None:
            device_type = torch.accelerator.current_accelerator().type
        self.device_type = device_type
        self.streams = device_type == "cuda"
        self.slab = HostSlab(pin=self.streams)
        self.min_offload_bytes = min_offload_bytes
        self.param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()} if model is not None \
            else set()
        self.side = torch.cuda.Stream() if self.streams else None
        self.offloaded = 0  # tensors moved to the host this step (the tests read it)
        self.seen: dict[tuple, tuple[Any, _Offloaded]] = {}  # a tensor saved again: its first copy (while alive)
        super().__init__(self._pack, self._unpack)

    def _keeps(self, t: torch.Tensor) -> bool:
        """Whether ``t`` stays where it is (module docstring)."""
        if t.device.type != self.device_type or isinstance(t, nn.Parameter) or type(t) is not torch.Tensor:
            return True
        if t.numel() * t.element_size() < self.min_offload_bytes:
            return True
        if t.untyped_storage().data_ptr() in self.param_storages:
            return True
        return _span(t) > MAX_SPAN_OVERHEAD * t.numel()

    def _pack(self, t: torch.Tensor) -> Any:
        if self._keeps(t):
            return t
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t._version)
        first = self.seen.get(key)
        if first is not None and first[0]() is not None:  # the first tensor alive: the same storage, unchanged
            return first[1]
        span = _span(t)
        flat = torch.as_strided(t, (span,), (1,), t.storage_offset())  # the storage the tensor covers
        host = self.slab.take(span * t.element_size()).view(t.dtype)
        if self.streams:
            self.side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.side):
                host.copy_(flat, non_blocking=True)
            t.record_stream(self.side)  # its memory is not reused before the copy is done
        else:
            host.copy_(flat)
        self.offloaded += 1
        packed = _Offloaded(host, t.shape, t.stride(), t.device)
        self.seen[key] = (weakref.ref(t), packed)
        return packed

    def _unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Offloaded):
            return packed
        buf = torch.empty(packed.host.numel(), dtype=packed.host.dtype, device=packed.device)
        if self.streams:
            self.side.wait_stream(torch.cuda.current_stream())  # the buffer is allocated on the compute stream
            with torch.cuda.stream(self.side):
                buf.copy_(packed.host, non_blocking=True)
            torch.cuda.current_stream().wait_stream(self.side)
        else:
            buf.copy_(packed.host)
        return torch.as_strided(buf, packed.shape, packed.stride)

    def __enter__(self) -> "SlabOffload":
        self.slab.reset()
        self.offloaded = 0
        self.seen.clear()
        return super().__enter__()

    def __exit__(self, *args: Any) -> None:
        try:
            if self.streams:
                self.side.synchronize()  # every copy of the step done before its slices are reused
        finally:
            super().__exit__(*args)


class _Offloaded:
    """A saved tensor's host copy and how to rebuild it on the device."""

    __slots__ = ("host", "shape", "stride", "device")

    def __init__(self, host: torch.Tensor, shape: torch.Size, stride: tuple[int, ...], device: torch.device) -> None:
        self.host, self.shape, self.stride, self.device = host, shape, stride, device


def _span(t: torch.Tensor) -> int:
    """Elements of storage from ``t``'s first element to its last (its strides' extent)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))


def slab_offload_context(model: nn.Module) -> Any:
    """The context :func:`~.levers.apply_memory_levers` returns for ``activation_offloading`` (one per model)."""
    ctx = SlabOffload(model)
    return lambda: ctx


