"""Subnormal floats are flushed while a split run's summary is computed on the CPU, and only then."""
from __future__ import annotations

import pytest
import torch

from hf_hsap.mixers.handoff import Summary, summaries
from hf_hsap.mixers.subnormals import flush_subnormals, flushing

TINY = 2.0 ** -130  # a float32 subnormal


def _tiny_product() -> float:
    return (torch.tensor([TINY], dtype=torch.float32) * 2.0).item()


def test_flush_inside_the_block_and_restored_after() -> None:
    assert not flushing()
    assert _tiny_product() == TINY * 2.0
    with flush_subnormals(torch.device("cpu")):
        assert flushing()
        assert _tiny_product() == 0.0
        # a transition far past float32's normal range comes out zero, not subnormal
        decay = torch.exp(torch.tensor([-0.7], dtype=torch.float32) * 130)
        assert decay.item() == 0.0  # exp(-91) is 2.9e-40 without the flush
    assert not flushing()
    assert _tiny_product() == TINY * 2.0


def test_a_thread_already_flushing_keeps_flushing() -> None:
    assert torch.set_flush_denormal(True)
    try:
        with flush_subnormals(torch.device("cpu")):
            assert flushing()
        assert flushing()
    finally:
        torch.set_flush_denormal(False)
    assert not flushing()


def test_other_devices_leave_the_cpu_mode_alone() -> None:
    with flush_subnormals(torch.device("meta")):
        assert not flushing()


def test_summaries_run_flushed_and_restore_on_error() -> None:
    class Stand:
        seen: list[bool] = []

        def summarize(self, parts: list[torch.Tensor]) -> Summary:
            self.seen.append(flushing())
            x = parts[0]
            return Summary(x, x.sum(-1), x.sum(-1))

    rec = Stand()
    out = summaries(rec, [[torch.ones(1, 3)], [torch.ones(1, 2)]])  # type: ignore[arg-type]
    assert rec.seen == [True, True] and len(out) == 2
    assert not flushing()

    class Boom(Stand):
        def summarize(self, parts: list[torch.Tensor]) -> Summary:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        summaries(Boom(), [[torch.ones(1, 3)]])  # type: ignore[arg-type]
    assert not flushing()
