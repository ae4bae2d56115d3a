"""Worker of the heads-mode tests: each recurrent kernel of ``hf_hsap.mixers.ops.OPS`` run by ``run_heads`` on every
rank's tokens of a planned packed row, against its document-cut op over the whole row in one process (float64, and
float32 where Transformers' kernels compute in float32 as they do in training)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import hf_hsap
from hf_hsap.comm.p2p import CommStats
from hf_hsap.mixers.heads import heads_bytes, heads_fit, heads_route, run_heads
from hf_hsap.mixers.ops import OPS
from hf_hsap.plan.chain import document_chain
from hf_hsap.testing import rel_err
from workers.zoo import float64_casts_kept

# 64 tokens: document 1 spans every rank at SP 4 under a contiguous placement (16 tokens a rank); documents 2 and 3
# are shorter than the convolution's kernel (4)
DOC_LENS = [3, 50, 1, 2, 8]
LONG_DOC = 1
CHUNK = 4  # the chunked kernels' chunk size: documents cross chunk boundaries


@dataclass
class Case:
    """One kernel call: its tensors (name -> ``(tensor, token dim or None)``), which of them go positionally (in
    order) and which by keyword, its other keywords, the original kernel, and the output's token dim."""

    tensors: dict[str, tuple[torch.Tensor, int | None]]
    positional: tuple[str, ...]
    options: dict[str, Any]
    orig: Callable[..., Any]
    out_dim: int

    def call(self, values: dict[str, torch.Tensor]) -> tuple[tuple, dict[str, Any]]:
        """``(args, kwargs)`` of the call with ``values`` for its tensors."""
        kwargs = {n: v for n, v in values.items() if n not in self.positional}
        return tuple(values[n] for n in self.positional), {**kwargs, **self.options}


def kernel_case(kernel: str, total: int, dtype: torch.dtype) -> Case:
    """The ``dtype`` inputs of ``kernel`` over ``total`` tokens (one row; drawn in float64) and Transformers' torch
    kernel behind its hook (its default dispatch, as the model's hook calls it)."""
    from transformers.models.kimi_linear import modeling_kimi_linear
    from transformers.models.mamba import modeling_mamba
    from transformers.models.mamba2 import modeling_mamba2
    from transformers.models.qwen3_5 import modeling_qwen3_5

    gen = torch.Generator().manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    T = total
    if kernel in ("chunk_gated_delta_rule", "chunk_kda"):
        kda = kernel == "chunk_kda"
        hk, hv, dk, dv = (4, 4, 3, 2) if kda else (4, 8, 3, 2)  # the gated delta rule with grouped values
        g = -torch.nn.functional.softplus(rnd(1, T, hv, dk) if kda else rnd(1, T, hv))
        tensors = {"query": (rnd(1, T, hk, dk), 1), "key": (rnd(1, T, hk, dk), 1), "value": (rnd(1, T, hv, dv), 1),
                   "g": (g, 1), "beta": (torch.sigmoid(rnd(1, T, hv)), 1)}
        fn = modeling_kimi_linear.chunk_kimi_delta_attention if kda else modeling_qwen3_5.torch_chunk_gated_delta_rule
        return Case(tensors, ("query", "key", "value"), {"chunk_size": CHUNK, "use_qk_l2norm_in_kernel": True},
                    fn.forward, 1)
    if kernel == "mamba_chunk_scan_combined":
        h, p, groups, n = 4, 2, 2, 3  # groups split at SP 2, replicated at SP 4
        tensors = {"hidden_states": (rnd(1, T, h, p), 1), "dt": (rnd(1, T, h), 1), "A": (-torch.exp(rnd(h)), None),
                   "B": (rnd(1, T, groups, n), 1), "C": (rnd(1, T, groups, n), 1), "D": (rnd(h), None),
                   "dt_bias": (rnd(h), None)}
        return Case(tensors, ("hidden_states", "dt", "A", "B", "C"),
                    {"chunk_size": CHUNK, "dt_softplus": True, "dt_limit": (0.0, float("inf"))},
                    modeling_mamba2.mamba2_chunk_scan.forward, 1)
    if kernel == "selective_scan_fn":
        d, n = 4, 3
        tensors = {"hidden_states": (rnd(1, d, T), 2), "dt": (rnd(1, d, T), 2), "A": (-torch.exp(rnd(d, n)), None),
                   "B": (rnd(1, n, T), 2), "C": (rnd(1, n, T), 2), "D": (rnd(d), None), "z": (rnd(1, d, T), 2),
                   "delta_bias": (rnd(d), None)}
        return Case(tensors, ("hidden_states", "dt", "A", "B", "C"), {"delta_softplus": True},
                    modeling_mamba.mamba_selective_scan.forward, 2)
    if kernel == "causal_conv1d_fn":
        c, k = 8, 4
        tensors = {"hidden_states": (rnd(1, c, T), 2), "weight": (rnd(c, k), None), "bias": (rnd(c), None)}
        return Case(tensors, ("hidden_states", "weight", "bias"), {"activation": "silu"},
                    modeling_mamba2.causal_conv1d_fn.forward, 2)
    raise ValueError(kernel)


def _first(result: Any) -> torch.Tensor:
    """The output of a kernel that may also return a (``None``) final state."""
    return result[0] if isinstance(result, tuple) else result


def heads_errors(kernel: str, placement: str, dtype: str = "float64") -> dict:
    """This rank's errors of ``run_heads``'s output and of every input's gradient against the one-process run, the
    bytes it sent against :func:`heads_bytes`, and over how many ranks the long document lies.

    Args:
        kernel: an ``OPS`` name. placement: the planner's. dtype: ``float64``, ``float32`` or ``mixed`` (``dt``
            float64, the rest float32: the kernels with a ``dt``).

    Returns:
        ``{"fit", "out", "grads": {name: error}, "sent": (forward, backward), "expected": (forward, backward),
        "spans"}``; errors relative to the reference's largest magnitude, parameters' gradients summed over ranks.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    cu = np.cumsum([0, *DOC_LENS])
    total = int(cu[-1])
    case = kernel_case(kernel, total, torch.float32 if dtype == "mixed" else getattr(torch, dtype))
    if dtype == "mixed":  # dt in float64, the rest float32: two dtypes, two all-to-alls each way
        t, d = case.tensors["dt"]
        case.tensors["dt"] = (t.double(), d)
    op = OPS[kernel]
    leaves = {n: t.requires_grad_() for n, (t, _) in case.tensors.items()}
    with float64_casts_kept(dtype == "float64"):
        ref = _first(op(case.orig, *case.call(leaves), document_chain(cu), None))
        weights = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(ref.dtype)
        ref_grads = dict(zip(leaves, torch.autograd.grad((ref * weights).sum(), list(leaves.values()))))

        plan = hf_hsap.plan_sequence(cu, world, placement=placement)
        idx = plan.local_token_indices(rank)
        local = {n: (t.detach().index_select(d, idx) if d is not None else t.detach().clone()).requires_grad_()
                 for n, (t, d) in case.tensors.items()}
        stats = CommStats()
        route = heads_route(plan, SimpleNamespace(size=world, rank=rank, group=None, comm_stats=stats))
        args, kwargs = case.call(local)
        fit = heads_fit(kernel, args, kwargs, world)
        expected = heads_bytes(kernel, args, kwargs, route.token_counts, rank)
        out = _first(run_heads(kernel, op, case.orig, args, kwargs, route=route))
        sent_forward = stats.a2a_bytes_sent
        grads = torch.autograd.grad((out * weights.index_select(case.out_dim, idx)).sum(), list(local.values()))
    errors = {}
    for (name, (t, d)), grad in zip(case.tensors.items(), grads):
        if d is None:  # a parameter: every rank's part of its gradient (its heads' slice, zero elsewhere)
            dist.all_reduce(grad)
            errors[name] = rel_err(grad, ref_grads[name])
        else:
            errors[name] = rel_err(grad, ref_grads[name].index_select(d, idx), scale=ref_grads[name])
    spans = sum(bool(((plan.local_token_indices(r) >= cu[LONG_DOC]) & (plan.local_token_indices(r) < cu[LONG_DOC + 1]))
                     .any()) for r in range(world))
    return {"fit": fit, "out": rel_err(out, ref.index_select(case.out_dim, idx), scale=ref), "grads": errors,
            "sent": (sent_forward, stats.a2a_bytes_sent - sent_forward), "expected": tuple(expected), "spans": spans}
