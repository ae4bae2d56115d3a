"""The whole SAP runtime of a plan in one process (``run_plan_loopback``: one thread per part) against
the float64 reference: out, lse, dq, dk, dv, and the bytes moved equal the plan's. The same harness runs
on a lent GPU in ``tests/cuda``."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import rel_err

import hf_hsap
from hf_hsap.comm.loopback import LoopbackHub
from hf_hsap.loopback import run_plan_loopback
from hf_hsap.comm.p2p import HSAPCommError
from hf_hsap.kernels import MathKernel, TorchCPUFlashKernel, reference_attention


class GatheredKernel:
    """The CPU kernel without its in-place methods: the runtime gathers each item's rows into packed
    segments, as it does for a GPU kernel."""

    name = "gathered"

    def __init__(self) -> None:
        self.inner = TorchCPUFlashKernel()

    def forward(self, *args):
        return self.inner.forward(*args)

    def backward(self, *args, **kw):
        return self.inner.backward(*args, **kw)


class CountingKernel(TorchCPUFlashKernel):
    """The CPU kernel counting its calls by path (in place / gathered)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = {"in_place": 0, "gathered": 0}
        self.plain = TorchCPUFlashKernel()  # its forward uses its own forward_into, not counted

    def forward(self, *args):
        self.calls["gathered"] += 1
        return self.plain.forward(*args)

    def forward_into(self, *args, **kw):
        self.calls["in_place"] += 1
        return super().forward_into(*args, **kw)


def _inputs(T: int, hq: int, hkv: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(T, h, d, generator=g, dtype=torch.float64) for h in (hq, hkv, hkv, hq)]


@pytest.mark.parametrize("P,placement,rounds,budget", [
    (2, "contiguous", "batched", None), (3, "balanced", "by_peer", None), (4, "zigzag", "by_peer", 37),
    (4, "auto", "batched", 50), (5, "balanced", "auto", None)])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("path", ["in_place", "gathered"])
def test_loopback_matches_reference(P: int, placement: str, rounds: str, budget: int | None, seed: int,
                                    path: str) -> None:
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([rng.integers(1, 40, size=12), rng.integers(80, 300, size=2)])
    rng.shuffle(lengths)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    plan = hf_hsap.plan_sequence(cu, P, placement, rounds=rounds, recv_budget_tokens=budget)
    q, k, v, dout = _inputs(int(cu[-1]), 4, 2, 8, seed)
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    ref_out, ref_lse = reference_attention(qr, kr, vr, torch.from_numpy(cu))
    ref_grads = torch.autograd.grad(ref_out, (qr, kr, vr), dout)
    kernel = TorchCPUFlashKernel() if path == "in_place" else GatheredKernel()
    out, lse, dq, dk, dv, stats = run_plan_loopback(plan, q, k, v, dout, kernel=kernel)
    for got, want in zip((out, lse, dq, dk, dv), (ref_out, ref_lse, *ref_grads)):
        assert rel_err(got, want) < 1e-10
    # forward KV rows (once, or again in the backward under a budget) plus the dK/dV rows returned
    recv_kv = plan.stats().recv_kv_tokens
    fetches = 1 if budget is None else 2
    for p, s in enumerate(stats):
        assert s.rows_recv == fetches * recv_kv[p] + sum(int(r.send_index.shape[0]) for r in plan.schedule(p).rounds)
        if budget is not None:
            assert s.max_recv_rows <= budget


def test_loopback_with_the_math_kernel_and_one_part() -> None:
    cu = np.array([0, 5, 70, 71, 130])
    q, k, v, dout = _inputs(130, 2, 2, 4, 3)
    ref_out, _ = reference_attention(q, k, v, torch.from_numpy(cu))
    for P in (1, 3):
        out, *_ = run_plan_loopback(hf_hsap.plan_sequence(cu, P, "zigzag"), q, k, v, dout, kernel=MathKernel())
        assert rel_err(out, ref_out) < 1e-10


def test_loopback_times_out_instead_of_hanging() -> None:
    hub = LoopbackHub(2, timeout_s=0.2)

    def fn(p: int) -> None:
        ex = hub.executor(p)
        if p == 0:  # part 0 expects a message part 1 never sends
            ex.transfer(torch.zeros(0, 2), (), 3, ((1, 0, 3),), tag=0).wait()

    with pytest.raises(HSAPCommError, match="no message from part 1"):
        hub.run(fn)


@pytest.mark.parametrize("max_runs", [0, 1, 2, 64])
def test_row_gathers_by_runs_and_by_index_agree(monkeypatch, max_runs: int) -> None:
    """The runtime gathers and scatters rows by slices (views or concatenations of runs) or by
    ``index_select`` / ``index_add_`` beyond ``MAX_RUNS`` runs, and runs items in place unless they
    have more than ``MAX_RUNS`` segments; every mix gives the reference."""
    import hf_hsap.plan.schedule as schedule

    monkeypatch.setattr(schedule, "MAX_RUNS", max_runs)
    cu = np.concatenate([[0], np.cumsum([30, 3, 200, 7, 150, 64, 1, 90])])
    plan = hf_hsap.plan_sequence(cu, 4, "zigzag", rounds="batched")
    items = [it for p in range(4) for r in plan.schedule(p).rounds for it in r.items]
    for it in items:
        n_runs = 1 + int(np.count_nonzero(np.diff(it.q_index.numpy()) != 1))
        assert (it.q_runs is None) == (n_runs > max_runs)
    assert any(it.q_runs is not None for it in items) == (max_runs == 64)
    assert any(it.kv_runs is not None for it in items) == (max_runs == 64)
    for it in items:
        n_segs = sum(1 + int(np.count_nonzero(np.diff(it.kv_index.numpy()[a:b]) != 1))
                     for a, b in zip(it.spec.cu_k, it.spec.cu_k[1:]))
        assert (it.segments is None) == (n_segs > max_runs)
    q, k, v, dout = _inputs(int(cu[-1]), 4, 2, 8, 4)
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    ref_out, _ = reference_attention(qr, kr, vr, torch.from_numpy(cu))
    ref = torch.autograd.grad(ref_out, (qr, kr, vr), dout)
    kernel = CountingKernel()
    out, _, dq, dk, dv, _ = run_plan_loopback(plan, q, k, v, dout, kernel=kernel)
    for got, want in zip((out, dq, dk, dv), (ref_out, *ref)):
        assert rel_err(got, want) < 1e-10
    n_in_place = sum(it.segments is not None for it in items) + 4  # + the local items
    assert kernel.calls == {"in_place": n_in_place, "gathered": len(items) + 4 - n_in_place}


class WindowGatheredKernel(GatheredKernel):
    """:class:`GatheredKernel` declaring windows and soft-capping (the GPU path of a windowed schedule)."""

    supports_window = True
    supports_softcap = True

    def forward(self, *args, **kw):
        return self.inner.forward(*args, **kw)

    def backward(self, *args, **kw):
        return self.inner.backward(*args, **kw)


@pytest.mark.parametrize("P,placement,window,softcap", [
    (3, "zigzag", 5, 2.0), (3, "balanced", 13, None), (4, "contiguous", 1, 3.0), (4, "auto", 40, None),
    (2, "zigzag", 2, None)])
@pytest.mark.parametrize("kernel_name", ["gathered", "math", "in_place"])
def test_windowed_loopback_matches_reference(P: int, placement: str, window: int, softcap: float | None,
                                             kernel_name: str) -> None:
    """A windowed plan's schedule (diagonal item, local cross-segment blocks, remote full / anti blocks) on the
    gathered path a GPU takes, on the math kernel and in place, with soft-capping: out, lse, dq, dk, dv exact,
    and the forward receiving exactly the kind's minimum."""
    rng = np.random.default_rng(window)
    lengths = np.concatenate([rng.integers(1, 30, size=6), rng.integers(60, 160, size=2)])
    cu = np.concatenate([[0], np.cumsum(lengths)])
    plan = hf_hsap.plan_sequence(cu, P, placement, windows=[window, None])
    q, k, v, dout = _inputs(int(cu[-1]), 4, 2, 8, window)
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    ref_out, ref_lse = reference_attention(qr, kr, vr, torch.from_numpy(cu), window=window, softcap=softcap)
    ref_grads = torch.autograd.grad(ref_out, (qr, kr, vr), dout)
    kernel = {"gathered": WindowGatheredKernel, "math": MathKernel, "in_place": TorchCPUFlashKernel}[kernel_name]()
    out, lse, dq, dk, dv, stats = run_plan_loopback(plan, q, k, v, dout, kernel=kernel, window=window,
                                                    softcap=softcap)
    for got, want in zip((out, lse, dq, dk, dv), (ref_out, ref_lse, *ref_grads)):
        assert rel_err(got, want, floor=1e-3) < 1e-10  # window 1: dq = dk = 0 by mathematics (rounding noise)
    recv = plan.stats(window=window).recv_kv_tokens
    assert sum(recv) <= sum(plan.stats(window=None).recv_kv_tokens)
    assert window > 5 or sum(recv) < sum(plan.stats(window=None).recv_kv_tokens)
    for p, s in enumerate(stats):
        sent_back = sum(int(r.send_index.shape[0]) for r in plan.schedule(p, window=window).rounds)
        assert s.rows_recv == recv[p] + sent_back


def test_a_kernel_without_window_support_is_refused() -> None:
    """A kernel of the older contract (no supports_window) would compute full attention on a windowed item:
    refused before anything runs."""
    plan = hf_hsap.plan_sequence([0, 50, 90], 2, "zigzag", windows=[4])
    q, k, v, dout = _inputs(90, 2, 1, 8, 0)
    with pytest.raises(ValueError, match="does not declare sliding windows"):
        hf_hsap.varlen_attention(q, k, v, [0, 50, 90], window=4, kernel=GatheredKernel())
    sp = hf_hsap.init_sequence_parallel(1)
    one = hf_hsap.plan_sequence([0, 50, 90], sp, windows=[4])
    with pytest.raises(ValueError, match="does not declare sliding windows"):
        hf_hsap.hsap_attn_func(q, k, v, one, window=4, kernel=GatheredKernel())
    assert plan.windows == (4,)
