"""The core suite: ``python -m benchmarks core [--quick] [--skip-cpu]`` (``bash scripts/bench.sh``).

Writes the raw numbers to ``benchmarks/results/results.json``; the entry point then draws the PNG plots into
``benchmarks/plots/`` and renders ``BENCHMARKS.md`` (the page) and the detail files ``benchmarks/results/*.md`` from
every results JSON there (:mod:`benchmarks.report`). Measured: exact traffic and balance (no clock,
:mod:`benchmarks.suites.traffic`), sliding windows (:mod:`benchmarks.suites.windows`, no clock), the placement sweep
(:mod:`benchmarks.suites.sweep`, no clock), cost-model predictions, planning time, and (unless ``--skip-cpu``) the CPU
measurements (4 spawned gloo ranks) and peak memory. ``--quick`` shrinks everything for development (one seed, a
short CPU row); ``python -m benchmarks report --plots`` measures nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..analytic.cost_model import DEFAULT_CALIBRATION, load_assumptions
from ..analytic.predictions import CostConfig, cost_goals, run_predictions
from ..analytic.sweep import SweepConfig
from ..analytic.traffic import TrafficConfig, summarize_traffic, traffic_goals
from ..analytic.windows import WindowConfig
from .measured import MeasureConfig, run_kernel_paths, run_kernel_shapes, run_measured, run_memory
from .output import RESULTS, Outcome, command_line, renders_pages, stamp
from .planning import PlanningConfig, run_planning
from .sweep import run_sweep
from .traffic import run_traffic
from .windows import run_windows

DEFAULT_OUT = RESULTS / "results.json"


def machine_info() -> dict:
    """Date, CPU model, cores, load, versions and git commit of this run."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {**stamp(), "cpu": cpu, "cores": os.cpu_count(), "load_start": list(os.getloadavg()),
            "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version()}


def run_tables(tcfg: TrafficConfig, ccfg: CostConfig, progress: bool = False) -> dict:
    """The clock-free part: traffic / balance tables, their goals, cost-model predictions and goals.

    Args:
        tcfg: the traffic grid; ccfg: the cost-model configurations (their ``P`` must be in the grid).
        progress: print progress lines.

    Returns:
        ``{"traffic_rows", "traffic_goals", "cost_rows", "cost_goals", "cost_goals_U1", "cost_goals_batched",
        "cost_goals_bestU",
        "assumptions", "traffic_config", "seconds"}``.
    """
    t0 = time.perf_counter()
    layouts = run_traffic(tcfg, progress)
    rows = summarize_traffic(layouts)
    t1 = time.perf_counter()
    cost = run_predictions(layouts, ccfg)
    hws = sorted({hw for hw, _ in ccfg.topologies})
    return {
        "traffic_rows": rows, "traffic_goals": traffic_goals(rows), "cost_rows": cost,
        "cost_goals": cost_goals(cost, "hsap"), "cost_goals_U1": cost_goals(cost, "hsap_U1"),
        "cost_goals_batched": cost_goals(cost, "hsap_batched"),
        "cost_goals_bestU": cost_goals(cost, "hsap_bestU"),
        "assumptions": {hw: dataclasses.asdict(load_assumptions(hw)) for hw in hws},
        "traffic_config": dataclasses.asdict(tcfg), "seconds": {"traffic": t1 - t0, "cost": time.perf_counter() - t1},
    }


def compact(obj: object, keep_layer: tuple[str, ...] = ("hsap", "hsap_batched", "hsap_U1", "hsap_bestU", "ulysses")) -> object:
    """The results made small for ``results.json``: floats to 6 significant digits; per-scheme layer
    times kept only for ``keep_layer`` and each row's best other scheme."""
    if isinstance(obj, float):
        return float(f"{obj:.6g}")
    if isinstance(obj, dict):
        out = {k: compact(v, keep_layer) for k, v in obj.items()}
        if "layer" in out and "best_other" in out:
            out["layer"] = {k: v for k, v in out["layer"].items() if k in keep_layer or k == out["best_other"]}
        return out
    if isinstance(obj, (list, tuple)):
        return [compact(v, keep_layer) for v in obj]
    return obj


def build_parser() -> argparse.ArgumentParser:
    """The command-line options of the core suite."""
    p = argparse.ArgumentParser(prog="python -m benchmarks core", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes for development (one seed, T=4096 on CPU)")
    p.add_argument("--skip-cpu", action="store_true", help="skip the CPU timing and memory runs")
    p.add_argument("--results", default=str(DEFAULT_OUT),
                   help="the results JSON (default benchmarks/results/results.json, which the pages read; elsewhere, "
                   "the pages and the plots are left alone)")
    return p


def main(argv: Sequence[str]) -> Outcome:
    """Run everything on the command line ``argv`` and write the results JSON; the outcome (status 0) asks for the
    pages and the plots when the results went to the default file."""
    args = build_parser().parse_args(argv)
    results_path = Path(args.results)
    t_start = time.perf_counter()
    meta = machine_info()
    meta["command"] = command_line("core", argv)
    tcfg = TrafficConfig(seeds=(0,)) if args.quick else TrafficConfig()
    mcfg = (MeasureConfig(T=4096, reps=3, memory_T=16384) if args.quick else MeasureConfig())
    pcfg = PlanningConfig(cold_runs=3, cached_runs=200) if args.quick else PlanningConfig()
    print("traffic and cost model ...", flush=True)
    results = run_tables(tcfg, CostConfig(), progress=True)
    print("sliding windows ...", flush=True)
    results["windows"] = run_windows(WindowConfig(seeds=(0,)) if args.quick else WindowConfig(), progress=True)
    results["seconds"]["windows"] = results["windows"]["seconds"]
    print("placement sweep ...", flush=True)
    results["sweep"] = run_sweep(SweepConfig.quick() if args.quick else SweepConfig(), progress=True)
    results["seconds"]["sweep"] = results["sweep"]["seconds"]
    print("planning time ...", flush=True)
    t0 = time.perf_counter()
    results["planning"] = run_planning(pcfg)
    results["seconds"]["planning"] = time.perf_counter() - t0
    results["measured"] = results["memory"] = None
    if not args.skip_cpu:
        print("measured on CPU ...", flush=True)
        results["measured"] = run_measured(mcfg, progress=True)
        results["measure_config"] = dataclasses.asdict(mcfg)
        results["seconds"]["measured"] = results["measured"]["seconds"]
        t0 = time.perf_counter()
        results["kernel_paths"] = run_kernel_paths(mcfg)
        results["kernel_shapes"] = run_kernel_shapes(mcfg)
        results["seconds"]["kernel_paths"] = time.perf_counter() - t0
        print("peak memory ...", flush=True)
        t0 = time.perf_counter()
        results["memory"] = run_memory(mcfg, progress=True)
        results["seconds"]["memory"] = time.perf_counter() - t0
    meta["load_end"] = list(os.getloadavg())
    meta["seconds"] = time.perf_counter() - t_start
    results["meta"] = meta
    results["calibrated"] = DEFAULT_CALIBRATION.exists()
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(compact(results), default=float) + "\n")
    print(f"wrote {args.results} in {meta['seconds']:.0f}s")
    return Outcome(0, None, renders_pages(results_path, DEFAULT_OUT, False))
