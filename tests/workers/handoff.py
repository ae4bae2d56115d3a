"""Worker of the state hand-off tests: a float64 recurrence with a matrix state run by ``run_segments`` on
every rank's tokens of a plan, against the same recurrence over the whole row in one process."""
from __future__ import annotations

import torch
import torch.distributed as dist

import hf_hsap
from hf_hsap.mixers import SegmentOp, StateExchange, run_segments
from hf_hsap.plan.chain import document_chain, state_chain

DOC_LENS = [7, 30, 1, 19, 15]
DIM = 3


def recurrence(parts: list[torch.Tensor], init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``S_t = sigmoid(x_t . w) S_{t-1} + x_t tanh(x_t * w)^T``, ``o_t = S_t^T x_t``, from ``init`` (zero: None).

    Shapes: ``x [1, n, D]``, ``w [D]``, state ``[1, D, D]`` -> ``o [1, n, D]``.
    """
    x, w = parts
    s = init[0] if init is not None else x.new_zeros(DIM, DIM)
    outs = []
    for t in range(x.shape[1]):
        xt = x[0, t]
        s = torch.sigmoid(xt @ w) * s + torch.outer(xt, torch.tanh(xt * w))
        outs.append(s.T @ xt)
    return torch.stack(outs)[None], s[None]


def handoff_errors(placement: str) -> dict:
    """This rank's errors of output and gradients (inputs and the shared weight) against the one-process run.

    Returns:
        ``{"out", "dx", "dw", "handoffs", "steps"}``.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    cu = torch.tensor([0, *torch.tensor(DOC_LENS).cumsum(0).tolist()])
    total = int(cu[-1])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, total, DIM, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(DIM, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(1, total, DIM, generator=g, dtype=torch.float64)
    op = SegmentOp([x, w], [1, None], recurrence, 1, (1, DIM, DIM), torch.float64, 1, total)
    ref = run_segments(op, document_chain(cu.numpy()), None)
    dx, dw = torch.autograd.grad((ref * weights).sum(), [x, w])

    plan = hf_hsap.plan_sequence(cu, world, placement=placement)
    idx = plan.local_token_indices(rank)
    chain = state_chain(cu.numpy(), [plan.local_token_indices(r).numpy() for r in range(world)], rank)
    xl = x.detach()[:, idx].clone().requires_grad_()
    wl = w.detach().clone().requires_grad_()
    op = SegmentOp([xl, wl], [1, None], recurrence, 1, (1, DIM, DIM), torch.float64, 1, len(idx))
    out = run_segments(op, chain, StateExchange(None, list(range(world))))
    dxl, dwl = torch.autograd.grad((out * weights[:, idx]).sum(), [xl, wl])
    dist.all_reduce(dwl)
    return {"out": float((out - ref[:, idx]).abs().max()), "dx": float((dxl - dx[:, idx]).abs().max()),
            "dw": float((dwl - dw).abs().max()), "handoffs": chain.handoffs, "steps": chain.steps}
