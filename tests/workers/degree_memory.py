"""Worker of tests/distributed/test_degree_memory_measured.py: the exact tensor peak of one attention step at every
Ulysses degree beside the memory model's figure, and the degree a capped ``"per_batch"`` group runs."""
from __future__ import annotations

import torch
import torch.distributed as dist

import hf_hsap
from benchmarks.tensor_memory import TensorPeak
from hf_hsap.plan.memory import plan_memory

_GROUPS: dict = {}


def _group(U, hq: int, hkv: int, cost: hf_hsap.CostModel) -> hf_hsap.SPGroup:
    key = (U, hq, hkv, cost)
    if key not in _GROUPS:
        config = hf_hsap.HSAPConfig(sp_size=dist.get_world_size(), ulysses_size=U, cost_model=cost)
        _GROUPS[key] = hf_hsap.init_sequence_parallel(config, num_heads=hq, num_kv_heads=hkv)
    return _GROUPS[key]


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
    then the degree a capped per-batch group picks for the row and whether the uncapped one picks another."""
    torch.manual_seed(0)
    cost = hf_hsap.CostModel(**cost_fields)
    q, k, v, dout = (torch.randn(cu[-1], h, d) for h in (hq, hkv, hkv, hq))
    out = {"rank": dist.get_rank(), "peak": {}, "model": {}}
    for U in (1, 2, 4):
        plan = hf_hsap.plan_sequence(torch.tensor(cu), _group(U, hq, hkv, cost), "auto")
        _step_peak(plan, q, k, v, dout)  # the schedule's first build is no step's memory
        out["peak"][U] = _step_peak(plan, q, k, v, dout)
        out["model"][U] = plan_memory(plan, hq, hkv)
    out["per_batch"] = hf_hsap.plan_sequence(torch.tensor(cu), _group("per_batch", hq, hkv, cost), "auto").ulysses_size
    return out
