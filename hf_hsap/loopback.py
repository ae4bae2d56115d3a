"""A whole plan's SAP attention in one process, one thread per part (:class:`~hf_hsap.comm.loopback.LoopbackHub`).

It exists to check the runtime and the kernels of a whole plan where there is one device and no
process group (one lent GPU, a notebook, the CPU tests); it is not a training transport.
"""
from __future__ import annotations

import torch

from .comm.loopback import LoopbackHub
from .comm.p2p import CommStats
from .kernels import AttentionKernel, select_kernel
from .plan.plan import Plan
from .runtime import sap_backward, sap_forward

__all__ = ["run_plan_loopback"]


def run_plan_loopback(plan: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, *,
                      kernel: AttentionKernel | None = None, softmax_scale: float | None = None, timeout_s: float = 60.0,
                      window: int | None = None, softcap: float | None = None) -> tuple[torch.Tensor, ...]:
    """Forward and backward of a whole plan's SAP attention in this process, one thread per part.

    Args:
        plan: an offline plan (``plan_sequence(cu_seqlens, P, ...)``, ``ulysses_size`` 1).
        q: ``[T, Hq, D]`` global queries (any device); k, v: ``[T, Hkv, D]``; dout: ``[T, Hq, D]``.
        kernel: default :func:`~hf_hsap.kernels.select_kernel` for q's device and dtype.
        softmax_scale: defaults to ``D ** -0.5``.
        window: the layers' sliding window (the plan's schedule of that mask kind); ``None``: full attention.
        softcap: logit soft-capping; ``None``: none.

    Returns:
        Global ``out [T, Hq, D]``, ``lse [T, Hq]``, ``dq``, ``dk``, ``dv`` (in global token order) and the
        per-part :class:`CommStats` list.
    """
    if plan.ulysses_size != 1:
        raise ValueError("run_plan_loopback runs flat SAP plans (ulysses_size=1); the all-to-all needs a process group")
    kernel = kernel or select_kernel(q.device, q.dtype)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    hub = LoopbackHub(plan.n_parts, timeout_s)
    stats = [CommStats() for _ in range(plan.n_parts)]

    def part_fn(p: int) -> tuple[torch.Tensor, ...]:
        idx = plan.local_token_indices(p).to(q.device)
        ql, kl, vl, dl = (x.index_select(0, idx) for x in (q, k, v, dout))
        sched = plan.schedule(p, q.device, window=window)
        ex = hub.executor(p, stats[p])
        out, lse, recvs = sap_forward(ql, kl, vl, sched=sched, executor=ex, kernel=kernel, scale=scale, softcap=softcap)
        dq, dk, dv = sap_backward(dl, ql, kl, vl, out, lse, recvs=recvs, sched=sched, executor=ex, kernel=kernel,
                                  scale=scale, softcap=softcap)
        return out, lse, dq, dk, dv

    res = hub.run(part_fn)
    glob = [plan.unshard([r[i] for r in res]) for i in range(5)]
    return (*glob, stats)
