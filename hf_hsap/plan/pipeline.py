"""The round pipeline: in which order one part posts, awaits, consumes and returns its rounds.

One description, two interpreters: the runtime (``sap_forward`` / ``sap_backward``) executes the steps, and
:func:`simulate_steps` times them by dataflow for the cost model (a test checks that they agree). Steps
(:class:`Step`, ``t`` a round): ``post t`` starts round ``t``'s KV transfer, ``wait t`` blocks until it has landed,
``local`` runs the part's own item (while KV is in flight), ``compute t`` the remote items of round ``t``; in the
backward, ``return t`` sends round ``t``'s dK/dV to their owners and ``collect t`` awaits and adds this part's.

:func:`pipeline_shape` is the one rule: without a receive budget every round is posted at once and kept for the
backward; with one, rounds are double-buffered and the backward fetches the KV again (unless there is one round).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

POST, WAIT, LOCAL, COMPUTE, RETURN, COLLECT = "post", "wait", "local", "compute", "return", "collect"
OPS = (POST, WAIT, LOCAL, COMPUTE, RETURN, COLLECT)


@dataclass(frozen=True)
class Step:
    """One step of a part's pipeline: ``op`` (one of :data:`OPS`) on round ``round`` (-1 for ``local``)."""

    op: str
    round: int = -1

    def __repr__(self) -> str:
        return self.op if self.round < 0 else f"{self.op} {self.round}"


@dataclass(frozen=True)
class PipelineShape:
    """How a part with ``n_rounds`` rounds runs (:func:`pipeline_shape`)."""

    n_rounds: int
    fetch_ahead: int  # rounds the forward posts before it consumes the first (n_rounds: all at once)
    refetch: bool  # the backward fetches the KV again (the forward keeps no receive buffer)
    returns_in_flight: int  # dK/dV returns the backward lets travel before it awaits the oldest

    @property
    def keep_recv(self) -> bool:
        """The forward keeps its receive buffers for the backward."""
        return not self.refetch


def pipeline_shape(n_rounds: int, bounded: bool) -> PipelineShape:
    """The one rule for how rounds run (module docstring); ``bounded``: the plan has a receive budget."""
    if not bounded:
        return PipelineShape(n_rounds, n_rounds, False, max(n_rounds, 1))
    return PipelineShape(n_rounds, 1, n_rounds > 1, 1)


def forward_steps(shape: PipelineShape) -> tuple[Step, ...]:
    """The forward's steps: post ``fetch_ahead`` rounds, run the local item, then per round wait for it, post the
    next one not yet posted, and consume it."""
    n, ahead = shape.n_rounds, max(shape.fetch_ahead, 1)
    steps = [Step(POST, t) for t in range(min(ahead, n))] + [Step(LOCAL)]
    for t in range(n):
        steps.append(Step(WAIT, t))
        if t + ahead < n:
            steps.append(Step(POST, t + ahead))
        steps.append(Step(COMPUTE, t))
    return tuple(steps)


def backward_steps(shape: PipelineShape) -> tuple[Step, ...]:
    """The backward's steps: per round (refetch: wait for its KV, post the next fetch) compute it, await the oldest
    return once ``returns_in_flight`` are travelling, send its dK/dV back; the local item runs after round 0's
    return has left; the returns still travelling are collected at the end."""
    n, depth = shape.n_rounds, max(shape.returns_in_flight, 1)
    if n == 0:
        return (Step(LOCAL),)
    steps = [Step(POST, 0)] if shape.refetch else []
    travelling: list[int] = []
    for t in range(n):
        if shape.refetch:
            steps.append(Step(WAIT, t))
            if t + 1 < n:
                steps.append(Step(POST, t + 1))
        steps.append(Step(COMPUTE, t))
        while len(travelling) >= depth:
            steps.append(Step(COLLECT, travelling.pop(0)))
        steps.append(Step(RETURN, t))
        travelling.append(t)
        if t == 0:
            steps.append(Step(LOCAL))
    steps += [Step(COLLECT, t) for t in travelling]
    return tuple(steps)


def run_steps(steps: Sequence[Step], handlers: Mapping[str, Callable[[int], None]]) -> None:
    """Call ``handlers[step.op](step.round)`` for every step, in order (ops without a handler are skipped)."""
    for s in steps:
        h = handlers.get(s.op)
        if h is not None:
            h(s.round)


def simulate_steps(steps: Sequence[Step], local: np.ndarray, xfer: np.ndarray, work: np.ndarray,
                   peers: np.ndarray, ret: np.ndarray | None = None, *, start: np.ndarray | None = None) -> np.ndarray:
    """``[R]`` each part's clock after running ``steps`` (every part runs the same steps). A transfer starts when
    both ends have posted it and both ends' links are free; a return, when both ends have sent it. Waiting moves a
    part's clock to the arrival; compute adds to it.

    Shapes (times): local ``[R]`` the local item. xfer ``[R, n]`` round ``t``'s transfer into each part (0: none).
    work ``[R, n]`` the remote items. peers ``[n, R, R]`` bool (dst, src). ret ``[R, n]`` the dK/dV returning to each
    part (backward). start ``[R]`` when each part reaches its first step (default 0).
    """
    R, n = xfer.shape
    clock = np.zeros(R) if start is None else np.array(start, dtype=np.float64)
    link = np.zeros(R)  # when each part's link delivered its latest fetch
    posted: dict[int, np.ndarray] = {}
    back: dict[int, np.ndarray] = {}

    def senders_max(mask: np.ndarray, x: np.ndarray) -> np.ndarray:  # [R] max of x over each row's senders
        return np.where(mask, x, -np.inf).max(axis=1) if R else x  # (faster than max(where=))

    def post(t: int) -> None:
        posted[t] = clock.copy()

    def wait(t: int) -> None:
        nonlocal clock, link
        ready = np.maximum(posted.pop(t), link)  # [R] posted and its link free, per part
        begin = np.maximum(ready, senders_max(peers[t], ready))  # both ends ready
        has = xfer[:, t] > 0
        arrive = np.where(has, begin + xfer[:, t], -np.inf)
        link = np.where(has, arrive, link)
        clock = np.maximum(clock, arrive)

    def run_local(_: int) -> None:
        nonlocal clock
        clock = clock + local

    def compute(t: int) -> None:
        nonlocal clock
        clock = clock + work[:, t]

    def send_return(t: int) -> None:
        assert ret is not None, "a backward simulation needs ret"
        launch = clock  # returns travel src <- dst: part p gets back from the parts it fed in round t
        back[t] = np.where(ret[:, t] > 0, np.maximum(launch, senders_max(peers[t].T, launch)) + ret[:, t], -np.inf)

    def collect(t: int) -> None:
        nonlocal clock
        clock = np.maximum(clock, back.pop(t))

    run_steps(steps, {POST: post, WAIT: wait, LOCAL: run_local, COMPUTE: compute, RETURN: send_return,
                      COLLECT: collect})
    return clock


STEADY_LAYERS = (1, 1)  # simulate_layers: layers run before the measured ones, layers measured


def simulate_layers(steps: Sequence[Step], local: np.ndarray, xfer: np.ndarray, work: np.ndarray,
                    peers: np.ndarray, ret: np.ndarray | None, *, before: np.ndarray, after: np.ndarray,
                    layers: tuple[int, int] = STEADY_LAYERS) -> np.ndarray:
    """``[R]`` each part's time per layer once consecutive layers run ``steps`` in steady state: each part starts
    layer ``l + 1`` (its ``before`` work, e.g. q/k/v projections) when done with layer ``l`` (its ``after`` work),
    not in lockstep, so only the transfers tie the parts together, as in a deep model.

    Args:
        steps: one layer's steps. local, xfer, work, peers, ret: as :func:`simulate_steps`. before, after: ``[R]``
            each part's own work before / after the steps. layers: ``(warm-up layers, measured layers)``.
    """
    warm, measured = layers
    clock = np.zeros(len(local))
    mark = clock
    for layer in range(warm + measured):
        if layer == warm:
            mark = clock
        clock = simulate_steps(steps, local, xfer, work, peers, ret, start=clock + before) + after
    return (clock - mark) / measured
