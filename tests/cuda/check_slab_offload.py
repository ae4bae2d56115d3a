"""hf_hsap's activation offloading on a GPU (run by ``scripts/gpu_check.sh``; skipped without CUDA): the slab is
page-locked through ``cudaHostRegister``, the side-stream copies give the gradients of the step without
offloading, bit for bit, and from the second step the slab holds exactly the step's offloaded bytes in one buffer
(``tests/unit/test_slab_offload.py`` checks the bookkeeping on CPU)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hf_hsap.memory.offload import SlabOffload, slab_bytes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class _Stack(nn.Module):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                                    for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + checkpoint(block, x, use_reentrant=False)
        return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_offloaded_step_gives_the_same_gradients_from_a_pinned_slab(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = _Stack(512, 6).to("cuda", dtype)
    x = torch.randn(3, 3001, 512, device="cuda", dtype=dtype)  # 3 * 3001 * 512 elements: no power of two

    def grads(ctx) -> list[torch.Tensor]:
        model.zero_grad()
        with ctx:
            (model(x).float() ** 2).mean().backward()
        torch.cuda.synchronize()
        return [p.grad.clone() for p in model.parameters()]

    want = grads(torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
    offload = SlabOffload(model)
    assert offload.device_type == "cuda" and offload.slab.pin
    for step in range(3):
        got = grads(offload)
        for g, w in zip(got, want):
            assert torch.equal(g, w), step
    per = slab_bytes(x.numel() * x.element_size())
    assert offload.slab.step_bytes >= 6 * per  # the six blocks' inputs, at least
    assert offload.slab.held == offload.slab.step_bytes  # one buffer of exactly the step's bytes
    assert len(offload.slab.buffers) == 1
    assert offload.slab.buffers[0].is_pinned()  # registered: page-locked without the caching allocator's rounding
