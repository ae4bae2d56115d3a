"""The traffic tables' run (the schemes, the figures and the goals: :mod:`benchmarks.analytic.traffic`): every scheme
on every layout of the grid, hf_hsap's plans with their planning time."""
from __future__ import annotations

import time

import hf_hsap
from hf_hsap.plan.planner import offline_link
from hf_hsap.topology import auto_ulysses_size

from ..analytic.distributions import cu_seqlens, doc_lengths
from ..analytic.schemes import all_schemes
from ..analytic.traffic import (HSAP_VARIANTS, MODEL_Q_HEADS, RECV_SHAPE, SHAPES, LayoutResult, TrafficConfig,
                                hsap_scheme, planner_cost, recv_floor)

__all__ = ["evaluate_layout", "run_traffic"]


def evaluate_layout(dist: str, T: int, P: int, seed: int, cfg: TrafficConfig) -> LayoutResult:
    """Plan one layout with every hf_hsap variant and count every scheme for both shapes.

    Args:
        dist, T, P, seed: the layout of the spec.
        cfg: the grid (GPUs per node, Ulysses degrees of USP / TE a2a+p2p).

    Returns:
        The :class:`LayoutResult`.
    """
    lengths = doc_lengths(dist, T, seed)
    cu = cu_seqlens(lengths)
    res = LayoutResult(dist, T, P, seed, len(lengths), int(lengths.max()), recv_floor(lengths, P))
    link = offline_link(P, cfg.gpus_per_node)
    for key, shape in SHAPES.items():  # each model plans with its own cost model, as the trainers do
        res.schemes[key] = all_schemes(lengths, P, shape, cfg.gpus_per_node, cfg.u_values)
        for hw in cfg.planner_hardware:  # ... on the GPU it runs on (CostModel.from_config)
            target = res.schemes[key] if hw == cfg.planner_hardware[0] else res.hsap_by_hw.setdefault((key, hw), {})
            for v in HSAP_VARIANTS:
                U = v.ulysses_size or auto_ulysses_size(P, cfg.gpus_per_node, MODEL_Q_HEADS)
                if P % U or U > P:
                    continue
                t0 = time.perf_counter()
                plan = hf_hsap.plan_sequence(cu, P, v.placement, ulysses_size=U, rounds=v.rounds,
                                             cost=planner_cost(key, link, hw))
                if key == RECV_SHAPE and hw == cfg.planner_hardware[0]:
                    res.plan_ms[v.name] = (time.perf_counter() - t0) * 1e3
                    res.placement[v.name] = f"{plan.placement_name}/{plan.round_order}"
                target[v.name] = hsap_scheme(plan, lengths, shape, cfg.gpus_per_node, v.name)
    return res


def run_traffic(cfg: TrafficConfig, progress: bool = False) -> list[LayoutResult]:
    """:func:`evaluate_layout` over the whole grid.

    Args:
        cfg: the grid; progress: print one line per (distribution, T, P).

    Returns:
        One result per layout, in grid order.
    """
    out = []
    for dist in cfg.dists:
        for T in cfg.Ts:
            for P in cfg.Ps:
                t0 = time.perf_counter()
                out += [evaluate_layout(dist, T, P, seed, cfg) for seed in cfg.seeds]
                if progress:
                    print(f"  traffic {dist:8s} T={T:7d} P={P:2d}: {time.perf_counter() - t0:5.1f}s", flush=True)
    return out
