"""Worker of the summary hand-off tests: a float64 recurrence with a matrix transition run by ``run_segments`` on
every rank's tokens of a plan, against the same recurrence over the whole row in one process."""
from __future__ import annotations

import torch
import torch.distributed as dist

import hf_hsap
from hf_hsap.mixers import SegmentOp, StateExchange, Summary, run_segments
from hf_hsap.plan.chain import document_chain, state_chain

DOC_LENS = [5, 60, 1, 7, 2]  # the 60-token document spans every rank at SP 4
DIM = 3


class MatrixRecurrence:
    """``S_t = M_t S_{t-1} + x_t tanh(x_t * w)^T`` with ``M_t = diag(sigmoid(x_t * w)) + x_t tanh(x_t)^T / 4`` (a
    full matrix), ``o_t = S_t^T x_t``. Shapes: ``x [1, n, D]``, ``w [D]``, state ``[1, D, D]``, ``o [1, n, D]``.
    Its summary is computed independently of the library's: the product of the ``M_t`` and ``q~_t = A_t^T x_t``."""

    state_shape = transition_shape = (1, DIM, DIM)
    state_dtype = torch.float64

    @staticmethod
    def _steps(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, a: torch.Tensor | None):
        outs, seen = [], []
        for t in range(x.shape[1]):
            xt = x[0, t]
            m = torch.diag(torch.sigmoid(xt * w)) + torch.outer(xt, torch.tanh(xt)) / 4
            s = m @ s + torch.outer(xt, torch.tanh(xt * w))
            outs.append(s.T @ xt)
            if a is not None:
                a = m @ a
                seen.append(a.T @ xt)
        return outs, s, a, seen

    def run(self, parts, init):
        x, w = parts
        outs, s, _, _ = self._steps(x, w, init[0] if init is not None else x.new_zeros(DIM, DIM), None)
        return torch.stack(outs)[None], s[None]

    def summarize(self, parts):
        x, w = parts
        outs, s, a, seen = self._steps(x, w, x.new_zeros(DIM, DIM), torch.eye(DIM, dtype=x.dtype))
        return Summary(torch.stack(outs)[None], s[None], a[None], torch.stack(seen)[None])

    def correct(self, summary, init):
        return summary.out + torch.einsum("btk,bkv->btv", summary.carry, init)

    def transit(self, transition, state):
        return transition @ state


def _one_process(rec, seed: int) -> tuple:
    """The row's documents, inputs ``x`` and weight ``w``, the loss weights, and the one-process output and
    gradients of ``rec`` over the whole row: ``(cu, x, w, weights, out, dx, dw)``."""
    cu = torch.tensor([0, *torch.tensor(DOC_LENS).cumsum(0).tolist()])
    total = int(cu[-1])
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, total, DIM, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(DIM, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(1, total, DIM, generator=g, dtype=torch.float64)
    ref = run_segments(SegmentOp([x, w], [1, None], rec, 1, 1, total), document_chain(cu.numpy()), None)
    dx, dw = torch.autograd.grad((ref * weights).sum(), [x, w])
    return cu, x, w, weights, ref, dx, dw


def handoff_errors(placement: str) -> dict:
    """This rank's errors of output and gradients (inputs and the shared weight) against the one-process run.

    Returns:
        ``{"out", "dx", "dw", "summaries", "continued", "sent_rows", "mine", "theirs", "messages", "peers"}``: the
        errors, the group's summaries per layer, this rank's continued runs, the rows it sent (forward and backward),
        the summaries it sends and receives, its messages, the peers it sends to plus those it receives from, and the most ranks one of its
        documents spans.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    rec = MatrixRecurrence()
    cu, x, w, weights, ref, dx, dw = _one_process(rec, 0)

    plan = hf_hsap.plan_sequence(cu, world, placement=placement)
    idx = plan.local_token_indices(rank)
    chain = state_chain(cu.numpy(), [plan.local_token_indices(r).numpy() for r in range(world)], rank)
    xl = x.detach()[:, idx].clone().requires_grad_()
    wl = w.detach().clone().requires_grad_()
    exchange = StateExchange(None, list(range(world)))
    out = run_segments(SegmentOp([xl, wl], [1, None], rec, 1, 1, len(idx)), chain, exchange)
    dxl, dwl = torch.autograd.grad((out * weights[:, idx]).sum(), [xl, wl])
    dist.all_reduce(dwl)
    out = out.detach()
    return {"out": float((out - ref[:, idx]).abs().max()), "dx": float((dxl - dx[:, idx]).abs().max()),
            "dw": float((dwl - dw).abs().max()), "summaries": chain.summaries,
            "continued": sum(s.continued for s in chain.segments),
            "sent_rows": exchange.executor.stats.rows_sent, "mine": len(chain.sends()),
            "theirs": len(chain.receives()), "messages": exchange.executor.stats.messages,
            "spans": max(len({*s.earlier, rank, *s.later}) for s in chain.segments),
            "peers": len({p for p, _, _ in chain.sends()}) + len({p for p, _, _ in chain.receives()})}


class CopyingRecurrence(MatrixRecurrence):
    """:class:`MatrixRecurrence` whose runs first copy their input, as the library kernels do (nothing of the
    caller's tensor is saved for backward); ``rerun``: a continued run's output is the run again from its true
    initial state (the delta rule's way), else the zero-state output plus the correction."""

    def __init__(self, rerun: bool) -> None:
        self.rerun = rerun

    def run(self, parts, init):
        return super().run([parts[0].clone(), parts[1]], init)

    def summarize(self, parts):
        return super().summarize([parts[0].clone(), parts[1]])

    def correct(self, summary, init):
        term = torch.einsum("btk,bkv->btv", summary.carry, init)
        return term if summary.out is None else summary.out + term


def activation_freed(rerun: bool) -> dict:
    """A split document's recurrent layer fed a view of a larger activation (as a model's query is cut from its
    projection): whether that activation is freed once the forward returns, as it is when the kernel runs the whole
    row, and the output's and gradients' errors against the one-process run."""
    from torch.multiprocessing.reductions import StorageWeakRef

    rank, world = dist.get_rank(), dist.get_world_size()
    rec = CopyingRecurrence(rerun)
    cu, x, w, weights, ref, dx, dw = _one_process(rec, 1)

    plan = hf_hsap.plan_sequence(cu, world, placement="contiguous")
    idx = plan.local_token_indices(rank)
    chain = state_chain(cu.numpy(), [plan.local_token_indices(r).numpy() for r in range(world)], rank)
    xl = x.detach()[:, idx].clone().requires_grad_()
    wl = w.detach().clone().requires_grad_()
    activation = torch.cat([xl, xl], dim=-1) * 1.0  # the layer's input is a view of it
    freed = StorageWeakRef(activation.untyped_storage())
    out = run_segments(SegmentOp([activation[..., :DIM], wl], [1, None], rec, 1, 1, len(idx)), chain,
                       StateExchange(None, list(range(world))))
    del activation
    held = not freed.expired()
    dxl, dwl = torch.autograd.grad((out * weights[:, idx]).sum(), [xl, wl])
    dist.all_reduce(dwl)
    return {"held": held, "continued": sum(s.continued for s in chain.segments),
            "out": float((out.detach() - ref[:, idx]).abs().max()), "dx": float((dxl - dx[:, idx]).abs().max()),
            "dw": float((dwl - dw).abs().max())}
