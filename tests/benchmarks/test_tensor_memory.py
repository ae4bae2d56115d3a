"""benchmarks.tensor_memory.TensorPeak: the exact peak of the tensors a block allocates (the peers' memory figure)."""
import torch

from benchmarks.tensor_memory import TensorPeak


def test_peak_and_live_bytes_follow_allocations_and_frees():
    with TensorPeak() as m:
        a = torch.empty(1000)  # 4000 B
        b = torch.ones(500)  # 2000 B: 6000 live
        del a  # 2000 live
        c = torch.zeros(2000)  # 8000 B: 10000 live, the peak
        assert m.live_bytes == 10000
        del b, c
    assert m.peak_bytes == 10000
    assert m.live_bytes == 0
    assert m.at_peak == [(8000, "aten.zeros.default"), (2000, "aten.ones.default")]


def test_views_and_in_place_results_of_existing_tensors_are_not_counted():
    x = torch.randn(1000)
    with TensorPeak() as m:
        y = x.view(10, 100).t()
        x.add_(1.0)
        y.mul_(2.0)
    assert m.peak_bytes == 0


def test_a_transient_is_counted_even_when_freed_inside_one_expression():
    x = torch.randn(256)
    with TensorPeak() as m:
        s = (x * 2.0).sum()  # the 1024-byte product lives until sum() has read it
    assert m.peak_bytes == 1024 + 4
    assert s.numel() == 1


def test_backward_allocations_are_counted():
    x = torch.randn(1000, requires_grad=True)
    with TensorPeak() as m:
        y = (x * x).sum()
        y.backward()
    # forward: x * x (4000 B, dropped once summed); backward: grad * x twice (4000 B each) and their sum, x.grad
    # (4000 B), while the loss and its seed gradient (4 B each) are alive
    assert m.peak_bytes == 3 * 4000 + 2 * 4
    assert [op for _, op in m.at_peak[:3]] == ["aten.mul.Tensor", "aten.mul.Tensor", "aten.add.Tensor"]
    assert x.grad is not None and torch.allclose(x.grad, 2 * x.detach())
