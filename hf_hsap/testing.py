"""Test utilities: a pool of spawned gloo ranks that runs functions collectively.

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
