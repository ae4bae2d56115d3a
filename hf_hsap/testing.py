"""Test utilities: a pool of spawned gloo ranks that runs functions collectively, and a kernel check
against the float64 reference (:func:`check_kernel_against_reference`).

Spawning a process and importing torch costs seconds, so tests start a pool of ``world`` ranks
once and send it many tasks. Every task runs ``fn(*args)`` on every rank; results come back in
rank order; an exception on any rank is raised in the caller with its traceback; a task that takes
longer than ``timeout_s`` raises instead of hanging.
"""
from __future__ import annotations

import os
import queue
import socket
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch.multiprocessing as mp


def free_port() -> int:
    """A free TCP port on localhost."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_env() -> dict[str, str]:
    """The environment for a test's ``accelerate launch`` subprocess: offline, one thread per rank, and no
    user Accelerate config (the test names its own ``--config_file``)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    env.pop("ACCELERATE_CONFIG_FILE", None)
    return env


def _worker(rank: int, world: int, port: int, tasks, results, pg_timeout_s: float) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=pg_timeout_s))
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args = task
        try:
            results.put((rank, True, fn(*args)))
        except BaseException:  # noqa: BLE001 - report everything to the parent
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class DistPool:
    """``world`` spawned ranks on gloo, reused across tasks. Use as a context manager."""

    def __init__(self, world: int, timeout_s: float = 180.0, pg_timeout_s: float = 60.0) -> None:
        self.world = world
        self.timeout_s = timeout_s
        ctx = mp.get_context("spawn")
        self._tasks = [ctx.Queue() for _ in range(world)]
        self._results = ctx.Queue()
        port = free_port()
        self._procs = [ctx.Process(target=_worker, args=(r, world, port, self._tasks[r], self._results, pg_timeout_s),
                                   daemon=True) for r in range(world)]
        for p in self._procs:
            p.start()

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """Run ``fn(*args)`` on every rank; returns the results in rank order."""
        for q in self._tasks:
            q.put((fn, args))
        out: list[Any] = [None] * self.world
        errors = []
        for _ in range(self.world):
            try:
                rank, ok, val = self._results.get(timeout=self.timeout_s)
            except queue.Empty:
                self.close(force=True)
                raise TimeoutError(f"distributed task {fn.__name__} did not finish within {self.timeout_s}s")
            if ok:
                out[rank] = val
            else:
                errors.append(f"--- rank {rank} ---\n{val}")
        if errors:
            raise RuntimeError("distributed task failed:\n" + "\n".join(errors))
        return out

    def close(self, force: bool = False) -> None:
        if not force:
            for q in self._tasks:
                q.put(None)
        for p in self._procs:
            p.join(timeout=0 if force else 20)
            if p.is_alive():
                p.kill()

    def __enter__(self) -> "DistPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(force=exc[0] is not None)


def check_kernel_against_reference(kernel: Any, dtype: Any, shapes: list[tuple[int, int]], causal: bool, tol: float,
                                   *, device: Any = "cpu", heads: tuple[int, int, int] = (4, 2, 16),
                                   scale: float = 0.3, seed: int = 7) -> None:
    """Assert that a varlen kernel matches the float64 reference (out, lse, dq, dk, dv) on segments of
    ``shapes`` (``(Lq, Lk)`` each; bottom-right causal when ``causal``). Rows that see no key must have
    lse ``-inf`` and output 0. Errors are max-abs relative to the reference's largest magnitude.

    Args:
        kernel: an :class:`~hf_hsap.kernels.base.AttentionKernel`; dtype: the inputs' dtype.
        tol: largest relative error allowed; device: where the inputs live.
        heads: ``(Hq, Hkv, D)``; scale: softmax scale; seed: of the random inputs (drawn on the CPU).
    """
    import torch

    from .kernels import VarlenSpec, reference_varlen_attention

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        a, b = a.detach().double(), b.detach().double()
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))

    g = torch.Generator().manual_seed(seed)
    spec = VarlenSpec.from_lengths([a for a, _ in shapes], [b for _, b in shapes], causal)
    hq, hkv, d = heads
    q, dout = (torch.randn(spec.total_q, hq, d, generator=g).to(device) for _ in range(2))
    k, v = (torch.randn(spec.total_k, hkv, d, generator=g).to(device) for _ in range(2))
    qr, kr, vr = (x.double().requires_grad_(True) for x in (q, k, v))
    ref_out, ref_lse = reference_varlen_attention(qr, kr, vr, spec, scale)
    ref = torch.autograd.grad(ref_out, (qr, kr, vr), dout.double())
    q, k, v, dout = (x.to(dtype) for x in (q, k, v, dout))
    out, lse = kernel.forward(q, k, v, spec, scale)
    dq, dk, dv = kernel.backward(dout, q, k, v, out, lse, spec, scale)
    seen = torch.isfinite(ref_lse)
    assert lse.shape == ref_lse.shape and out.shape == ref_out.shape
    assert torch.equal(torch.isfinite(lse), seen), "rows that see no key must have lse -inf, the others finite"
    assert not bool(out[~seen].abs().any()), "rows that see no key must have output 0"
    assert rel(lse[seen], ref_lse[seen]) < tol
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), (ref_out, *ref)):
        assert got.dtype == dtype and got.shape == want.shape, name
        assert rel(got, want) < tol, f"{name}: {rel(got, want):.2e}"
