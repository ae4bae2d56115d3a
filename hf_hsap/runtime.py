"""Executing a compiled schedule: forward and backward of SAP attention over the inter peers.

The order of the steps (post, wait, local, compute, return, collect) is not written here: both
directions run the steps of :mod:`hf_hsap.plan.pipeline` (:func:`~hf_hsap.plan.pipeline.forward_steps`,
:func:`~hf_hsap.plan.pipeline.backward_steps`), the same ones the cost model simulates. This module
says what each step does with tensors:

* forward: ``post`` sends this part's KV rows of a round and opens its receive buffer; ``local`` runs the
  part's own item while KV is in flight; ``wait`` + ``compute`` run the round's remote items, merging
  them into the output by log-sum-exp in fp32.
* backward: ``compute`` runs the remote items' gradients (dQ locally, dK/dV into the receive-buffer
  gradient); ``return`` sends the dK/dV back to their owners along the reverse transfers; ``collect``
  adds what came back. Gradients are accumulated in fp32 (fp64 for fp64 inputs) on both sides and
  travel in ``grad_dtype`` (default: the inputs' dtype, like every other gradient that crosses ranks).

Both directions use :meth:`P2PExecutor.transfer`; every transfer that may overlap another has its
own tag (:func:`fetch_tag`, :func:`return_tag`).
"""
from __future__ import annotations

import dataclasses

import torch

from .comm.p2p import P2PExecutor
from .kernels.base import AttentionKernel, lse_dtype, merge_partial
from .kernels.sinks import apply_sinks
from .plan.pipeline import (COLLECT, COMPUTE, LOCAL, POST, RETURN, WAIT, backward_steps, forward_steps,
                            run_steps)
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


def fetch_tag(t: int) -> int:
    """Message tag of round ``t``'s KV fetch (even; :func:`return_tag` is the odd one after it).

    Args:
        t: the round.

    Returns:
        The tag.
    """
    return 2 * t


def return_tag(t: int) -> int:
    """Message tag of round ``t``'s dK/dV return.

    Args:
        t: the round.

    Returns:
        The tag.
    """
    return 2 * t + 1


def _start_fetch(executor: P2PExecutor, kv: torch.Tensor, rnd: Round, t: int):
    send = _take(kv, rnd.send_index, rnd.send_runs)  # [n_send, 2*Hkv, D]
    return executor.transfer(send, rnd.send_splits, rnd.recv_total, rnd.recv_splits, tag=fetch_tag(t))


def _mask_kw(item: WorkItem, softcap: float | None) -> dict:
    """Keyword arguments of an in-place kernel call beyond the unwindowed, uncapped contract (none when the
    item has no window and there is no soft-capping, so that kernels of the older contract keep working)."""
    kw = {} if softcap is None else {"softcap": softcap}
    if item.spec.window_left is not None:
        kw["window_left"] = item.spec.window_left
    return kw


def _cap_kw(softcap: float | None) -> dict:
    """``softcap=`` for a varlen kernel call, when there is one."""
    return {} if softcap is None else {"softcap": softcap}


def _forward_items(items, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *,
                   kernel: AttentionKernel, scale: float, softcap: float | None) -> None:
    """Merge the results of work items (keys in ``k``/``v``: a receive buffer or the part's own) into
    ``out [T_part, Hq, D]`` / ``lse [T_part, Hq]`` by log-sum-exp, in place."""
    for item in items:
        if _in_place(kernel, item):
            kernel.forward_into(q, k, v, segments=item.segments, causal=item.spec.causal, scale=scale, out=out, lse=lse,
                                **_mask_kw(item, softcap))
            continue
        k_i, v_i = _take(k, item.kv_index, item.kv_runs), _take(v, item.kv_index, item.kv_runs)  # [n_k, Hkv, D]
        q_i, o_i, l_i = (_take(x, item.q_index, item.q_runs) for x in (q, out, lse))
        o, l = kernel.forward(q_i, k_i, v_i, item.spec, scale, **_cap_kw(softcap))
        m_o, m_l = merge_partial(o_i, l_i, o, l)
        _put_rows(out, item.q_index, item.q_runs, m_o)
        _put_rows(lse, item.q_index, item.q_runs, m_l)


def sap_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, sched: Schedule, executor: P2PExecutor | None,
    kernel: AttentionKernel, scale: float, keep_recv: bool | None = None, softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Forward of one part (the steps of :func:`~hf_hsap.plan.pipeline.forward_steps`).

    Args:
        q: ``[T_part, Hq, D]``; k, v: ``[T_part, Hkv, D]`` (the part's tokens in plan order).
        sched: the part's compiled schedule (of the layer's mask kind). executor: its inter peers (None
            without rounds).
        keep_recv: return the receive buffers for the backward (default: ``sched.shape.keep_recv``;
            otherwise the backward fetches them again).
        softcap: logit soft-capping of every kernel call (``None``: none).
        sinks: ``[Hq]`` attention-sink logits, joined to every query's softmax denominator once, after all
            partial results are merged (:func:`~hf_hsap.kernels.sinks.apply_sinks`); ``None``: none.

    Returns:
        out ``[T_part, Hq, D]`` (q's dtype), lse ``[T_part, Hq]`` (fp32/fp64; with sinks, the final
        normaliser including them), receive buffers ``[recv_total, 2*Hkv, D]`` per round (empty list unless
        kept).
    """
    hkv = k.shape[1]
    acc = lse_dtype(q.dtype)
    shape = sched.shape
    keep = shape.keep_recv if keep_recv is None else keep_recv
    kv = torch.cat([k, v], dim=1) if sched.rounds else None  # [T_part, 2*Hkv, D]: one message per peer
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full(q.shape[:2], float("-inf"), dtype=acc, device=q.device)
    pending: dict = {}
    landed: dict[int, torch.Tensor] = {}
    kept: list[torch.Tensor] = []

    def local(_: int) -> None:
        nonlocal out, lse
        item = sched.local_item
        if item is not None and _in_place(kernel, item):
            kernel.forward_into(q, k, v, segments=item.segments, causal=item.spec.causal, scale=scale, out=out,
                                lse=lse, fresh=True, **_mask_kw(item, softcap))
        elif item is not None:
            o, l = kernel.forward(q, k, v, item.spec, scale, **_cap_kw(softcap))
            out, lse = o.to(acc), l.to(acc)
        _forward_items(sched.extra_local, q, k, v, out, lse, kernel=kernel, scale=scale, softcap=softcap)

    def post(t: int) -> None:
        pending[t] = _start_fetch(executor, kv, sched.rounds[t], t)

    def wait(t: int) -> None:
        landed[t] = pending.pop(t).wait()

    def compute(t: int) -> None:
        recv = landed.pop(t)
        _forward_items(sched.rounds[t].items, q, recv[:, :hkv], recv[:, hkv:], out, lse, kernel=kernel, scale=scale,
                       softcap=softcap)
        if keep:
            kept.append(recv)

    run_steps(forward_steps(shape), {POST: post, WAIT: wait, LOCAL: local, COMPUTE: compute})
    if sinks is not None:
        out, lse = apply_sinks(out, lse, sinks)
    return out.to(q.dtype), lse, kept


def _backward_items(items, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                    out: torch.Tensor, lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                    kernel: AttentionKernel, scale: float, softcap: float | None) -> None:
    """Add the gradients of work items (keys in ``k``/``v``) to ``dq`` and ``dk``/``dv`` (the keys' rows), in
    place."""
    for item in items:
        if _in_place(kernel, item):
            kernel.backward_into(dout, q, k, v, out, lse, segments=item.segments, causal=item.spec.causal, scale=scale,
                                 dq=dq, dk=dk, dv=dv, **_mask_kw(item, softcap))
            continue
        d_i, q_i, o_i, l_i = (_take(x, item.q_index, item.q_runs) for x in (dout, q, out, lse))
        k_i, v_i = _take(k, item.kv_index, item.kv_runs), _take(v, item.kv_index, item.kv_runs)  # [n_k, Hkv, D]
        gq, gk, gv = kernel.backward(d_i, q_i, k_i, v_i, o_i, l_i, spec=item.spec, scale=scale, **_cap_kw(softcap))
        _add_rows(dq, item.q_index, item.q_runs, gq)
        _add_rows(dk, item.kv_index, item.kv_runs, gk)
        _add_rows(dv, item.kv_index, item.kv_runs, gv)


def sap_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, *, recvs: list[torch.Tensor], sched: Schedule, executor: P2PExecutor | None,
    kernel: AttentionKernel, scale: float, grad_dtype: torch.dtype | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward of one part (the steps of :func:`~hf_hsap.plan.pipeline.backward_steps`; shapes as
    :func:`sap_forward`; ``out``/``lse`` are the final values, after sinks when the layer has them: then
    these gradients of q, k, v are exact with sinks too).

    Args:
        recvs: the forward's receive buffers, one per round; empty: the KV is fetched again.
        grad_dtype: dtype of the dK/dV partial sums sent back to their owners (default ``k.dtype``;
            ``torch.float32`` sends the fp32 accumulators: twice the bytes in bf16 training, one
            rounding fewer).
        softcap: the forward's soft-capping.

    Returns:
        dq ``[T_part, Hq, D]``, dk, dv ``[T_part, Hkv, D]`` in the inputs' dtypes; partial sums are
        accumulated in fp32 (fp64 for fp64 inputs).
    """
    hkv = k.shape[1]
    acc = lse_dtype(q.dtype)
    grad_dtype = grad_dtype or k.dtype
    rounds = sched.rounds
    if rounds and recvs and len(recvs) != len(rounds):
        raise ValueError(f"sap_backward got {len(recvs)} receive buffers for {len(rounds)} rounds")
    shape = dataclasses.replace(sched.shape, refetch=bool(rounds) and not recvs)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    # dk and dv apart (not one [T_part, 2*Hkv, D] buffer): each is returned contiguous, so the Ulysses
    # all-to-all after it needs no copy of either
    dk = torch.zeros(k.shape, dtype=acc, device=k.device)  # [T_part, Hkv, D]
    dv = torch.zeros(v.shape, dtype=acc, device=v.device)
    kv = torch.cat([k, v], dim=1) if shape.refetch else None  # [T_part, 2*Hkv, D]
    fetching: dict = {}
    landed: dict[int, torch.Tensor] = dict(enumerate(recvs))
    d_recvs: dict[int, torch.Tensor] = {}
    returning: dict = {}

    def local(_: int) -> None:
        item = sched.local_item
        if item is not None and _in_place(kernel, item):
            kernel.backward_into(dout, q, k, v, out, lse, segments=item.segments, causal=item.spec.causal, scale=scale,
                                 dq=dq, dk=dk, dv=dv, **_mask_kw(item, softcap))
        elif item is not None:
            gq, gk, gv = kernel.backward(dout, q, k, v, out, lse, spec=item.spec, scale=scale, **_cap_kw(softcap))
            dq.add_(gq.to(acc))
            dk.add_(gk.to(acc))
            dv.add_(gv.to(acc))
        _backward_items(sched.extra_local, dout, q, k, v, out=out, lse=lse, dq=dq, dk=dk, dv=dv, kernel=kernel,
                        scale=scale, softcap=softcap)

    def post(t: int) -> None:
        fetching[t] = _start_fetch(executor, kv, rounds[t], t)

    def wait(t: int) -> None:
        landed[t] = fetching.pop(t).wait()

    def compute(t: int) -> None:
        recv, rnd = landed.pop(t), rounds[t]
        d_recv = torch.zeros((rnd.recv_total, 2 * hkv, k.shape[2]), dtype=acc, device=k.device)
        _backward_items(rnd.items, dout, q, recv[:, :hkv], recv[:, hkv:], out=out, lse=lse, dq=dq, dk=d_recv[:, :hkv],
                        dv=d_recv[:, hkv:], kernel=kernel, scale=scale, softcap=softcap)
        d_recvs[t] = d_recv

    def send_return(t: int) -> None:  # reverse of the forward transfers: gradients go back to the rows' owners
        rnd = rounds[t]
        returning[t] = executor.transfer(d_recvs.pop(t).to(grad_dtype), rnd.recv_splits,
                                         int(rnd.send_index.shape[0]), rnd.send_splits, tag=return_tag(t))

    def collect(t: int) -> None:
        rnd = rounds[t]
        back = returning.pop(t).wait()  # [rows, 2*Hkv, D]: dK | dV of the rows this part sent
        _add_rows(dk, rnd.send_index, rnd.send_runs, back[:, :hkv])
        _add_rows(dv, rnd.send_index, rnd.send_runs, back[:, hkv:])

    run_steps(backward_steps(shape), {POST: post, WAIT: wait, LOCAL: local, COMPUTE: compute,
                                      RETURN: send_return, COLLECT: collect})
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
