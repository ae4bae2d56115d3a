"""Executing a compiled schedule: forward and backward of SAP attention over the inter peers.

Forward: post the KV transfers (every round at once without a receive budget; with one, round 0 and
then each next round when the previous has landed: double buffering) and compute the local item
while they are in flight; then, per round, wait for its KV and run the round's remote items,
merging them into the output by log-sum-exp in fp32.

Backward, per round: the remote items' gradients (dQ locally, dK/dV into the receive-buffer
gradient), then the dK/dV go back to their owners along the reverse transfers while the next rounds
(and the local item's backward) are computed; they are added once the last round is done (with a
receive budget: before the next round's return, so at most two are in flight). Gradients are
accumulated in fp32 (fp64 for fp64 inputs) on both sides and travel in ``grad_dtype`` (default: the
inputs' dtype, like every other gradient that crosses ranks in training).

Both directions use :meth:`P2PExecutor.transfer`; every transfer that may overlap another has its
own tag.
"""
from __future__ import annotations

import torch

from .comm.p2p import P2PExecutor
from .kernels.base import AttentionKernel, lse_dtype, merge_partial
from .plan.schedule import Round, Runs, Schedule, WorkItem


def _in_place(kernel: AttentionKernel, item: WorkItem) -> bool:
    """Run ``item`` on the un-gathered tensors (:class:`~hf_hsap.kernels.base.InPlaceKernel`): no row
    gathers, scatters or per-item gradient buffers. Other kernels (one varlen launch on a GPU) get
    the item's rows gathered into packed segments."""
    return item.segments is not None and hasattr(kernel, "forward_into")


def _by_runs(x: torch.Tensor, runs: Runs | None) -> bool:
    """Move rows by slices: always for one run (a view); for several only on CPU, where slicing copies
    at memcpy speed, while on a GPU one index kernel beats a launch per run."""
    return runs is not None and (len(runs) == 1 or x.device.type == "cpu")


def _take(x: torch.Tensor, idx: torch.Tensor | None, runs: Runs | None = None) -> torch.Tensor:
    """Rows ``idx`` of ``x`` (``x`` itself when ``idx`` is None): a view for one run of consecutive rows,
    a concatenation of slices for a few runs (CPU), else ``index_select``. ``[N, ...] -> [n, ...]``."""
    if idx is None:
        return x
    if _by_runs(x, runs):
        if len(runs) <= 1:
            return x[runs[0][0]:runs[0][1]] if runs else x[:0]
        return torch.cat([x[a:b] for a, b in runs])
    return x.index_select(0, idx.to(x.device))


def _put_rows(x: torch.Tensor, idx: torch.Tensor, runs: Runs | None, rows: torch.Tensor) -> None:
    """``x[idx] = rows`` (in place)."""
    if not _by_runs(x, runs):
        x.index_copy_(0, idx.to(x.device), rows)
        return
    off = 0
    for a, b in runs:
        x[a:b] = rows[off:off + b - a]
        off += b - a


def _add_rows(acc: torch.Tensor, idx: torch.Tensor | None, runs: Runs | None, rows: torch.Tensor) -> None:
    """``acc[idx] += rows`` (in place, in ``acc``'s dtype; a row listed twice gets both added)."""
    if idx is None:
        acc.add_(rows)
    elif not _by_runs(acc, runs):
        acc.index_add_(0, idx.to(acc.device), rows.to(acc.dtype))
    else:
        off = 0
        for a, b in runs:
            acc[a:b].add_(rows[off:off + b - a])
            off += b - a


def _fetch_tag(t: int) -> int:
    return 2 * t


def _return_tag(t: int) -> int:
    return 2 * t + 1


def _start_fetch(executor: P2PExecutor, kv: torch.Tensor, rnd: Round, t: int):
    send = _take(kv, rnd.send_index, rnd.send_runs)  # [n_send, 2*Hkv, D]
    return executor.transfer(send, rnd.send_splits, rnd.recv_total, rnd.recv_splits, tag=_fetch_tag(t))


def sap_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sched: Schedule, executor: P2PExecutor | None,
    kernel: AttentionKernel, scale: float, keep_recv: bool,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Forward of one part.

    Args:
        q: ``[T_part, Hq, D]``; k, v: ``[T_part, Hkv, D]`` (the part's tokens in plan order).
        sched: the part's compiled schedule. executor: its inter peers (None without rounds).
        keep_recv: return the receive buffers for the backward (else it fetches them again).

    Returns:
        out ``[T_part, Hq, D]`` (q's dtype), lse ``[T_part, Hq]`` (fp32/fp64), receive buffers
        ``[recv_total, 2*Hkv, D]`` per round (empty list unless ``keep_recv``).
    """
    hkv = k.shape[1]
    acc = lse_dtype(q.dtype)
    kv = torch.cat([k, v], dim=1) if sched.rounds else None  # [T_part, 2*Hkv, D]: one message per peer
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=acc, device=q.device)
    kept: list[torch.Tensor] = []

    def local() -> None:
        nonlocal out, lse
        item = sched.local_item
        if item is not None and _in_place(kernel, item):
            kernel.forward_into(q, k, v, item.segments, item.spec.causal, scale, out, lse, fresh=True)
        elif item is not None:
            o, l = kernel.forward(q, k, v, item.spec, scale)
            out, lse = o.to(acc), l.to(acc)

    rounds = sched.rounds
    # No budget (keep_recv): every round is posted now and consumed in order, so round t's items start
    # as soon as round t lands. A budget bounds the buffers: double buffering, round t + 1 posted when
    # round t has landed.
    ahead = len(rounds) if sched.keep_recv else 1
    pending = [_start_fetch(executor, kv, rnd, t) for t, rnd in enumerate(rounds[:ahead])]  # during local()
    local()
    for t, rnd in enumerate(rounds):
        recv = pending.pop(0).wait()
        if t + ahead < len(rounds):  # double buffering: the next round while this one computes
            pending.append(_start_fetch(executor, kv, rounds[t + ahead], t + ahead))
        for item in rnd.items:
            if _in_place(kernel, item):
                kernel.forward_into(q, recv[:, :hkv], recv[:, hkv:], item.segments, item.spec.causal, scale, out, lse)
                continue
            kvi = _take(recv, item.kv_index, item.kv_runs)  # [n_k, 2*Hkv, D]
            q_i, o_i, l_i = (_take(x, item.q_index, item.q_runs) for x in (q, out, lse))
            o, l = kernel.forward(q_i, kvi[:, :hkv], kvi[:, hkv:], item.spec, scale)
            m_o, m_l = merge_partial(o_i, l_i, o, l)
            _put_rows(out, item.q_index, item.q_runs, m_o)
            _put_rows(lse, item.q_index, item.q_runs, m_l)
        if keep_recv:
            kept.append(recv)
    return out.to(q.dtype), lse, kept


def sap_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, recvs: list[torch.Tensor], sched: Schedule, executor: P2PExecutor | None,
    kernel: AttentionKernel, scale: float, grad_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of one part (shapes as :func:`sap_forward`; ``out``/``lse`` are the final values).

    Args:
        grad_dtype: dtype of the dK/dV partial sums sent back to their owners (default ``k.dtype``;
            ``torch.float32`` sends the fp32 accumulators: twice the bytes in bf16 training, one
            rounding fewer).

    Returns:
        dq ``[T_part, Hq, D]``, dk, dv ``[T_part, Hkv, D]`` in the inputs' dtypes; partial sums are
        accumulated in fp32 (fp64 for fp64 inputs).
    """
    hkv = k.shape[1]
    acc = lse_dtype(q.dtype)
    grad_dtype = grad_dtype or k.dtype
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dkv = torch.zeros((k.shape[0], 2 * hkv, k.shape[2]), dtype=acc, device=k.device)  # [T_part, 2*Hkv, D]

    def local() -> None:
        item = sched.local_item
        if item is not None and _in_place(kernel, item):
            kernel.backward_into(dout, q, k, v, out, lse, item.segments, item.spec.causal, scale,
                                 dq, dkv[:, :hkv], dkv[:, hkv:])
        elif item is not None:
            gq, gk, gv = kernel.backward(dout, q, k, v, out, lse, item.spec, scale)
            dq.add_(gq.to(acc))
            dkv[:, :hkv].add_(gk.to(acc))
            dkv[:, hkv:].add_(gv.to(acc))

    rounds = sched.rounds
    if not rounds:
        local()
    fetch = None
    if rounds and not recvs:
        kv = torch.cat([k, v], dim=1)  # [T_part, 2*Hkv, D]
        fetch = _start_fetch(executor, kv, rounds[0], 0)
    returning: list = []  # (pending dK/dV, its send index) not yet added
    # Without a budget nothing bounds memory by rounds: collect every return at the end, so a slow
    # peer's gradients never stall this rank's next round. With a budget: at most two in flight.
    max_returning = len(rounds) if sched.keep_recv else 1
    for t, rnd in enumerate(rounds):
        if recvs:
            recv = recvs[t]
        else:
            recv = fetch.wait()
            if t + 1 < len(rounds):
                fetch = _start_fetch(executor, kv, rounds[t + 1], t + 1)
        d_recv = torch.zeros((rnd.recv_total, 2 * hkv, k.shape[2]), dtype=acc, device=k.device)
        for item in rnd.items:
            if _in_place(kernel, item):
                kernel.backward_into(dout, q, recv[:, :hkv], recv[:, hkv:], out, lse, item.segments,
                                     item.spec.causal, scale, dq, d_recv[:, :hkv], d_recv[:, hkv:])
                continue
            d_i, q_i, o_i, l_i = (_take(x, item.q_index, item.q_runs) for x in (dout, q, out, lse))
            kvi = _take(recv, item.kv_index, item.kv_runs)  # [n_k, 2*Hkv, D]
            gq, gk, gv = kernel.backward(d_i, q_i, kvi[:, :hkv], kvi[:, hkv:], o_i, l_i, item.spec, scale)
            _add_rows(dq, item.q_index, item.q_runs, gq)
            _add_rows(d_recv[:, :hkv], item.kv_index, item.kv_runs, gk)
            _add_rows(d_recv[:, hkv:], item.kv_index, item.kv_runs, gv)
        while len(returning) >= max_returning:  # earlier dK/dV had this round's compute to arrive
            pending, r = returning.pop(0)
            _add_rows(dkv, r.send_index, r.send_runs, pending.wait())
        # reverse of the forward transfers: gradients go back to the owners of the rows
        pending = executor.transfer(d_recv.to(grad_dtype), rnd.recv_splits, int(rnd.send_index.shape[0]),
                                    rnd.send_splits, tag=_return_tag(t))
        returning.append((pending, rnd))
        if t == 0:
            local()
    for pending, r in returning:
        _add_rows(dkv, r.send_index, r.send_runs, pending.wait())
    return dq.to(q.dtype), dkv[:, :hkv].to(k.dtype), dkv[:, hkv:].to(v.dtype)
