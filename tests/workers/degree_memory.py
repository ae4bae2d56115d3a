"""Worker of tests/distributed/test_degree_memory_measured.py: the exact tensor peak of one attention step at every
Ulysses degree beside the memory model's figure, and the degree a capped ``"per_batch"`` group runs."""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

import hf_hsap
from benchmarks.tensor_memory import TensorPeak
from hf_hsap.plan.memory import plan_memory

from .sap import get_sp


def _group(U, hq: int, hkv: int) -> hf_hsap.SPGroup:
    """The SP groups the other SAP tests made in this process (no new process groups: every gloo group keeps a
    thread polling for the rest of the pool's life); the per-batch one weighs the memory of ``(hq, hkv)`` heads."""
    sp = get_sp(dist.get_world_size(), U)
    if U != "per_batch":
        return sp
    return dataclasses.replace(sp, heads=(hq, hkv), config=sp.config.replace(per_batch_memory_cap=True))


def _step_peak(plan, q, k, v, dout) -> int:
    idx = plan.local_token_indices()
    a, b, c = (x.index_select(0, idx).requires_grad_(True) for x in (q, k, v))
    g = dout.index_select(0, idx)
    with TensorPeak() as m:
        out = hf_hsap.hsap_attn_func(a, b, c, plan)
        out.backward(g)
        del out
    return m.peak_bytes


def degree_memory(cu: list[int], hq: int, hkv: int, d: int, cost_fields: dict) -> dict:
    """Per degree 1, 2, 4 (world 4): this rank's measured peak (bytes) and the model's largest rank (token-heads);
    then the degree a capped per-batch group picks for the row."""
    torch.manual_seed(0)
    cost = hf_hsap.CostModel(**cost_fields)
    q, k, v, dout = (torch.randn(cu[-1], h, d) for h in (hq, hkv, hkv, hq))
    out = {"rank": dist.get_rank(), "peak": {}, "model": {}}
    for U in (1, 2, 4):
        plan = hf_hsap.plan_sequence(torch.tensor(cu), _group(U, hq, hkv), "auto", cost=cost)
        _step_peak(plan, q, k, v, dout)  # the schedule's first build is no step's memory
        out["peak"][U] = _step_peak(plan, q, k, v, dout)
        out["model"][U] = plan_memory(plan, hq, hkv)
    out["per_batch"] = hf_hsap.plan_sequence(torch.tensor(cu), _group("per_batch", hq, hkv), "auto",
                                             cost=cost).ulysses_size
    return out
