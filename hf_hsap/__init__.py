"""hf_hsap: Hierarchical Sequence-Aware Parallelism for packed training data.

Public API:
    HSAPConfig(sp_size, ulysses_size, placement, rounds, recv_budget_tokens, ...)   (every option, validated)
    init_sequence_parallel(sp_size_or_config, ulysses_size=None) -> SPGroup   (groups from a DeviceMesh)
    plan_sequence(cu_seqlens, sp, placement="auto") -> Plan
    hsap_attn_func(q, k, v, plan, softmax_scale=None) -> out
    prepare_model(model, sp_size=1, levers=MemoryLevers(...)) -> PreparedModel   (the one step that changes a
        model: recurrent layers, plan relay, vision rows, memory levers; .undo() restores it)
    check_model(model, sp_size=1) -> ModelCheck   (refuses what "hsap" cannot run exactly; only reads)
    vision_spec(model) -> VisionSpec   (PackingCollator(..., vision=...) for packed image / video + text rows)
"""
from .attention import hsap_attn_func
from .config import HSAPConfig, attention_windows
from .kernels import reference_attention, select_kernel, varlen_attention
from .plan.cache import PlanCache
from .plan.cost import CostModel
from .data.positions import cu_seqlens_from_position_ids
from .plan.layout import Layout, make_layout
from .plan.group import GroupSpec
from .plan.plan import Plan
from .plan.stats import KindStats, PlanStats
from .sp_plan import SPPlan, plan_sequence
from .plan.planner import choose_ulysses_size
from .topology import SPGroup, init_sequence_parallel
from .integrations import (PreparedModel, check_config, check_model, check_plan_used, prepare_model,  # noqa: E402
                           register, shard_batch)
from .data import PackingCollator
from .memory import MemoryLevers
from .multimodal import vision_spec

register()

__all__ = [
    "CostModel",
    "HSAPConfig",
    "Layout",
    "MemoryLevers",
    "GroupSpec",
    "Plan",
    "PlanCache",
    "PlanStats",
    "KindStats",
    "SPPlan",
    "SPGroup",
    "PreparedModel",
    "attention_windows",
    "check_config",
    "check_model",
    "check_plan_used",
    "choose_ulysses_size",
    "cu_seqlens_from_position_ids",
    "hsap_attn_func",
    "init_sequence_parallel",
    "make_layout",
    "PackingCollator",
    "prepare_model",
    "register",
    "shard_batch",
    "plan_sequence",
    "reference_attention",
    "select_kernel",
    "varlen_attention",
    "vision_spec",
]
__version__ = "0.1.0"
