"""Run a recurrent token mixer segment by segment, handing each split document's state to its next holder.

A :class:`SegmentOp` computes one segment from its initial state (``None``: the document's start, the zero state)
and returns the segment's output and final state. :func:`run_segments` runs every segment of a
:class:`~hf_hsap.plan.chain.Chain`:

- no state crosses ranks (packed rows at SP 1, or no split document): a plain loop under autograd, every segment
  from the zero state;
- states cross ranks: the chain's steps in order, each step's final states sent to the ranks that continue their
  documents (one batched point-to-point exchange per step with traffic). The backward runs the steps in reverse
  and sends each initial state's gradient back to the rank it came from (:class:`_HandOff`), so every rank issues
  the same exchanges in the same order and autograd never has to order collectives.

Written by hand: no library hands recurrent states between the ranks of a sequence-parallel group over
arbitrary (non-contiguous) document runs; fla's context parallelism assumes contiguous rank slices of one
sequence and CUDA kernels.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..comm.p2p import P2PExecutor
from ..plan.chain import Chain, Segment

__all__ = ["SegmentOp", "StateExchange", "run_segments", "run_with_final"]


@dataclass
class SegmentOp:
    """One mixer call cut into segments.

    Attributes:
        tensors: the call's tensor inputs (token tensors and parameters alike).
        token_dims: the token dimension of each tensor (``None``: not cut, e.g. a weight).
        fn: ``fn(tensors of the segment, init) -> (out, final)``: the segment's output and final state; ``init``
            is ``None`` at a document's start.
        out_dim: the token dimension of the output.
        state_shape, state_dtype: the state every hand-off moves (what a receiver allocates).
        rows: rows ``B`` of the batch; ``length``: tokens per row ``L`` (segments are over ``B * L``).
    """

    tensors: list[torch.Tensor]
    token_dims: list[int | None]
    fn: Callable[[list[torch.Tensor], torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]
    out_dim: int
    state_shape: tuple[int, ...]
    state_dtype: torch.dtype
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
    """Batched point-to-point exchange of fixed-shape states among the ranks of an SP group.

    Args:
        group: the SP process group. global_ranks: global rank of every SP rank. stats: the group's counters.
        timeout_s: the group's communication timeout.
    """

    def __init__(self, group: Any, global_ranks: Sequence[int], stats: Any = None,
                 timeout_s: float | None = None) -> None:
        self.executor = P2PExecutor(group, global_ranks, stats, timeout_s)

    def exchange(self, sends: list[tuple[int, int, torch.Tensor]], recvs: list[tuple[int, int]],
                 like: torch.Tensor) -> dict[int, torch.Tensor]:
        """Send ``(peer, doc, state)`` and receive one state per ``(peer, doc)`` (both sorted by peer, then doc).

        Args:
            sends: states to send. recvs: states to receive. like: ``[*state]`` a tensor of the states' shape,
                dtype and device.

        Returns:
            ``doc -> received state``.
        """
        sends = sorted(sends, key=lambda x: (x[0], x[1]))
        recvs = sorted(recvs)
        rows = torch.stack([s for _, _, s in sends]) if sends else like.new_empty((0, *like.shape))
        send_splits = _splits([p for p, _, _ in sends])
        recv_splits = _splits([p for p, _ in recvs])
        got = self.executor.transfer(rows.contiguous(), send_splits, len(recvs), recv_splits).wait()
        return {doc: got[i] for i, (_, doc) in enumerate(recvs)}


def _splits(peers: list[int]) -> list[tuple[int, int, int]]:
    """``(peer, offset, count)`` of consecutive equal peers."""
    out: list[tuple[int, int, int]] = []
    for i, p in enumerate(peers):
        if out and out[-1][0] == p:
            out[-1] = (p, out[-1][1], out[-1][2] + 1)
        else:
            out.append((p, i, 1))
    return out


def _cat(op: SegmentOp, chain: Chain, outs: list[torch.Tensor]) -> torch.Tensor:
    """The segments' outputs in local order, as ``[B, ..., L, ...]`` (rows stacked)."""
    per_row: list[list[torch.Tensor]] = [[] for _ in range(op.rows)]
    for seg, out in zip(chain.segments, outs):
        per_row[seg.start // op.length].append(out)
    return torch.cat([torch.cat(r, dim=op.out_dim) for r in per_row], dim=0)


def _run_local(op: SegmentOp, chain: Chain) -> torch.Tensor:
    """Every segment (each starts its document: no state crosses ranks) in local order under autograd."""
    return _cat(op, chain, [op.fn(op.cut(seg, op.tensors), None)[0] for seg in chain.segments])


def run_with_final(op: SegmentOp, chain: Chain) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`run_segments` on packed rows without SP, and the final state of every row's last document (what a
    cache keeps to continue the row: Transformers' evaluation and generation ask for it).

    Returns:
        ``(output, [B, *state])``.

    Raises:
        ValueError: states that cross ranks (under SP a rank's last state continues nothing of its own).
    """
    if chain.remote:
        raise ValueError("hf_hsap: a recurrent layer asked for its final state (use_cache=True) under SP; train "
                         "with use_cache=False (shard_batch's output sets it)")
    outs, last = [], {}
    for seg in chain.segments:
        out, final = op.fn(op.cut(seg, op.tensors), None)
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
        return _run_local(op, chain)
    if exchange is None:
        raise ValueError("hf_hsap: a split document's state must go to another rank, but no SP group was given")
    return _HandOff.apply(op, chain, exchange, *op.tensors)


class _HandOff(torch.autograd.Function):
    """The chain's steps in order (forward) and in reverse (backward), with their state exchanges."""

    @staticmethod
    def forward(ctx: Any, op: SegmentOp, chain: Chain, exchange: StateExchange, *tensors: torch.Tensor
                ) -> torch.Tensor:
        grad = any(t.requires_grad for t in tensors)
        leaves = [t.detach().requires_grad_(t.requires_grad) if d is None else t.detach()
                  for t, d in zip(tensors, op.token_dims)]
        like = tensors[0].new_zeros(op.state_shape, dtype=op.state_dtype)
        carry: dict[int, torch.Tensor] = {}
        outs: list[torch.Tensor | None] = [None] * len(chain.segments)
        saved: list[tuple] = [()] * len(chain.segments)
        for step in range(chain.steps):
            sends = []
            for i, seg in enumerate(chain.segments):
                if seg.step != step:
                    continue
                init = None
                if seg.prev >= 0:
                    init = carry.pop(seg.doc).detach().requires_grad_(grad)
                parts = [p.detach().requires_grad_(t.requires_grad) if d is not None else p
                         for p, t, d in zip(op.cut(seg, leaves), tensors, op.token_dims)]
                # the segment's own graph keeps its tensors: under activation checkpointing (or offloading) the
                # backward below would otherwise recompute the whole layer, state exchanges included, in a nested
                # graph task of its own, out of step with the other ranks
                with torch.set_grad_enabled(grad), torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
                    out, final = op.fn(parts, init)
                    final = final.to(op.state_dtype)
                outs[i] = out.detach()
                saved[i] = (parts, init, out, final)
                if seg.next >= 0:  # always another rank: a rank's consecutive runs are one segment
                    sends.append((seg.next, seg.doc, final.detach()))
            if chain.traffic[step]:
                recvs = [(s.prev, s.doc) for s in chain.segments if s.step == step + 1 and s.prev >= 0]
                carry.update(exchange.exchange(sends, recvs, like))
        ctx.op, ctx.chain, ctx.exchange, ctx.saved, ctx.leaves, ctx.like = op, chain, exchange, saved, leaves, like
        return _cat(op, chain, outs)  # type: ignore[arg-type]

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        op, chain, saved, leaves = ctx.op, ctx.chain, ctx.saved, ctx.leaves
        needs = ctx.needs_input_grad[3:]  # (op, chain, exchange, *tensors)
        grads = [torch.zeros_like(t) if d is not None and need else None
                 for t, d, need in zip(leaves, op.token_dims, needs)]
        grad_final: dict[int, torch.Tensor] = {}  # doc -> the gradient of its run's final state, from the next holder
        back: list[tuple[int, int, torch.Tensor]] = []  # (peer, doc, gradient of an initial state) to send
        for step in reversed(range(chain.steps)):
            if chain.traffic[step]:
                recvs = [(s.next, s.doc) for s in chain.segments if s.step == step and s.next >= 0]
                grad_final.update(ctx.exchange.exchange(back, recvs, ctx.like))
                back = []
            for i in reversed(range(len(chain.segments))):
                seg = chain.segments[i]
                if seg.step != step:
                    continue
                parts, init, out, final = saved[i]
                g_out = op.slice(seg, grad_out)
                outs, gs = [out], [g_out]
                g_fin = grad_final.pop(seg.doc, None) if seg.next >= 0 else None
                if g_fin is not None and final.requires_grad:
                    outs.append(final)
                    gs.append(g_fin.to(final.dtype))
                if out.requires_grad:
                    torch.autograd.backward(outs, gs)
                for j, (p, d) in enumerate(zip(parts, op.token_dims)):
                    if d is not None and grads[j] is not None and p.grad is not None:
                        op.slice(seg, grads[j], d).copy_(p.grad)
                if init is not None:
                    back.append((seg.prev, seg.doc, init.grad if init.grad is not None else torch.zeros_like(init)))
        param_grads = [leaf.grad if d is None and leaf.requires_grad else None
                       for leaf, d in zip(leaves, op.token_dims)]
        merged = [g if d is not None else pg for g, pg, d in zip(grads, param_grads, op.token_dims)]
        ctx.saved = None
        return (None, None, None, *merged)


def _keep(t: torch.Tensor) -> torch.Tensor:
    """Saved-tensor hook that keeps the tensor itself."""
    return t

