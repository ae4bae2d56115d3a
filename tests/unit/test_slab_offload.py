"""hf_hsap's activation offloading (``hf_hsap.memory.offload``): every saved tensor of a step cut from one host slab
of exactly the step's bytes, the gradients unchanged.

On this CPU machine the context runs with ``device_type="cpu"`` (CPU tensors offloaded into an unpinned slab, no
streams): the copies, the strides, the slab's sizes and reuse are what is checked here; the CUDA run (pinned slab,
side stream) is ``tests/cuda/check_slab_offload.py`` in ``scripts/gpu_check.sh``.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hf_hsap.memory.offload import ALIGN_BYTES, HostSlab, SlabOffload, slab_bytes


class _Stack(nn.Module):
    """Three checkpointed blocks (each saves only its input), as a decoder under gradient checkpointing."""

    def __init__(self, width: int = 24) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
                                    for _ in range(3))

    def forward(self, x: torch.Tensor, ckpt: bool = True) -> torch.Tensor:
        for block in self.blocks:
            x = x + (checkpoint(block, x, use_reentrant=False) if ckpt else block(x))
        return x


def _grads(model: nn.Module, x: torch.Tensor, ctx, ckpt: bool = True) -> list[torch.Tensor]:
    model.zero_grad()
    with ctx:
        (model(x, ckpt) ** 2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("ckpt", [True, False])
def test_gradients_are_those_without_offloading(ckpt: bool) -> None:
    torch.manual_seed(0)
    model = _Stack().double()
    x = torch.randn(2, 40, 24, dtype=torch.float64)
    want = _grads(model, x, torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t), ckpt)
    offload = SlabOffload(model, device_type="cpu")
    got = _grads(model, x, offload, ckpt)
    assert offload.offloaded > 0
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_the_slab_holds_exactly_the_steps_bytes_and_is_reused() -> None:
    torch.manual_seed(0)
    model = _Stack()
    offload = SlabOffload(model, device_type="cpu")
    x = torch.randn(1, 37, 24)  # 37 * 24 * 4 = 3552 bytes per checkpoint: not a power of two
    _grads(model, x, offload)
    first = offload.slab.step_bytes
    assert offload.offloaded == 4  # the three blocks' inputs (each saved once, by its checkpoint) and the squared output
    assert first == 4 * slab_bytes(37 * 24 * 4) == 4 * 3584  # exact bytes, 512-aligned
    assert offload.slab.allocations == 4  # first step: one exactly sized buffer per tensor
    _grads(model, x, offload)
    assert offload.slab.held == first  # consolidated into one buffer of the step's bytes
    assert offload.slab.allocations == 5
    _grads(model, x, offload)
    assert offload.slab.allocations == 5 and offload.slab.held == first  # reused, nothing allocated again
    longer = torch.randn(1, 50, 24)
    _grads(model, longer, offload)  # a longer row overflows once
    _grads(model, longer, offload)
    assert offload.slab.held == 4 * slab_bytes(50 * 24 * 4)


def test_parameters_and_small_tensors_stay_broadcast_views_move_their_storage() -> None:
    offload = SlabOffload(nn.Linear(4, 4), device_type="cpu", min_offload_bytes=64)
    w = nn.Parameter(torch.randn(64, 64))
    small = torch.randn(3, requires_grad=True)
    broad = torch.randn(64, 1, requires_grad=True).expand(64, 64)  # stride 0: 64 stored elements show 4096
    big = torch.randn(64, 64, requires_grad=True)
    with offload:
        (w * big).sum().backward()
        (small * small).sum().backward()
        y = broad * big
        y.sum().backward()
    # w * big saves w (a parameter: stays) and big (copied); small * small is under 64 bytes; broad * big saves
    # broad (a broadcast view: its 64 stored elements move, not the 4096 it shows) and big again (alive and
    # unchanged: its first copy serves, no second one)
    assert offload.offloaded == 2
    assert offload.slab.step_bytes == slab_bytes(64 * 64 * 4) + slab_bytes(64 * 4)


def test_strided_views_come_back_with_their_strides() -> None:
    offload = SlabOffload(None, device_type="cpu", min_offload_bytes=0)
    base = torch.randn(8, 6, dtype=torch.float64, requires_grad=True)
    with offload:
        v = base[1:7].t()  # a transposed view at storage offset 6
        assert v.storage_offset() == 6 and not v.is_contiguous()
        v.sin().sum().backward()
    grad_offloaded = base.grad.clone()
    base.grad = None
    base[1:7].t().sin().sum().backward()
    assert torch.equal(grad_offloaded, base.grad)
    assert offload.offloaded == 1


def test_host_slab_alignment_and_overflow() -> None:
    slab = HostSlab(pin=False)
    a = slab.take(100)
    b = slab.take(1000)
    assert a.numel() == 100 and b.numel() == 1000
    assert slab.step_bytes == ALIGN_BYTES + 2 * ALIGN_BYTES
    slab.reset()
    assert slab.held == slab.capacity == 3 * ALIGN_BYTES
    c, d = slab.take(100), slab.take(1000)
    assert d.data_ptr() - c.data_ptr() == ALIGN_BYTES  # cut end to end from one buffer
