"""Where the summary hand-off (:mod:`.handoff`) reads its runs' gradients: graph edges that hold no tensor.

The hand-off differentiates each rank's runs itself, so it needs every run's input slices and outputs as points of
the graph. Holding the tensors would do, but it keeps their storages alive until backward: a detached leaf's
gradient accumulator keeps the leaf, and with it the whole activation it is a view of (such as the convolution's
output that the delta rule's query, key and value are cut from); a run's output kept for ``torch.autograd.grad``
keeps what the plain model frees once the next kernel has copied what it needs. Here each input slice enters the
graph through :class:`_Alias`, a node that holds no tensor, and inputs and outputs alike are kept as their
``GradientEdge`` (which ``torch.autograd.grad`` takes in place of a tensor).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..plan.chain import Segment

__all__ = ["OutputEdge", "RunInput", "run_inputs"]


@dataclass
class OutputEdge:
    """A tensor's place in the graph without the tensor: its ``GradientEdge`` and dtype (the dtype its gradient
    takes)."""

    edge: Any
    dtype: torch.dtype

    @staticmethod
    def of(t: torch.Tensor | None) -> "OutputEdge | None":
        """``t``'s edge; ``None`` for ``None`` or a tensor without a gradient."""
        if t is None or not t.requires_grad:
            return None
        return OutputEdge(torch.autograd.graph.get_gradient_edge(t), t.dtype)


@dataclass
class RunInput:
    """A run's slice of a token input that needs a gradient, seen by the kernels through :class:`_Alias`: the graph
    edge its gradient arrives at, and its shape for a run it does not reach."""

    edge: Any
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device

    def zeros(self) -> torch.Tensor:
        return torch.zeros(self.shape, dtype=self.dtype, device=self.device)


class _Alias(torch.autograd.Function):
    """The input itself, as a graph node that holds no tensor (``anchor``: an empty leaf that puts it in the graph).
    Its backward never runs: the hand-off reads the gradient at its edge."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:  # pragma: no cover - the edge is an input of grad()
        raise RuntimeError("hf_hsap: a recurrent run's input alias was differentiated through")


def run_inputs(segs: Sequence[Segment], cut: Callable[[Segment, list[torch.Tensor]], list[torch.Tensor]],
               leaves: list[torch.Tensor], needs: list[bool], token_dims: Sequence[int | None]
               ) -> tuple[list[list[torch.Tensor]], list[list[RunInput | None]]]:
    """Every run's kernel inputs and, per token input that needs a gradient (under grad mode), where its gradient
    is read.

    Args:
        segs: the runs. cut: ``cut(segment, tensors)``, the run's slices of the token tensors (others whole).
        leaves: the call's tensors, detached (parameters as leaves of their own). needs: per tensor, whether it
            needs a gradient. token_dims: per tensor, its token dimension (``None``: not cut).

    Returns:
        ``(parts, inputs)``: per run, its kernel inputs (a token input that needs a gradient through
        :class:`_Alias`), and per run and place its :class:`RunInput` (``None``: no gradient read there).
    """
    grad = torch.is_grad_enabled() and any(needs)
    anchor = leaves[0].new_empty(0).requires_grad_() if grad else None
    parts, inputs = [], []
    for seg in segs:
        ps, xs = [], []
        for p, need, d in zip(cut(seg, leaves), needs, token_dims):
            x = None
            if d is not None and need and grad:
                p = _Alias.apply(anchor, p)
                x = RunInput(torch.autograd.graph.get_gradient_edge(p), p.shape, p.dtype, p.device)
            ps.append(p)
            xs.append(x)
        parts.append(ps)
        inputs.append(xs)
    return parts, inputs
