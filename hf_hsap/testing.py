"""Test utilities: a pool of spawned gloo ranks that runs functions collectively (:class:`DistPool`, and
:class:`DistPools`, one pool per world size), the tests' relative error (:func:`rel_err`) and a kernel check
against the float64 reference (:func:`check_kernel_against_reference`), and :func:`run_ranks`, one subprocess per
rank of a command (the fault tests: each rank's pid and exit status, a deadline instead of a hang).

Spawning a process and importing torch costs seconds, so tests start a pool of ``world`` ranks
once and send it many tasks. Every task runs ``fn(*args)`` on every rank; results come back in
rank order; an exception on any rank is raised in the caller with its traceback; a task that takes
longer than ``timeout_s`` raises instead of hanging. The ranks meet through a ``file://`` rendezvous
on a fresh temporary file (no TCP port is picked, so nothing can take it first).
"""
from __future__ import annotations

import math
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

REL_ERR_TINY = 1e-300  # rel_err's smallest denominator: only keeps 0 / 0 defined


def rel_err(actual: torch.Tensor, expected: torch.Tensor, *, scale: torch.Tensor | None = None,
            floor: float = 0.0) -> float:
    """The tests' relative error: ``max |actual - expected| / max(max |scale|, floor, REL_ERR_TINY)``,
    computed in float64 (``scale`` defaults to ``expected``).

    ``scale`` is the magnitude the error is relative to (e.g. the whole global reference when ``expected``
    is one rank's shard of it); ``floor`` a smallest magnitude (for quantities that are 0 by mathematics and
    come out as rounding noise). Both all zero gives 0.0.

    Returns:
        the error, or ``inf`` when the shapes differ or when the result is not a number: a NaN or an
        infinity in either tensor (even at the same place) never passes a ``<= tol`` check.

    Raises:
        ValueError: on empty tensors (nothing compared must not pass).
    """
    if actual.shape != expected.shape:
        return float("inf")
    if actual.numel() == 0:
        raise ValueError("rel_err of empty tensors: nothing to compare")
    a, b = actual.detach().double(), expected.detach().double()
    s = b if scale is None else scale.detach().double()
    if s.numel() == 0:
        raise ValueError("rel_err with an empty scale")
    denom = max(float(s.abs().max()), floor, REL_ERR_TINY)
    err = float((a - b).abs().max()) / denom
    return err if math.isfinite(err) and math.isfinite(denom) else float("inf")


def free_port() -> int:
    """A free TCP port on localhost, for a launcher that needs a port number (``scripts/deepspeed_cpu_check.py``).

    Racy by nature: the port is free when this returns, and another process can bind it before the launcher
    does. :class:`DistPool` does not use it (``file://`` rendezvous). The ``accelerate launch`` tests pass
    ``--main_process_port 0``: Accelerate then picks a free port itself, the same race in a shorter window
    (no launcher option removes it).
    """
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


@dataclass
class RankResult:
    """One rank of :func:`run_ranks`: its exit status (negative: killed by that signal; ``None``: still running
    at the deadline, then killed) and its output (stdout and stderr)."""

    rank: int
    returncode: int | None
    output: str


def run_ranks(cmd: list[str], world: int, timeout_s: float, cwd: str | os.PathLike[str] | None = None,
              env: dict[str, str] | None = None) -> list[RankResult]:
    """Run ``cmd`` as ``world`` ranks of one job on this machine, without a launcher: each rank is its own
    subprocess with ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT`` (what
    ``torchrun`` sets; Accelerate and ``torch.distributed`` read them). Unlike ``accelerate launch``, a rank that
    dies does not take the others down: the test sees what each survivor does by itself.

    Args:
        cmd: the command of every rank. world: ranks. timeout_s: the deadline for all of them; a rank still
            running then is killed (SIGKILL) and reported with ``returncode`` None.
        cwd, env: of the subprocesses (default: this process's working directory and :func:`launch_env`).

    Returns:
        One :class:`RankResult` per rank, in rank order.
    """
    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="hsap-ranks-"))
    procs: list[subprocess.Popen] = []
    files: list[Any] = []
    codes: list[int | None] = []
    try:
        for r in range(world):
            renv = dict(env if env is not None else launch_env(), RANK=str(r), LOCAL_RANK=str(r),
                        WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port))
            files.append((logs / f"rank{r}.log").open("w"))
            procs.append(subprocess.Popen(cmd, cwd=cwd, env=renv, stdout=files[-1], stderr=subprocess.STDOUT,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout_s
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for f in files:
            f.close()
    out = [RankResult(r, codes[r] if r < len(codes) else None, (logs / f"rank{r}.log").read_text(errors="replace"))
           for r in range(world)]
    shutil.rmtree(logs, ignore_errors=True)
    return out


def _worker(rank: int, world: int, init_method: str, tasks, results, pg_timeout_s: float) -> None:
    """One rank of a :class:`DistPool`: join the gloo group, then run tasks until ``None`` arrives."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
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
    results.close()
    results.join_thread()  # every result written to the pipe
    sys.stdout.flush()
    sys.stderr.flush()
    # skip the interpreter's teardown (module finalisation, which every pool's close would wait for): the rank holds
    # nothing that needs it once its group is gone and its results and output are flushed
    os._exit(0)


class DistPool:
    """``world`` spawned ranks on gloo, reused across tasks. Use as a context manager.

    Args:
        world: number of ranks; timeout_s: how long :meth:`run` waits for a task (then the pool is closed and
            ``TimeoutError`` raised: the hang guard of every test that uses it).
        pg_timeout_s: the process group's own timeout (collectives that never complete).
    """

    def __init__(self, world: int, timeout_s: float = 180.0, pg_timeout_s: float = 60.0) -> None:
        self.world = world
        self.timeout_s = timeout_s
        self._closed = False
        # file:// rendezvous on a fresh file in a fresh directory: unlike a TCP port picked in advance,
        # nothing else can take it; the directory goes on close (or when the pool is collected)
        self._rdzv_dir = tempfile.mkdtemp(prefix="hsap-pool-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._rdzv_dir, True)
        init_method = "file://" + os.path.join(self._rdzv_dir, "rendezvous")
        ctx = mp.get_context("spawn")
        self._tasks = [ctx.Queue() for _ in range(world)]
        self._results = ctx.Queue()
        self._procs = [ctx.Process(target=_worker, args=(r, world, init_method, self._tasks[r], self._results,
                                                         pg_timeout_s), daemon=True) for r in range(world)]
        for p in self._procs:
            p.start()

    @property
    def alive(self) -> bool:
        """Not closed, and every rank still running (a timeout or a dead rank ends the pool)."""
        return not self._closed and all(p.is_alive() for p in self._procs)

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
        if errors:  # the ranks may now be out of step in their groups: never hand this pool to another task
            self.close(force=True)
            raise RuntimeError("distributed task failed:\n" + "\n".join(errors))
        return out

    def close(self, force: bool = False) -> None:
        """Stop the ranks (``force``: kill them without asking) and remove the rendezvous directory."""
        if self._closed:
            return
        self._closed = True
        if not force:
            for q in self._tasks:
                q.put(None)
        for p in self._procs:
            p.join(timeout=0 if force else 20)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._cleanup()

    def __enter__(self) -> "DistPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(force=exc[0] is not None)


class DistPools:
    """One :class:`DistPool` per world size, started on first use and reused; a pool that ended (a task timed
    out, a rank died) is replaced by a fresh one on the next :meth:`get`. Call :meth:`close` at the end.

    Args:
        timeout_s: the pools' default task timeout; pg_timeout_s: their process groups' timeout.
    """

    def __init__(self, timeout_s: float = 180.0, pg_timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.pg_timeout_s = pg_timeout_s
        self._pools: dict[int, DistPool] = {}

    def get(self, world: int, timeout_s: float | None = None) -> DistPool:
        """The pool of ``world`` ranks (started, or replaced if it ended).

        Args:
            world: ranks. timeout_s: the task timeout to set on it (default: the pools').

        Returns:
            The :class:`DistPool`.
        """
        pool = self._pools.get(world)
        if pool is None or not pool.alive:
            if pool is not None:
                pool.close(force=True)
            pool = self._pools[world] = DistPool(world, self.timeout_s, self.pg_timeout_s)
        pool.timeout_s = self.timeout_s if timeout_s is None else timeout_s
        return pool

    __call__ = get

    def close(self) -> None:
        """Stop every pool."""
        for pool in self._pools.values():
            pool.close(force=not pool.alive)
        self._pools.clear()

    def __enter__(self) -> "DistPools":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def check_kernel_against_reference(kernel: Any, dtype: Any, shapes: list[tuple[int, int]], causal: bool, tol: float,
                                   *, device: Any = "cpu", heads: tuple[int, int, int] = (4, 2, 16),
                                   scale: float = 0.3, seed: int = 7) -> None:
    """Assert that a varlen kernel matches the float64 reference (out, lse, dq, dk, dv) on segments of
    ``shapes`` (``(Lq, Lk)`` each; bottom-right causal when ``causal``). Rows that see no key must have
    lse ``-inf`` and output 0. Errors are :func:`rel_err` (max-abs relative to the reference's largest magnitude).

    Args:
        kernel: an :class:`~hf_hsap.kernels.base.AttentionKernel`; dtype: the inputs' dtype.
        tol: largest relative error allowed; device: where the inputs live.
        heads: ``(Hq, Hkv, D)``; scale: softmax scale; seed: of the random inputs (drawn on the CPU).
    """
    from .kernels import VarlenSpec, reference_varlen_attention

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
    dq, dk, dv = kernel.backward(dout, q, k, v, out, lse, spec=spec, scale=scale)
    seen = torch.isfinite(ref_lse)
    assert lse.shape == ref_lse.shape and out.shape == ref_out.shape
    assert torch.equal(torch.isfinite(lse), seen), "rows that see no key must have lse -inf, the others finite"
    assert not bool(out[~seen].abs().any()), "rows that see no key must have output 0"
    assert rel_err(lse[seen], ref_lse[seen]) < tol
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), (ref_out, *ref)):
        assert got.dtype == dtype and got.shape == want.shape, name
        assert rel_err(got, want) < tol, f"{name}: {rel_err(got, want):.2e}"
