"""One round pipeline: the order in which the runtime really talks to its executor equals the steps the
cost model simulates (:mod:`hf_hsap.plan.pipeline`), for a sweep of plans.

The executed order is recorded outside the runtime: an executor wrapper logs every ``transfer`` (a post
or a return, by tag) and every ``wait`` on what it returned (a wait or a collect), and a kernel wrapper
logs the local item (the only causal item). The simulated order is ``forward_steps`` / ``backward_steps``
of the shape the planner's simulation uses (``pipeline_shape(n_rounds, budget is not None)``).
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import hf_hsap
from hf_hsap.comm.loopback import LoopbackHub
from hf_hsap.kernels.cpu import TorchCPUFlashKernel
from hf_hsap.kernels.math import MathKernel
from hf_hsap.plan.pipeline import (COLLECT, COMPUTE, LOCAL, POST, RETURN, WAIT, Step, backward_steps, forward_steps,
                                   pipeline_shape, simulate_steps)
from hf_hsap.runtime import sap_backward, sap_forward


class _RecordedPending:
    def __init__(self, inner, log: list[Step], step: Step) -> None:
        self._inner, self._log, self._step = inner, log, step

    def wait(self) -> torch.Tensor:
        self._log.append(self._step)
        return self._inner.wait()


class _RecordingExecutor:
    """Wraps an executor: logs ``post t`` / ``return t`` at each transfer and ``wait t`` / ``collect t``
    when the caller waits on it (tags: ``2t`` fetch, ``2t + 1`` return)."""

    def __init__(self, inner, log: list[Step]) -> None:
        self._inner, self._log = inner, log

    def transfer(self, send, send_splits, recv_rows, recv_splits, tag: int = 0):
        t, is_return = divmod(tag, 2)
        self._log.append(Step(RETURN if is_return else POST, t))
        pending = self._inner.transfer(send, send_splits, recv_rows, recv_splits, tag=tag)
        return _RecordedPending(pending, self._log, Step(COLLECT if is_return else WAIT, t))


def _recording_kernel(base, log: list[Step]):
    """``base``'s kernel with the local (causal) item logged; in-place methods only if ``base`` has them."""

    class Recording(type(base)):
        def forward(self, q, k, v, spec, scale):
            if spec.causal:
                log.append(Step(LOCAL))
            return super().forward(q, k, v, spec, scale)

        def backward(self, dout, q, k, v, out, lse, *, spec, scale):
            if spec.causal:
                log.append(Step(LOCAL))
            return super().backward(dout, q, k, v, out, lse, spec=spec, scale=scale)

    if hasattr(base, "forward_into"):
        class RecordingInPlace(Recording):
            def forward_into(self, q, k, v, **kwargs):
                if kwargs["causal"]:
                    log.append(Step(LOCAL))
                return super().forward_into(q, k, v, **kwargs)

            def backward_into(self, dout, q, k, v, out, lse, **kwargs):
                if kwargs["causal"]:
                    log.append(Step(LOCAL))
                return super().backward_into(dout, q, k, v, out, lse, **kwargs)

        return RecordingInPlace()
    return Recording()


def _executed(plan, kernel_cls) -> list[tuple[list[Step], list[Step]]]:
    """Per part, the (forward, backward) steps the runtime executed on a loopback hub."""
    T, H, D = plan.total_tokens, 2, 4
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(T, H, D, generator=g, dtype=torch.float64) for _ in range(4))
    hub = LoopbackHub(plan.n_parts, timeout_s=30.0)
    logs = [([], []) for _ in range(plan.n_parts)]
    lock = threading.Lock()

    def part_fn(p: int) -> None:
        idx = plan.local_token_indices(p)
        ql, kl, vl, dl = (x.index_select(0, idx) for x in (q, k, v, dout))
        sched = plan.schedule(p)
        fwd_log, bwd_log = logs[p]
        with lock:
            ex = hub.executor(p)
        out, lse, recvs = sap_forward(ql, kl, vl, sched=sched, executor=_RecordingExecutor(ex, fwd_log),
                                      kernel=_recording_kernel(kernel_cls(), fwd_log), scale=D ** -0.5)
        sap_backward(dl, ql, kl, vl, out, lse, recvs=recvs, sched=sched, executor=_RecordingExecutor(ex, bwd_log),
                     kernel=_recording_kernel(kernel_cls(), bwd_log), scale=D ** -0.5)

    hub.run(part_fn)
    return logs


def _visible(steps) -> list[Step]:
    """What the executor and kernel wrappers can see: every step but ``compute``."""
    return [s for s in steps if s.op != COMPUTE]


_SWEEP = [(lengths_seed, P, placement, rounds, budget)
          for lengths_seed, P, placement, rounds, budget in [
              (0, 2, "contiguous", "batched", None), (1, 3, "zigzag", "by_peer", None),
              (2, 4, "balanced", "by_peer", 23), (3, 4, "zigzag", "batched", 17), (4, 5, "auto", "auto", None),
              (5, 3, "zigzag", "by_peer", 7), (6, 2, "balanced", "batched", 1000), (7, 6, "zigzag", "by_peer", 40),
              (8, 4, "contiguous", "auto", 11), (9, 1, "balanced", "batched", None)]]


@pytest.mark.parametrize("seed,P,placement,rounds,budget", _SWEEP)
@pytest.mark.parametrize("kernel_cls", [TorchCPUFlashKernel, MathKernel], ids=["in_place", "gathered"])
def test_executed_order_is_the_simulated_order(seed, P, placement, rounds, budget, kernel_cls) -> None:
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([rng.integers(1, 30, size=8), rng.integers(60, 160, size=2)])
    rng.shuffle(lengths)
    plan = hf_hsap.plan_sequence(np.concatenate([[0], np.cumsum(lengths)]), P, placement, rounds=rounds,
                                 recv_budget_tokens=budget)
    shape = pipeline_shape(plan.pieces.n_rounds, budget is not None)  # what the cost model simulates
    assert plan.shape == shape
    want_fwd, want_bwd = _visible(forward_steps(shape)), _visible(backward_steps(shape))
    for p, (fwd, bwd) in enumerate(_executed(plan, kernel_cls)):
        assert plan.schedule(p).shape == shape
        has_local = plan.schedule(p).local_item is not None
        drop_local = (lambda s: s) if has_local else (lambda s: [x for x in s if x.op != LOCAL])
        assert fwd == drop_local(want_fwd), f"part {p} forward"
        assert bwd == drop_local(want_bwd), f"part {p} backward"


def test_sweep_covers_every_shape() -> None:
    """The sweep above reaches eager, double-buffered with refetch, and a budget with a single round."""
    seen = set()
    for seed, P, placement, rounds, budget in _SWEEP:
        rng = np.random.default_rng(seed)
        lengths = np.concatenate([rng.integers(1, 30, size=8), rng.integers(60, 160, size=2)])
        rng.shuffle(lengths)
        plan = hf_hsap.plan_sequence(np.concatenate([[0], np.cumsum(lengths)]), P, placement, rounds=rounds,
                                     recv_budget_tokens=budget)
        s = plan.shape
        seen.add((plan.recv_budget_tokens is not None, s.refetch, s.n_rounds))
    assert any(not bounded and not refetch and n > 1 for bounded, refetch, n in seen)  # all posted at once
    assert any(bounded and refetch and n > 1 for bounded, refetch, n in seen)  # double buffering, refetch
    assert (True, False, 1) in seen  # a budget that fits one round: the buffer is kept, no refetch
    assert (False, False, 0) in seen  # one rank: nothing moves


def test_steps_by_hand() -> None:
    eager = pipeline_shape(3, bounded=False)
    assert [repr(s) for s in forward_steps(eager)] == [
        "post 0", "post 1", "post 2", "local", "wait 0", "compute 0", "wait 1", "compute 1", "wait 2", "compute 2"]
    assert [repr(s) for s in backward_steps(eager)] == [
        "compute 0", "return 0", "local", "compute 1", "return 1", "compute 2", "return 2",
        "collect 0", "collect 1", "collect 2"]
    bounded = pipeline_shape(3, bounded=True)
    assert [repr(s) for s in forward_steps(bounded)] == [
        "post 0", "local", "wait 0", "post 1", "compute 0", "wait 1", "post 2", "compute 1", "wait 2", "compute 2"]
    assert [repr(s) for s in backward_steps(bounded)] == [
        "post 0", "wait 0", "post 1", "compute 0", "return 0", "local", "wait 1", "post 2", "compute 1",
        "collect 0", "return 1", "wait 2", "compute 2", "collect 1", "return 2", "collect 2"]
    one = pipeline_shape(1, bounded=True)  # one round fits the budget: kept, not fetched again
    assert not one.refetch and [repr(s) for s in backward_steps(one)] == ["compute 0", "return 0", "local", "collect 0"]
    assert [repr(s) for s in backward_steps(pipeline_shape(0, bounded=False))] == ["local"]


def test_simulation_follows_the_steps() -> None:
    """Swapping two steps changes the simulated time: the simulator really runs the step list."""
    local, xfer, work = np.array([4.0, 0.0]), np.array([[0.0], [3.0]]), np.array([[0.0], [2.0]])
    peers = np.zeros((1, 2, 2), dtype=bool)
    peers[0, 1, 0] = True
    steps = forward_steps(pipeline_shape(1, bounded=False))  # post 0, local, wait 0, compute 0
    assert simulate_steps(steps, local, xfer, work, peers).tolist() == [4.0, 5.0]  # max(0, 3) + 2
    late = (Step(LOCAL), Step(POST, 0), Step(WAIT, 0), Step(COMPUTE, 0))  # posted only after the local item
    assert simulate_steps(late, local, xfer, work, peers).tolist() == [4.0, 9.0]  # part 0 posts at 4: 4 + 3 + 2


def test_a_budget_that_fits_one_round_is_simulated_as_run() -> None:
    """A budget larger than every round: the runtime keeps the one buffer (no refetch), and ``rounds="auto"``
    now prices exactly that. The previous simulator charged a backward refetch the runtime never did, and
    picked ``by_peer`` here."""
    cu = np.concatenate([[0], np.cumsum([1377, 9338])])
    plan = hf_hsap.plan_sequence(cu, 4, "balanced", recv_budget_tokens=10**9)
    assert plan.round_order == "batched" and plan.pieces.n_rounds == 1 and not plan.shape.refetch
    small = hf_hsap.plan_sequence(np.concatenate([[0], np.cumsum([130, 90, 40])]), 3, "zigzag", rounds="batched",
                                  recv_budget_tokens=10**9)
    q, k, v, dout = (torch.randn(260, 2, 4, dtype=torch.float64) for _ in range(4))
    from hf_hsap.loopback import run_plan_loopback

    *_, stats = run_plan_loopback(small, q, k, v, dout, kernel=MathKernel())
    recv = small.stats().recv_kv_tokens
    for p, s in enumerate(stats):  # KV fetched once, plus the dK/dV rows that come back
        assert s.rows_recv == recv[p] + sum(int(r.send_index.shape[0]) for r in small.schedule(p).rounds)
