"""Run a recurrent token mixer over a rank's runs, all at once, with one summary exchange for split documents.

A :class:`Recurrence` is one kernel seen as an affine map of its initial state: a run from the zero state gives its
output and final state ``B``; a run that continues a document also gives its transition ``A`` (the final state is
``A S0 + B``) and what its output's correction reads (:meth:`Recurrence.summarize`, :meth:`Recurrence.correct`).
:func:`run_segments` runs every segment of a :class:`~hf_hsap.plan.chain.Chain`:

- no run continues one held by another rank (packed rows at SP 1, or no split document): every segment from the
  zero state under autograd;
- split documents (:class:`_Summaries`): every rank runs all its runs at once from the zero state; each run that a
  later run continues sends its summary ``(B, A)`` to every other rank holding a later run of its document (one
  batched point-to-point exchange per layer, however many ranks a document spans); each continued run folds the
  summaries of the runs before it, in order (``S = A_i S + B_i``), into its true initial state, and corrects its
  output. The backward mirrors it with one exchange: each rank differentiates its folds and corrections (small),
  sends the summaries' gradients back to the ranks they came from, then runs one local backward of its kernels.
  No rank waits for another rank's kernel in either direction.

Written by hand: no library folds recurrent states across the ranks of a sequence-parallel group over arbitrary
(non-contiguous, zigzag) document runs on CPU and GPU alike; fla's context parallelism assumes equal contiguous rank
slices, one continued sequence per rank, CUDA kernels and the delta rule only.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from ..comm.p2p import P2PExecutor
from ..plan.chain import Chain, Segment
from .edges import OutputEdge, run_inputs
from .subnormals import flush_subnormals

__all__ = ["Recurrence", "SegmentOp", "StateExchange", "Summary", "run_segments", "run_with_final", "summaries",
           "zero_runs"]


@dataclass
class Summary:
    """A run from the zero state.

    Attributes:
        out: its output. final: its final state ``B`` (the state dtype). transition: ``A`` (``None`` for a run that
        starts its document, whose initial state is zero). carry: what :meth:`Recurrence.correct` reads. A
        ``rerun`` recurrence's run that no later run continues leaves ``out``, ``final`` and ``transition`` ``None``.
    """

    out: torch.Tensor | None
    final: torch.Tensor | None
    transition: torch.Tensor | None = None
    carry: Any = None


class Recurrence(Protocol):
    """One recurrent kernel as an affine map of its initial state (the ops of :mod:`.ops` and :mod:`.scans`).

    Attributes:
        state_shape, transition_shape: ``[1, ...]`` shapes of one run's state and transition.
        state_dtype: the dtype states, transitions and folds use (float32 at least).
    """

    state_shape: tuple[int, ...]
    transition_shape: tuple[int, ...]
    state_dtype: torch.dtype

    def run(self, parts: list[torch.Tensor], init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(out, final state)`` of a run from ``init`` (``None``: the zero state)."""

    def summarize(self, parts: list[torch.Tensor]) -> Summary:
        """A continued run from the zero state, with its transition and what its correction reads."""

    # optional: ``run_many(parts_list)`` / ``summarize_many(parts_list, ends=...)``, the same for several runs in as
    # few kernel calls as padding allows (:func:`zero_runs`, :func:`summaries` fall back to one call per run); and
    # ``rerun = True``: a continued run's summary is taken without autograd, and its output is the kernel run again
    # from the true initial state under autograd (:class:`_Summaries`), where the summarising call's own backward
    # costs more. The summary then serves the folds and the initial state's gradient only (its correction without
    # ``out``), and a run that no later run continues (``ends``) needs no final state or transition either.

    def correct(self, summary: Summary, init: torch.Tensor) -> torch.Tensor:
        """The run's output from its true initial state ``init``."""

    def transit(self, transition: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """``A S``: the part of a run's final state that its initial state ``state`` contributes."""


@dataclass
class SegmentOp:
    """One mixer call cut into segments.

    Attributes:
        tensors: the call's tensor inputs (token tensors and parameters alike).
        token_dims: the token dimension of each tensor (``None``: not cut, e.g. a weight).
        recurrence: the kernel (its parts are the segment's slices of ``tensors``, in order).
        out_dim: the token dimension of the output.
        rows: rows ``B`` of the batch; ``length``: tokens per row ``L`` (segments are over ``B * L``).
    """

    tensors: list[torch.Tensor]
    token_dims: list[int | None]
    recurrence: Recurrence
    out_dim: int
    rows: int
    length: int

    def cut(self, seg: Segment, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The segment's slices of ``tensors`` (a tensor without a token dimension whole)."""
        return [t if d is None else self.slice(seg, t, d) for t, d in zip(tensors, self.token_dims)]

    def slice(self, seg: Segment, t: torch.Tensor, dim: int | None = None) -> torch.Tensor:
        """``t``'s slice of the segment: row ``start // L``, its columns along ``dim`` (default: the output's)."""
        row, a = divmod(seg.start, self.length)
        return t.narrow(0, row, 1).narrow(self.out_dim if dim is None else dim, a, seg.end - seg.start)


class StateExchange:
    """Batched point-to-point exchange of fixed-shape rows (summaries, their gradients) among an SP group's ranks.

    Args:
        group: the SP process group. global_ranks: global rank of every SP rank. stats: the group's counters.
        timeout_s: the group's communication timeout.
    """

    def __init__(self, group: Any, global_ranks: Sequence[int], stats: Any = None,
                 timeout_s: float | None = None) -> None:
        self.executor = P2PExecutor(group, global_ranks, stats, timeout_s)

    def exchange(self, sends: list[tuple[int, Any, torch.Tensor]], recvs: list[tuple[int, Any]],
                 like: torch.Tensor) -> dict[Any, torch.Tensor]:
        """Send ``(peer, key, row)`` and receive one row per ``(peer, key)``; both sides list a pair's rows in the
        same order (sorted by peer, then key).

        Args:
            sends: rows to send. recvs: rows to receive. like: ``[*row]`` a tensor of the rows' shape, dtype and
                device.

        Returns:
            ``key -> received row``.
        """
        sends = sorted(sends, key=lambda x: (x[0], x[1]))
        recvs = sorted(recvs)
        rows = torch.stack([s for _, _, s in sends]) if sends else like.new_empty((0, *like.shape))
        got = self.executor.transfer(rows.contiguous(), _splits([p for p, _, _ in sends]), len(recvs),
                                     _splits([p for p, _ in recvs])).wait()
        return {key: got[i] for i, (_, key) in enumerate(recvs)}


def _splits(peers: list[int]) -> list[tuple[int, int, int]]:
    """``(peer, offset, count)`` of consecutive equal peers."""
    out: list[tuple[int, int, int]] = []
    for i, p in enumerate(peers):
        if out and out[-1][0] == p:
            out[-1] = (p, out[-1][1], out[-1][2] + 1)
        else:
            out.append((p, i, 1))
    return out


def _cat(op: SegmentOp, chain: Chain, outs: list[torch.Tensor], *, dim: int | None = None) -> torch.Tensor:
    """The segments' tensors (outputs, or an input's gradients along its token dimension ``dim``; default: the
    output's) in local order, as ``[B, ..., L, ...]`` (rows stacked, contiguous; one segment's tensor uncopied
    where it is contiguous already)."""
    if len(outs) == 1:
        return outs[0].contiguous()
    per_row: list[list[torch.Tensor]] = [[] for _ in range(op.rows)]
    for seg, out in zip(chain.segments, outs):
        per_row[seg.start // op.length].append(out)
    d = op.out_dim if dim is None else dim
    return torch.cat([torch.cat(r, dim=d) for r in per_row], dim=0)


def run_with_final(op: SegmentOp, chain: Chain) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`run_segments` on packed rows without SP, and the final state of every row's last document (what a
    cache keeps to continue the row: Transformers' evaluation and generation ask for it).

    Returns:
        ``(output, [B, *state])``.

    Raises:
        ValueError: runs that continue runs of other ranks (under SP a rank's last state continues nothing of its
            own).
    """
    if chain.remote:
        raise ValueError("hf_hsap: a recurrent layer asked for its final state (use_cache=True) under SP; train "
                         "with use_cache=False (shard_batch's output sets it)")
    outs, last = [], {}
    runs = zero_runs(op.recurrence, [op.cut(seg, op.tensors) for seg in chain.segments])
    for seg, (out, final) in zip(chain.segments, runs):
        outs.append(out)
        last[seg.start // op.length] = final
    return _cat(op, chain, outs), torch.cat([last[r] for r in range(op.rows)], dim=0)


def run_segments(op: SegmentOp, chain: Chain, exchange: StateExchange | None) -> torch.Tensor:
    """The mixer's output over every local token.

    Args:
        op: the call. chain: this rank's segments. exchange: the SP group's exchange (``None`` at SP 1).

    Returns:
        the output, rows stacked and each row's segments in local order.
    """
    if chain.total != op.rows * op.length:
        raise ValueError(f"hf_hsap: a recurrent layer got {op.rows * op.length} tokens but the batch's layout has "
                         f"{chain.total}; call the model itself (its forward records the layout), with the "
                         "position_ids / shard_batch output of this batch")
    if not chain.remote:
        runs = zero_runs(op.recurrence, [op.cut(seg, op.tensors) for seg in chain.segments])
        return _cat(op, chain, [out for out, _ in runs])
    if exchange is None:
        raise ValueError("hf_hsap: a split document's summary must go to another rank, but no SP group was given")
    return _Summaries.apply(op, chain, exchange, *op.tensors)


def zero_runs(rec: Recurrence, parts: list[list[torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(out, final)`` of every run from the zero state: the recurrence's ``run_many``, else a call per run."""
    many = getattr(rec, "run_many", None)
    return many(parts) if many is not None else [rec.run(p, None) for p in parts]


def summaries(rec: Recurrence, parts: list[list[torch.Tensor]], *, ends: list[bool] | None = None) -> list[Summary]:
    """Every continued run's :class:`Summary`: the recurrence's ``summarize_many``, else a call per run; subnormal
    floats flushed on the CPU (a transition decays through them, :mod:`.subnormals`).

    Args:
        rec: the kernel. parts: each run's inputs. ends: per run, whether no later run continues it (a ``rerun``
            recurrence then summarises only what its correction reads); ``None``: every summary whole.
    """
    many = getattr(rec, "summarize_many", None)
    with flush_subnormals(parts[0][0].device):
        if many is None:
            return [rec.summarize(p) for p in parts]
        return many(parts, ends=ends) if ends is not None and getattr(rec, "rerun", False) else many(parts)


def _pack(rec: Recurrence, final: torch.Tensor, transition: torch.Tensor | None) -> torch.Tensor:
    """One exchange row: ``[B | A]`` flattened (``A`` zero for a run that starts its document)."""
    a = (transition.reshape(-1) if transition is not None
         else final.new_zeros(math.prod(rec.transition_shape)))
    return torch.cat([final.reshape(-1), a.to(final.dtype)])


def _unpack(rec: Recurrence, row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, A)`` of an exchange row."""
    n = math.prod(rec.state_shape)
    return row[:n].reshape(rec.state_shape), row[n:].reshape(rec.transition_shape)


class _Summaries(torch.autograd.Function):
    """Every run at once, one summary exchange, the folds and corrections (forward); the folds' and corrections'
    gradients, one exchange back, one local backward of the kernels (backward)."""

    @staticmethod
    def forward(ctx: Any, op: SegmentOp, chain: Chain, exchange: StateExchange, *tensors: torch.Tensor
                ) -> torch.Tensor:
        rec, segs = op.recurrence, chain.segments
        grad = any(t.requires_grad for t in tensors)
        rerun = bool(getattr(rec, "rerun", False))
        leaves = [t.detach().requires_grad_(t.requires_grad) if d is None else t.detach()
                  for t, d in zip(tensors, op.token_dims)]
        # each run's own graph keeps its tensors: under activation checkpointing (or offloading) the backward below
        # would otherwise recompute the whole layer, exchanges included, in a nested graph task out of step with the
        # other ranks
        with torch.set_grad_enabled(grad), torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
            parts, ctx.inputs = run_inputs(segs, op.cut, leaves, [t.requires_grad for t in tensors],
                                           op.token_dims)
            first = [i for i, seg in enumerate(segs) if not seg.continued]
            cont = [i for i, seg in enumerate(segs) if seg.continued]
            sums: list[Summary] = [None] * len(segs)  # type: ignore[list-item]
            for i, (out, final) in zip(first, zero_runs(rec, [parts[i] for i in first]) if first else []):
                sums[i] = Summary(out, final.to(rec.state_dtype))
            with torch.set_grad_enabled(grad and not rerun):
                got_sums = summaries(rec, [parts[i] for i in cont], ends=[not segs[i].later for i in cont]
                                     ) if cont else []
            for i, s in zip(cont, got_sums):
                if rerun and s.final is not None:  # leaves: their gradients reach the kernel through the rerun
                    s.final = s.final.detach().requires_grad_(grad)
                    s.transition = s.transition.detach().requires_grad_(grad)
                sums[i] = s
            like = tensors[0].new_zeros(math.prod(rec.state_shape) + math.prod(rec.transition_shape),
                                        dtype=rec.state_dtype)
            mine = {(seg.doc, seg.run): s for seg, s in zip(segs, sums)}
            sends = [(p, (doc, run), _pack(rec, mine[doc, run].final, mine[doc, run].transition).detach())
                     for p, doc, run in chain.sends()]
            got = exchange.exchange(sends, [(p, (doc, run)) for p, doc, run in chain.receives()], like)
            received = {key: row.detach().requires_grad_(grad) for key, row in got.items()}
            outs: list[torch.Tensor | None] = []
            states, reruns = {}, {}
            for k, (seg, s) in enumerate(zip(segs, sums)):
                if not seg.continued:
                    outs.append(s.out)
                    continue
                state = None
                for i, holder in enumerate(seg.earlier):  # the runs before, in order
                    if holder == chain.rank:
                        b, a = mine[seg.doc, i].final, mine[seg.doc, i].transition
                    else:
                        b, a = _unpack(rec, received[seg.doc, i])
                    state = b if state is None else rec.transit(a, state) + b
                if not rerun:
                    outs.append(rec.correct(s, state))
                    continue
                # the output itself: the kernel from the true initial state, its graph kept for backward; the
                # correction the initial state's gradient reads is formed in backward from the folded state
                outs.append(None)
                states[k] = state
                with torch.set_grad_enabled(grad):
                    reruns[k] = rec.run(parts[k], state.detach())
        result = _cat(op, chain, [reruns[k][0].detach() if k in reruns else o.detach() for k, o in enumerate(outs)])
        for s in sums:  # the outputs are read at their edges; a correction's graph keeps what it reads
            s.out = None
            s.carry = s.carry if rerun else None
        # the call without its tensors, which the plain model may free once the kernels have copied what they need
        ctx.op, ctx.chain, ctx.exchange, ctx.like, ctx.rerun = replace(op, tensors=[]), chain, exchange, like, rerun
        ctx.params = [t if d is None else None for t, d in zip(leaves, op.token_dims)]
        ctx.sums, ctx.received, ctx.states = sums, received, states
        ctx.outs = [OutputEdge.of(o) for o in outs]
        ctx.reruns = {k: (OutputEdge.of(o), OutputEdge.of(f)) for k, (o, f) in reruns.items()}
        return result

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        op, chain, rec = ctx.op, ctx.chain, ctx.op.recurrence
        segs, outs, received = chain.segments, ctx.outs, ctx.received
        g_outs = [op.slice(seg, grad_out) for seg in segs]
        # 1. the gradients of the summaries this rank received (and, rerun, of its own runs' summaries, which later
        # runs here may fold: a rerun output is cut from its initial state, so the folds carry that gradient):
        # through its folds and corrections only (a rerun run's correction formed here: its initial state's term)
        lin: dict[int, OutputEdge | None] = {}
        with torch.enable_grad():
            for i, seg in enumerate(segs):
                if seg.continued and i in ctx.states:
                    lin[i] = OutputEdge.of(rec.correct(Summary(None, None, None, ctx.sums[i].carry), ctx.states[i]))
                elif seg.continued:
                    lin[i] = outs[i]
        cont = [i for i, y in lin.items() if y is not None]
        local = [(i, y) for i in (range(len(segs)) if ctx.rerun else ())
                 for y in (ctx.sums[i].final, ctx.sums[i].transition) if y is not None and y.requires_grad]
        keys = list(received)
        back: dict[Any, torch.Tensor] = {}
        local_gb: dict[int, torch.Tensor] = {}
        if (keys or local) and cont:
            gs = torch.autograd.grad([lin[i].edge for i in cont], [received[k] for k in keys] + [y for _, y in local],
                                     [g_outs[i].to(lin[i].dtype) for i in cont], retain_graph=True,
                                     allow_unused=True)
            back = {k: g if g is not None else torch.zeros_like(received[k]) for k, g in zip(keys, gs)}
            for (i, y), g in zip(local, gs[len(keys):]):
                if g is not None and y is ctx.sums[i].final:
                    local_gb[i] = g
        # 2. one exchange: each gradient back to the rank its summary came from; the gradients of the summaries this
        # rank sent, summed over their receivers
        sends = [(p, (doc, run), back.get((doc, run), torch.zeros_like(ctx.like))) for p, doc, run in
                 chain.receives()]
        sent = chain.sends()
        got = ctx.exchange.exchange(sends, [(p, ((doc, run), p)) for p, doc, run in sent], ctx.like)
        g_rows: dict[tuple[int, int], torch.Tensor] = {}
        for (key, _), row in got.items():
            g_rows[key] = row if key not in g_rows else g_rows[key] + row
        # 3. one local backward of every run: output gradients and the summaries' gradients together
        ys, gys = [], []
        for i, (seg, s) in enumerate(zip(segs, ctx.sums)):
            g = g_rows.get((seg.doc, seg.run))
            if i in ctx.reruns:
                g_final = None if g is None else _unpack(rec, g)[0]
                if i in local_gb:
                    g_final = local_gb[i] if g_final is None else g_final + local_gb[i]
                for y, gy in _rerun_pairs(ctx.reruns[i], g_out=g_outs[i], g_final=g_final):
                    ys.append(y)
                    gys.append(gy)
                continue
            if outs[i] is not None:
                ys.append(outs[i].edge)
                gys.append(g_outs[i].to(outs[i].dtype))
            gb, ga = _unpack(rec, g) if g is not None else (None, None)
            if i in local_gb:  # its final state, folded by a rerun run here
                gb = local_gb[i] if gb is None else gb + local_gb[i]
            for y, gy in ((s.final, gb), (s.transition, ga)):
                if gy is not None and y is not None and y.requires_grad:
                    ys.append(y)
                    gys.append(gy.to(y.dtype))
        token_inputs = [(j, x) for run in ctx.inputs for j, x in enumerate(run) if x is not None]
        param_leaves = [(j, t) for j, t in enumerate(ctx.params) if t is not None and t.requires_grad]
        inputs = [x.edge for _, x in token_inputs] + [t for _, t in param_leaves]
        grads = torch.autograd.grad(ys, inputs, gys, allow_unused=True) if ys and inputs else [None] * len(inputs)
        per_run: dict[int, list[torch.Tensor]] = {}  # an input's gradient per run (every run cuts every input)
        for (j, x), g in zip(token_inputs, grads):
            per_run.setdefault(j, []).append(g if g is not None else x.zeros())
        merged: list[torch.Tensor | None] = [None] * len(op.token_dims)
        for j, gs_j in per_run.items():  # the runs tile the rows: their gradients joined, not copied into zeros
            merged[j] = _cat(op, chain, gs_j, dim=op.token_dims[j])
        for (j, _), g in zip(param_leaves, grads[len(token_inputs):]):
            merged[j] = g
        needs = ctx.needs_input_grad[3:]  # (op, chain, exchange, *tensors)
        ctx.inputs = ctx.sums = ctx.outs = ctx.received = ctx.reruns = ctx.states = None
        return (None, None, None, *[g if need else None for g, need in zip(merged, needs)])


def _rerun_pairs(rerun: tuple[OutputEdge | None, OutputEdge | None], *, g_out: torch.Tensor,
                 g_final: torch.Tensor | None) -> list[tuple[Any, torch.Tensor]]:
    """A continued run's backward through its kernel rerun from its true initial state (forward): ``(output, its
    gradient)`` and ``(final state, its gradient)``, what its summary's gradients amount to. Every consumer folds
    ``S' = A S0 + B`` with the same ``S0``, so the transition's gradient is the final state's times ``S0^T``: the
    rerun's ``A S0 + B`` carries both (edge and gradient pairs for the one local backward)."""
    out, final = rerun
    pairs = [(out.edge, g_out.to(out.dtype))] if out is not None else []
    if g_final is not None and final is not None:
        pairs.append((final.edge, g_final.to(final.dtype)))
    return pairs


def _keep(t: torch.Tensor) -> torch.Tensor:
    """Saved-tensor hook that keeps the tensor itself."""
    return t
