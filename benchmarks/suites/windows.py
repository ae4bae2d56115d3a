"""The sliding windows' run (the figures, the models and the goal: :mod:`benchmarks.analytic.windows`): hf_hsap's
plan of every layout with its planning time, and every scheme's counts per layer kind.

Run alone: ``python -m benchmarks windows [--quick]`` prints the section's markdown (the core suite,
:mod:`benchmarks.suites.core`, puts it in ``benchmarks/results/windows.md``).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import sys
import time
from dataclasses import asdict
from typing import Mapping, Sequence

import numpy as np

from hf_hsap.plan.planner import offline_link, plan_sequence

from ..analytic.distributions import cu_seqlens, doc_lengths
from ..analytic.schemes import LLAMA3_8B_SHAPE, all_schemes
from ..analytic.traffic import planner_cost
from ..analytic.windows import (SHAPE_KEY, SKIP_SCHEMES, WINDOW_MODELS, WindowConfig, hsap_kind_stats, scheme_metrics, kind_key,
                                scheme_segments, split_docs_per_part, summarize_windows, window_goals)
from .output import Outcome

__all__ = ["evaluate_window_layout", "main", "run_windows"]


# ----------------------------------------------------------------------------- hf_hsap
def _plan(cu: np.ndarray, P: int, layers: Mapping, cfg: WindowConfig):
    """``(plan, source, ms)``: the plan of every kind (``source="planner"``), or without the ``windows``
    option when the planner has none (``source="derived"``)."""
    cost = planner_cost(SHAPE_KEY, offline_link(P, cfg.gpus_per_node), cfg.hardware)
    has_windows = "windows" in inspect.signature(plan_sequence).parameters
    t0 = time.perf_counter()
    if has_windows:
        plan = plan_sequence(cu, P, "auto", windows=dict(layers), cost=cost)
    else:  # a planner without windows: its full-attention placement, the windowed minimum computed here
        plan = plan_sequence(cu, P, "auto", cost=cost)
    return plan, "planner" if has_windows else "derived", (time.perf_counter() - t0) * 1e3


def evaluate_window_layout(model: str, dist: str, T: int, P: int, seed: int, cfg: WindowConfig) -> dict:
    """Every scheme on one layout, per layer kind of ``model``.

    Returns:
        ``{"model", "dist", "T", "P", "seed", "n_docs", "source", "plan_ms", "placement", "check",
        "kinds": {kind: {scheme: metrics}}, "split": {scheme: [P] split documents per rank},
        "layers": {kind: count}}`` (metrics: per-rank arrays, :func:`scheme_metrics`).
    """
    layers = WINDOW_MODELS[model]["layers"]
    lengths = doc_lengths(dist, T, seed)
    cu = cu_seqlens(lengths)
    plan, source, ms = _plan(cu, P, layers, cfg)
    out = {"model": model, "dist": dist, "T": T, "P": P, "seed": seed, "n_docs": int(len(lengths)),
           "source": source, "plan_ms": ms, "placement": plan.placement_name, "check": 0.0, "kinds": {},
           "layers": {kind_key(w): int(n) for w, n in layers.items()}, "windows": {}}
    split = {"hsap": split_docs_per_part(plan.placement.doc, plan.placement.part, P)}
    for w in layers:
        k = kind_key(w)
        out["windows"][k] = w
        per = {n: scheme_metrics(s) for n, s in all_schemes(lengths, P, LLAMA3_8B_SHAPE, cfg.gpus_per_node,
                                                      cfg.u_values, window=w).items() if n not in SKIP_SCHEMES}
        hs, diff = hsap_kind_stats(plan, source, w, lengths, cfg)
        out["kinds"][k] = {"hsap": scheme_metrics(hs), **per}
        out["check"] = max(out["check"], diff)
    for name in out["kinds"][kind_key(next(iter(layers)))]:
        if name not in split:
            seg = scheme_segments(name, lengths, P)
            if seg is not None:
                split[name] = split_docs_per_part(seg[0], seg[1], P)
    out["split"] = split
    return out


def run_windows(cfg: WindowConfig | None = None, progress: bool = False) -> dict:
    """The whole section's numbers.

    Args:
        cfg: the grid (default :class:`WindowConfig`); progress: one line per (model, dist, T, P).

    Returns:
        ``{"rows", "goals", "config", "seconds"}`` (JSON-ready).
    """
    cfg = cfg or WindowConfig()
    t0 = time.perf_counter()
    layouts = []
    for model in cfg.models:
        for dist in cfg.dists:
            for T in cfg.Ts:
                for P in cfg.Ps:
                    t1 = time.perf_counter()
                    layouts += [evaluate_window_layout(model, dist, T, P, s, cfg) for s in cfg.seeds]
                    if progress:
                        ms = [lay["plan_ms"] for lay in layouts[-len(cfg.seeds):]]
                        print(f"  windows {model:8s} {dist:8s} T={T:7d} P={P:2d}: {time.perf_counter() - t1:5.1f}s "
                              f"(planning {np.median(ms):.0f} ms median)", flush=True)
    rows = summarize_windows(layouts)
    return {"rows": rows, "goals": window_goals(rows), "config": asdict(cfg), "seconds": time.perf_counter() - t0}


def main(argv: Sequence[str]) -> Outcome:
    """``python -m benchmarks windows [--quick] [--progress]``: run the section alone (the entry point prints its
    markdown; progress lines go to stderr).

    Args:
        argv: the command-line arguments.

    Returns:
        The outcome (status 0; the pages are left alone).
    """
    p = argparse.ArgumentParser(prog="python -m benchmarks windows", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one seed")
    p.add_argument("--progress", action="store_true", help="progress lines on stderr")
    args = p.parse_args(argv)
    cfg = WindowConfig(seeds=(0,)) if args.quick else WindowConfig()
    with contextlib.redirect_stdout(sys.stderr):
        res = run_windows(cfg, progress=args.progress)
    return Outcome(0, res, False)
