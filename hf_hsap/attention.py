"""``hsap_attn_func``: exact document-masked causal attention over an SP group (autograd).

Data flow of one call (``U`` = Ulysses size, ``R`` = inter peers)::

    q, k, v [T_local, H, D]  --(U > 1: all-to-all over heads)-->  [T_part, H/U, D]
        --> SAP over the R inter peers (runtime.sap_forward: local items while KV is in flight,
            remote items, LSE merge)  --> out [T_part, Hq/U, D]
        --(U > 1: inverse all-to-all)-->  out [T_local, Hq, D]
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from .comm.all_to_all import all_to_all, head_to_seq
from .kernels import AttentionKernel, check_features, select_kernel, window_left
from .kernels.dtypes import cast_qkv
from .kernels.sinks import sinks_grad
from .plan.blocks import Blocks, block_schedule
from .plan.plan import Plan
from .plan.schedule import Schedule
from .runtime import sap_backward, sap_forward


@dataclass(frozen=True)
class _SAPCall:
    """What one :class:`_SAPAttention` runs besides its tensors (one object: autograd takes no keywords).

    Attributes:
        sched: the part's compiled schedule. executor: its inter peers (None without rounds). kernel, scale,
        softcap: the kernel calls'. grad_dtype: the dtype dK/dV travel back in (None: k's).
    """

    sched: Schedule
    executor: Any
    kernel: AttentionKernel
    scale: float
    grad_dtype: torch.dtype | None
    softcap: float | None


class _SAPAttention(torch.autograd.Function):
    """SAP over the inter peers of one part. Inputs are the part's tokens (plan order); ``sinks`` (``[Hq]``
    of this rank's heads, or None) gets its gradient (:func:`~hf_hsap.kernels.sinks.sinks_grad`)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, call: _SAPCall):
        # buffers kept: sched.shape; out / lse are final (after the sinks), what the backward needs
        out, lse, recvs = sap_forward(q, k, v, sched=call.sched, executor=call.executor, kernel=call.kernel,
                                      scale=call.scale, softcap=call.softcap, sinks=sinks)
        ctx.save_for_backward(q, k, v, out, lse, sinks, *recvs)
        ctx.call = call
        ctx.mark_non_differentiable(lse)
        # the lse has no gradient: without this autograd would fill a zero [T_part, Hq] tensor for it, live through
        # the whole backward (an fp32 copy of the lse at the memory peak; the varlen path has no second output)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:  # not materialised (see forward): out got no gradient, so neither do the inputs
            return (None,) * 5
        q, k, v, out, lse, sinks, *recvs = ctx.saved_tensors
        call = ctx.call
        dq, dk, dv = sap_backward(dout, q, k, v, out, lse, recvs=list(recvs), sched=call.sched, executor=call.executor,
                                  kernel=call.kernel, scale=call.scale, grad_dtype=call.grad_dtype,
                                  softcap=call.softcap)
        d_sinks = sinks_grad(dout, out, lse, sinks) if sinks is not None and ctx.needs_input_grad[3] else None
        return dq, dk, dv, d_sinks, None


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan, n_local: int) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"hsap_attn_func takes q [T_local, Hq, D], k/v [T_local, Hkv, D]; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"k and v must match, and share q's head_dim; got {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[0] != n_local or k.shape[0] != n_local:
        raise ValueError(
            f"this rank holds {n_local} tokens under the plan but got q with {q.shape[0]} and k with "
            f"{k.shape[0]}; shard the inputs with plan.shard(...) (or hf_hsap.shard_batch) using the same plan"
        )
    hq, hkv = q.shape[1], k.shape[1]
    if hq % hkv != 0:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}; fix num_key_value_heads in the model config")
    if hq % plan.ulysses_size != 0:
        raise ValueError(f"ulysses_size={plan.ulysses_size} must divide the number of query heads ({hq}); "
                         "pick a smaller ulysses_size (with ulysses_size=\"auto\", pass num_heads=... to "
                         "hf_hsap.init_sequence_parallel)")


def _check_sinks(sinks: torch.Tensor | None, hq: int) -> None:
    """Refuse sinks that are not one logit per query head."""
    if sinks is not None and tuple(sinks.shape) != (hq,):
        raise ValueError(f"sinks must hold one logit per query head, shape ({hq},), got {tuple(sinks.shape)}")


def hsap_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: Plan,
    softmax_scale: float | None = None,
    kernel: AttentionKernel | None = None,
    *,
    return_lse: bool = False,
    grad_comm_dtype: torch.dtype | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    blocks: Blocks | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Document-masked causal attention of this rank's tokens, exact across the SP group.

    Args:
        q: ``[T_local, Hq, D]`` this rank's queries in plan order (``plan.shard`` of the global q).
        k: ``[T_local, Hkv, D]`` keys, ``Hq % Hkv == 0``.
        v: ``[T_local, Hkv, D]`` values.
        plan: the plan of this rank's SPGroup (``hf_hsap.plan_sequence(cu_seqlens, sp)``, an
            :class:`~hf_hsap.sp_plan.SPPlan`), or any :class:`~hf_hsap.plan.plan.Plan` of SP size 1.
        softmax_scale: defaults to ``D ** -0.5``.
        kernel: override the kernel (default: :func:`~hf_hsap.kernels.select_kernel`).
        return_lse: also return the log-sum-exp ``[T_local, Hq]`` (fp32; fp64 for fp64 inputs).
        grad_comm_dtype: dtype in which dK/dV partial sums travel back to their owners (default: the
            SP group's ``grad_comm_dtype``, else k's dtype). Both ends accumulate in fp32; pass
            ``torch.float32`` to send the fp32 accumulators (2x the return bytes in bf16 training).
        window: a sliding window (Transformers' ``sliding_window``: a query sees the ``window`` keys of its
            document ending at itself); only the keys it sees are moved (the plan's schedule of that mask
            kind, :meth:`~hf_hsap.plan.plan.Plan.kind`). ``None``: full causal attention.
        softcap: logit soft-capping, ``score = softcap * tanh(score / softcap)`` (Gemma 2); ``None``: none.
        sinks: ``[Hq]`` attention-sink logits (GPT-OSS's ``s_aux``), each joining its head's softmax
            denominator once per query; differentiable. ``None``: none.
        blocks: bidirectional blocks (:class:`~hf_hsap.plan.blocks.Blocks`, Gemma 3's images): a query of a block
            also sees the block's later keys. Every block must lie inside one part
            (:func:`~hf_hsap.plan.blocks.keep_blocks_whole`). ``None``: none.

    Returns:
        ``[T_local, Hq, D]`` attention output, differentiable in q, k, v and ``sinks`` (and the lse if asked,
        with the sinks in it).

    GQA with ``U > 1``: when ``U`` does not divide ``Hkv``, each key/value head is repeated
    ``lcm(Hkv, U) / Hkv`` times (the least that lets every rank hold whole heads) before the
    all-to-all; their gradients are summed back by autograd.
    """
    sp = plan.sp  # an SPPlan's group; a plain Plan has none
    if plan.size > 1 and sp is None:
        raise ValueError("this plan was made offline (int SP size or GroupSpec) and is bound to no process group; "
                         "make it with hf_hsap.plan_sequence(cu_seqlens, sp) and the SPGroup from "
                         "hf_hsap.init_sequence_parallel to run attention")
    n_local = plan.num_local_tokens(0 if plan.size == 1 and plan.rank is None else None)
    q, k, v = cast_qkv(q, k, v)  # the autocast dtype (or the common one): hf_hsap.kernels.dtypes
    _check_inputs(q, k, v, plan, n_local)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    kernel = kernel or select_kernel(q.device, q.dtype)
    part = 0 if sp is None else sp.inter_rank
    sched = plan.schedule(part, q.device, window=window)
    if blocks is not None and len(blocks):
        sched = block_schedule(plan, sched, part, blocks, None if q.device.type == "cpu" else q.device)
    check_features(kernel, window_left(sched.window), softcap)  # an older kernel would drop them silently
    executor = sp.inter_executor() if (sp is not None and sched.rounds) else None
    gdt = grad_comm_dtype or (sp.grad_comm_dtype if sp is not None else None)
    U = plan.ulysses_size
    _check_sinks(sinks, q.shape[1])
    call = _SAPCall(sched, executor, kernel, scale, gdt, softcap)
    if U == 1:
        out, lse = _SAPAttention.apply(q, k, v, sinks, call)
        return (out, lse) if return_lse else out

    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    if hkv % U != 0:
        rep = math.lcm(hkv, U) // hkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # [T, Hkv*rep, D]
        hkv = hkv * rep
    slices = plan.intra_sizes(part)  # [U] tokens of each intra rank
    t = q.shape[0]

    def to_heads(x: torch.Tensor) -> torch.Tensor:
        """One all-to-all per tensor (as DeepSpeed's): its output is the kernel's contiguous input, with no
        packed copy of q, k, v and no slicing copies (activation memory is what bounds the sequence)."""
        h = x.shape[1]
        y = all_to_all(x.reshape(t, -1), "seq_to_head", sp.intra_group, slices, sp.intra_rank,
                       sp.comm_stats)  # [T_local, H*D] -> [T_part, H/U*D]
        return y.view(y.shape[0], h // U, d)  # [T_part, H/U, D]

    qh, kh, vh = to_heads(q), to_heads(k), to_heads(v)
    t_part = qh.shape[0]
    heads_u = None if sinks is None else sinks[sp.intra_rank * (hq // U):(sp.intra_rank + 1) * (hq // U)]  # [Hq/U]
    out_h, lse_h = _SAPAttention.apply(qh, kh, vh, heads_u, call)
    out = all_to_all(out_h.reshape(t_part, -1), "head_to_seq", sp.intra_group, slices, sp.intra_rank,
                     sp.comm_stats)  # [T_part, Hq/U*D] -> [T_local, Hq*D]
    out = out.reshape(t, hq, d)
    if not return_lse:
        return out
    lse = head_to_seq(lse_h.contiguous(), sp.intra_group, slices, sp.intra_rank)  # [T_part, Hq/U] -> [T_local, Hq]
    return out, lse
