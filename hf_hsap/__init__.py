"""hf_hsap: Hierarchical Sequence-Aware Parallelism for packed training data.

Public API:
    init_sequence_parallel(sp_size, ulysses_size=1, group=None) -> SPGroup
    plan_sequence(cu_seqlens, sp, placement="auto") -> Plan
    hsap_attn_func(q, k, v, plan, softmax_scale=None) -> out
"""
from .attention import hsap_attn_func
from .kernels import reference_attention, select_kernel, varlen_attention
from .plan.cache import PlanCache
from .plan.cost import CostModel
from .plan.layout import Layout, cu_seqlens_from_position_ids, make_layout
from .plan.planner import Plan, plan_sequence
from .topology import SPGroup, init_sequence_parallel
from .integrations import register, shard_batch  # noqa: E402  (register() imports transformers lazily)
from .data import PackingCollator

register()

__all__ = [
    "CostModel",
    "Layout",
    "Plan",
    "PlanCache",
    "SPGroup",
    "cu_seqlens_from_position_ids",
    "hsap_attn_func",
    "init_sequence_parallel",
    "make_layout",
    "PackingCollator",
    "register",
    "shard_batch",
    "plan_sequence",
    "reference_attention",
    "select_kernel",
    "varlen_attention",
]
__version__ = "0.1.0"
