"""The placement sweep's run (the layouts, groups and figures: :mod:`benchmarks.analytic.sweep`): ``auto`` and every
simpler placement planned on each layout x group, priced by the planner's cost model, with ``auto``'s planning time.

Run alone: ``python -m benchmarks sweep [--quick]`` prints the section's markdown (the core suite,
:mod:`benchmarks.suites.core`, puts it in ``benchmarks/results/sweep.md``).
"""
from __future__ import annotations

import argparse
import time
from typing import Sequence

import numpy as np

from hf_hsap.plan.cost import CostModel, balance_bound, part_times
from hf_hsap.plan.group import GroupSpec
from hf_hsap.plan.layout import make_layout
from hf_hsap.plan.placement import DEFAULT_TOKEN_SLACK, token_cap
from hf_hsap.plan.planner import choose_ulysses_size, plan_layout
from hf_hsap.plan.simulation import simulated_time
from hf_hsap.plan.transfers import compute_transfers

from ..analytic.bound import transfer_bound
from ..analytic.placement_search import optimise_placement
from ..analytic.relaxation import relaxed_bound
from ..analytic.sweep import (MODEL_KV_HEADS, MODEL_Q_HEADS, OTHERS, SweepConfig, sweep_groups, max_over_mean, per_batch_rows,
                              missed_in_reach, sweep_lengths)
from .output import Outcome

__all__ = ["main", "run_sweep"]


def run_sweep(cfg: SweepConfig = SweepConfig(), progress: bool = False) -> dict:
    """Every layout x group of the sweep (module docstring).

    Returns:
        ``{"rows": [...], "config": {...}, "seconds": float}``; a row per (distribution, seed, P, U, link).
    """
    t_start = time.perf_counter()
    rows = []
    for P, U, link in sweep_groups(cfg):
        T = min(cfg.max_T, cfg.tokens_per_rank * P)
        gpn = P if link == "nvlink" else U
        group = GroupSpec.offline(P, U, gpn)
        plan_cost = CostModel.for_link(group.link)
        cost = plan_cost.for_ulysses(U)  # what the planner prices a plan with (plan_layout applies U itself)
        parts = P // U
        for dist in cfg.distributions:
            for seed in range(cfg.seeds):
                L = sweep_lengths(dist, T, seed)
                layout = make_layout(np.concatenate([[0], np.cumsum(L)]))
                t0 = time.perf_counter()
                auto = plan_layout(layout, group, "auto", cost=plan_cost)
                plan_ms = (time.perf_counter() - t0) * 1e3
                lb = balance_bound(layout, parts, cost)
                cap = token_cap(T, parts, DEFAULT_TOKEN_SLACK)
                est = {"auto": float(part_times(layout, auto.placement, auto.transfers, cost).max())}
                transfers_only = transfer_bound(layout, parts, cost, cap)
                bound = relaxed_bound(layout, parts, cost, cap, hint=est["auto"])  # at least transfers_only
                sim = simulated_time(layout, auto.placement, auto.transfers, cost)  # rounds simulated, fwd + bwd
                for name in OTHERS:
                    pl = plan_layout(layout, group, name, cost=plan_cost).placement
                    est[name] = float(part_times(layout, pl, compute_transfers(pl), cost).max())
                row = {"dist": dist, "seed": seed, "P": P, "U": U, "link": link, "T": T, "n_docs": int(L.size),
                       "chosen": auto.placement.name, "lb": lb, "bound": bound, "transfer_bound": transfers_only,
                       "est": est, "sim": sim,
                       "plan_ms": plan_ms,
                       "tokens": max_over_mean(auto.placement.tokens_per_part()),
                       "work": max_over_mean(auto.placement.work_per_part(layout)),
                       "recv_ring": float(np.bincount(auto.transfers.dst, weights=auto.transfers.lengths,
                                                      minlength=parts).max() / (T - T / parts))}
                if U == 1 and link == "nvlink":  # the hierarchy degree chosen for this layout, up to Ulysses
                    best_u, by_u = choose_ulysses_size(layout, P, num_heads=MODEL_Q_HEADS, gpus_per_node=P,
                                                       num_kv_heads=MODEL_KV_HEADS)
                    row["by_u"] = {str(u): t for u, t in by_u.items()}
                    row["best_u"] = best_u
                if parts <= cfg.oracle_max_parts or missed_in_reach(row):
                    o = optimise_placement(layout, parts, cost, auto.placement, max_moves=cfg.oracle_moves)
                    o_tr = compute_transfers(o)
                    key = "oracle" if parts <= cfg.oracle_max_parts else "missed_oracle"  # the latter: any size
                    row[key] = float(part_times(layout, o, o_tr, cost).max())
                    row[f"{key}_sim"] = simulated_time(layout, o, o_tr, cost)  # the oracle's plan, rounds simulated
                rows.append(row)
        if progress:
            print(f"  sweep P={P} U={U} {link}: {time.perf_counter() - t_start:.0f} s", flush=True)
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(cfg).items()}
    return {"rows": rows, "per_batch": per_batch_rows(cfg), "config": config, "seconds": time.perf_counter() - t_start}


def main(argv: Sequence[str]) -> Outcome:
    """``python -m benchmarks sweep [--quick]``: run the sweep alone (the entry point prints its section).

    Args:
        argv: the command-line arguments.

    Returns:
        The outcome (status 0; the pages are left alone).
    """
    ap = argparse.ArgumentParser(prog="python -m benchmarks sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    args = ap.parse_args(argv)
    return Outcome(0, run_sweep(SweepConfig.quick() if args.quick else SweepConfig(), progress=True), False)
