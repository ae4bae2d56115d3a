"""The detail files of the core suite (``python -m benchmarks core``, ``bash scripts/bench.sh``) in markdown: the goals
with their figures, exact traffic and balance, the cost model, planning time and the plots (every number is read from
the results dict; :mod:`benchmarks.report.publish` writes them, :mod:`benchmarks.report.page` the page that links
them). The CPU measurements are :mod:`benchmarks.report.cpu`'s.
"""
from __future__ import annotations

import os
from pathlib import Path

from . import format as rp
from .memory import MEMORY_GOALS, memory_goal_rows
from .placement_goals import PLACEMENT_GOALS, placement_goal_rows
from .plots import plot_paths
from .sources import PLOTS, ROOT

__all__ = ["CORE_GOALS", "busy", "calibration_note", "core_goal_rows", "cost_detail", "data_line", "goals_detail",
           "planning_detail", "plots_detail", "traffic_detail"]

CORE_GOALS = "traffic, balance and speed"  # the topic of the core suite's goals (their heading)


def _join(vals) -> str:
    return ", ".join(str(v) for v in (vals or []))


def busy(meta: dict) -> bool:
    """Whether other jobs shared the machine during the run (the 1-minute load above the cores).

    Args:
        meta: the run's ``meta`` (``load_start``, ``load_end``, ``cores``).

    Returns:
        True when wall times are noisy.
    """
    return max(meta["load_start"][0], meta["load_end"][0]) > (meta["cores"] or 1)


def data_line(res: dict) -> str:
    """Which run the figures of a detail file come from: command, date, commit, machine and software.

    Args:
        res: the results dict of :mod:`benchmarks.suites.core` (``meta``, ``seconds``).

    Returns:
        One markdown line.
    """
    m = res["meta"]
    secs = ", ".join(f"{k} {v:.0f} s" for k, v in res.get("seconds", {}).items())
    return (f"Data: `{m['command']}` (equivalently `bash scripts/bench.sh`) on {m['date']}, commit `{m['commit']}`, "
            f"{m['seconds']:.0f} s ({secs}); {m['cpu']}, {m['cores']} cores, load average (1 min) "
            f"{m['load_start'][0]:.1f} at the start, {m['load_end'][0]:.1f} at the end"
            + (" (**other jobs shared the machine: wall times are noisy**)" if busy(m) else "")
            + f"; torch {m['torch']}, numpy {m['numpy']}, Python {m['python']}. Work fixed by "
            "`benchmarks/SPEC.md`; raw numbers in `benchmarks/results/results.json`.")


def core_goal_rows(res: dict) -> list[list[str]]:
    """The rows ``[goal, value, status]`` of the core suite's goals (balance, traffic, predicted TGS, CPU, planning).

    Args:
        res: the results dict of :mod:`benchmarks.suites.core`.

    Returns:
        The table's rows; the CPU row only when the run measured on CPU.
    """
    rows = []
    tg = res["traffic_goals"]
    for key, lim, label in (("work", "≤ 1.05", "work max/mean"), ("tok", "≤ 1.10", "tokens max/mean")):
        ok = [g[f"{key}_met"] for g in tg]
        rows.append([f"{label} {lim} (default placement, T = 128K, P ∈ {{8, 32}}, longtail / mixed / sft)",
                     rp.span([g[key] for g in tg], 3), f"{rp._met(all(ok))} ({sum(ok)}/{len(ok)})"])
    for dists, goal in ((("longtail", "mixed"), "≤ 0.35"), (("sft",), "≤ 0.05")):
        sel = [g for g in tg if g["dist"] in dists]
        ok = [g["recv_met"] for g in sel]
        detail = "; ".join(f"{g['dist']} P={g['P']}: {g['recv']:.3f} (floor {g['recv_floor']:.3f})" for g in sel)
        rows.append([f"recv KV max {goal} of ring's ({' / '.join(dists)})", detail, f"{rp._met(all(ok))} ({sum(ok)}/{len(ok)})"])
    a100 = [r for r in res["cost_rows"] if r["hw"] == "A100" and r["nodes"] == 1]
    for T, need in ((524288, 1.3), (131072, 1.2)):
        v = [r["hsap_vs_ulysses"] for r in a100 if r["T"] == T]
        vb = [r["bestU_vs_ulysses"] for r in a100 if r["T"] == T]
        vi = [r["ideal_tgs"] / r["tgs"]["ulysses"] for r in a100 if r["T"] == T]
        if v:
            rows.append([f"predicted TGS ≥ {need}× Ulysses, 8×A100, T = {T // 1024}K (both models, 4 distributions)",
                         f"hsap {rp.span(v)}; best U {rp.span(vb)}; the model's ideal schedule would reach {rp.span(vi)}",
                         f"{rp._met(min(v) >= need)} ({sum(x >= need for x in v)}/{len(v)})"])
    c = res["cost_goals"]["counts"]
    cb = res["cost_goals_bestU"]["counts"]
    c1 = res["cost_goals_U1"]["counts"]
    cbat = res["cost_goals_batched"]["counts"]
    vo = [r["hsap_vs_best_other"] for r in res["cost_rows"]]
    v1 = [r["tgs"]["hsap_U1"] / r["tgs"][r["best_other"]] for r in res["cost_rows"]]
    rows.append(["predicted TGS ≥ 1.1× the best other scheme, every configuration",
                 f"hsap (default) {rp.span(vo)}, matches or beats the best other in "
                 f"{sum(x >= 0.995 for x in vo)}/{len(vo)}; in one batched round met "
                 f"{cbat['best_other'][0]}/{cbat['best_other'][1]}; flat U = 1 {rp.span(v1)}, met "
                 f"{c1['best_other'][0]}/{c1['best_other'][1]}; best U met {cb['best_other'][0]}/{cb['best_other'][1]}",
                 f"{rp._met(c['best_other'][0] == c['best_other'][1])} ({c['best_other'][0]}/{c['best_other'][1]})"])
    vb = [r["bound_over_hsap"] for r in res["cost_rows"]]
    vi = [r["ideal_tgs"] / r["bound_tgs"] for r in res["cost_rows"]]
    rows.append(["predicted TGS within 1.15× of the physical bound, every configuration",
                 f"bound / hsap {rp.span(vb)}; even the model's ideal schedule reaches only {rp.span(vi)} of the bound",
                 f"{rp._met(c['bound'][0] == c['bound'][1])} ({c['bound'][0]}/{c['bound'][1]})"])
    if res.get("measured"):
        lt = [cfg for cfg in res["measured"]["configs"] if cfg["dist"] == "longtail"]
        others = [v for cfg in lt for n, v in cfg["results"].items() if not n.startswith("hsap")]
        ratios = [v["ratio"] for v in others]
        rows.append(["CPU measured: hf_hsap fwd+bwd faster than every other schedule on longtail (world 4)",
                     f"other / hsap wall (median) {rp.span(ratios)}; best runs {rp.span([v['min_ratio'] for v in others])}; "
                     f"CPU time {rp.span([v['cpu_ratio'] for v in others])}",
                     f"{rp._met(bool(ratios) and min(ratios) > 1.0)} ({sum(x > 1 for x in ratios)}/{len(ratios)})"
                     + _parity(lt)])
    p64 = next((r for r in res["planning"] if r["P"] == 64 and r["placement"] == "auto"), None)
    if p64:
        rows.append(["planning ≤ 20 ms cold, ≤ 0.1 ms cached (T = 512K, 2,000 documents, P = 64, auto)",
                     f"cold {p64['cold_cpu_ms']:.1f} ms CPU time "
                     f"(minimum {p64.get('cold_cpu_min_ms', float('nan')):.1f}; "
                     f"{p64['cold_ms']:.1f} ms wall), cached "
                     f"{p64['cached_ms']:.3f} ms",
                     f"cold {rp._met(p64['cold_cpu_ms'] <= 20)}, cached {rp._met(p64['cached_ms'] <= 0.1)}"])
    return rows


def _parity(configs: list[dict], margin: float = 0.03) -> str:
    """A note naming the schedules within ``margin`` of hf_hsap (or better) by both CPU-time measures: the
    total over ranks (work) and the busiest rank's (critical path), which other load disturbs less."""
    close: dict[str, list[float]] = {}
    for c in configs:
        h = c["results"]["hsap"]
        for n, v in c["results"].items():
            busiest = v["cpu_max_ms"] / h["cpu_max_ms"]
            if not n.startswith("hsap") and v["cpu_ratio"] < 1 + margin and busiest < 1 + margin:
                close.setdefault(n, []).append(busiest)
    if not close:
        return ""
    return ("; by CPU time (total over ranks and busiest rank) within 3 % of hf_hsap or ahead of it: " +
            ", ".join(f"{n} (busiest rank {rp.span(v)} × hf_hsap's)" for n, v in close.items()) +
            "; wall-time differences this small are within the noise of this shared machine")


def _assumptions(res: dict) -> str:
    """The cost model's assumptions, per GPU from the results and the rest as fixed text."""
    lines = ["Assumptions (from `benchmarks/analytic/cost_model.py`, overridable by `benchmarks/calibration.json`):", ""]
    for hw, a in res["assumptions"].items():
        lines.append(f"- {hw}: attention kernel at {a['attn_efficiency']:.0%} and GEMMs at {a['gemm_efficiency']:.0%} "
                     f"of dense bf16 peak; links at {a['link_efficiency']:.0%} of nominal; latency "
                     f"{a['alpha_intra_s'] * 1e6:.0f} µs per round inside a node, {a['alpha_inter_s'] * 1e6:.0f} µs "
                     f"between nodes; attention backward = {a['attn_bwd_factor']}× forward FLOPs.")
    lines += [
        "- FLOPs: attention forward 4 · pairs · head_dim · q_heads; linear layers 6 · params_per_layer per token "
        "(fwd + bwd). Norms, rotary, embeddings, LM head, optimizer and gradient sync are not modelled; no recomputation.",
        "- A transfer takes max(intra bytes / NVLink, inter bytes / IB) + rounds · latency. All-to-all, all-gather and "
        "reduce-scatter are fully exposed. KV rings are simulated step by step (the next block's transfer overlaps "
        "this step's compute; backward dK/dV hops; fully masked blocks cost nothing). hf_hsap's rounds are simulated "
        "in the runtime's order by the planner's own functions (`hf_hsap/plan/pipeline.py`): every round posted at once "
        "(the link serves them in order) during the local item, then per round wait and compute; backward returns dK/dV per round and collects them at the end. One batched round reduces to "
        "max(local, transfer) + remote. GEMMs never hide attention communication (the same pessimism for every scheme).",
        "- Every GPU synchronises each layer: a layer lasts as long as its slowest GPU; TGS = T / (GPUs · step time).",
        "- Physical bound: all FLOPs at peak, evenly spread, communication hidden. *Ideal*: the same at the "
        "assumed kernel efficiencies (what a perfect schedule would reach in this model).",
        "- dK/dV are counted in bf16 for every scheme, as hf_hsap's runtime returns them (`grad_comm_dtype` "
        "defaults to the inputs' dtype; `torch.float32` doubles that term).",
        "- hf_hsap rows come from the real plans (`plan_sequence(..., placement, ulysses_size=U, rounds=...)`), each "
        "model planned with its own `CostModel.from_config` for the row's GPU (A100 or H100) as the trainers do, KV "
        "priced at NVLink speed when the SP group fits in one node; the traffic tables show the A100 plans; `hsap` is `ulysses_size=\"auto\"` (U = 1 on one node, U = 8 "
        "across nodes; rounds `auto`; the default when the model's heads are unknown), `hsap_batched` the same in one "
        "batched round, `hsap_U1` flat SAP, `hsap_bestU` the best of U ∈ {1, 2, 4, 8} (what the default, "
        "`\"per_batch\"` with the heads known, chooses per batch, up to its memory cap).",
    ]
    return "\n".join(lines)


def goals_detail(res: dict) -> str:
    """Every goal with the figures it is judged on.

    Args:
        res: the results dict of :mod:`benchmarks.suites.core` with the side results (``peers``, ``memory_levers``,
            ``memory_model``) of :func:`benchmarks.report.sources.load_results`.

    Returns:
        Markdown: one table per topic (a goal whose figures are missing has no row).
    """
    parts = [f"## Goals: {CORE_GOALS}",
             rp.table(["goal", "value (median over seeds)", "status"], core_goal_rows(res))]
    placement = placement_goal_rows(res)
    if placement:
        parts += [f"## Goals: {PLACEMENT_GOALS}",
                  "Placement on layouts nobody tuned for (the placement sweep, [sweep.md](sweep.md)) and hf_hsap "
                  "beside DeepSpeed's sequence parallelism ([peers.md](peers.md)); est = the planner's cost model, "
                  "LB = every part equally loaded, no communication.",
                  rp.table(["goal", "value", "status"], placement)]
    memory = memory_goal_rows(res.get("memory_levers"), res.get("memory_model"), res.get("sft_memory"),
                              res.get("host_memory"))
    if memory:
        parts += [f"## Goals: {MEMORY_GOALS}",
                  "Million-token training: the memory levers and the memory model ([memory.md](memory.md); "
                  "`bash scripts/bench_memory.sh`).", rp.table(["goal", "value", "status"], memory)]
    return "\n\n".join(parts)


def traffic_detail(res: dict) -> str:
    """Exact traffic and balance: the balance and traffic goals per distribution and P, then every scheme's table.

    Args:
        res: the results dict of :mod:`benchmarks.suites.core` (``traffic_rows``, ``traffic_goals``, ``traffic_config``).

    Returns:
        Markdown.
    """
    tcfg = res.get("traffic_config", {})
    return "\n\n".join([
        "## Exact traffic and balance (no clock)",
        f"Distributions {', '.join(tcfg.get('dists', []))}; T ∈ {{{_join(tcfg.get('Ts'))}}}; P ∈ {{{_join(tcfg.get('Ps'))}}}; "
        f"medians over seeds {{{_join(tcfg.get('seeds'))}}} (worst seed in brackets where shown). recv = KV tokens received per layer in the "
        "forward pass (full-KV units of Llama-3-8B: 8 kv heads) / ring's (P − 1)/P · T. work = (query, key) pairs "
        "per rank (a Ulysses rank holding H/U heads counts 1/U), max/mean. tok = tokens held (activation memory), "
        "max/mean. MB = bytes received per GPU per layer, forward + backward, by the busiest GPU, bf16, 8 GPUs per "
        "node (intra = NVLink, inter = InfiniBand). Schemes: `benchmarks/analytic/schemes.py` (counting rules in its "
        "docstring); `usp_UaxRb` and `te_a2a_p2p_UaxRb` are Ulysses a × ring b; `hsap` is hf_hsap's default "
        "(U = 1 on one node, U = 8 across nodes), `hsap_U1` flat SAP, `hsap_balanced` / `hsap_contiguous` its other "
        "placements (U = 1), `hsap_U<U>` the hierarchy with placement auto; the note gives placement / round order. "
        "With U > 1 a GPU receives its share of the inter-part KV plus the all-to-all (as Ulysses / USP). *recv "
        "floor*: the least recv max of any flat (U = 1) KV-moving placement within the 1.10 token cap (see "
        "[analysis.md](analysis.md)).",
        rp.traffic_goal_table(res["traffic_goals"]),
        "### Every scheme",
        rp.traffic_tables(res["traffic_rows"]),
    ])


def cost_detail(res: dict) -> str:
    """The cost model: its assumptions, the goals' counts, every configuration's predicted TGS, and whether a GPU
    calibration was used.

    Args:
        res: the results dict of :mod:`benchmarks.suites.core` (``cost_rows``, ``cost_goals*``, ``assumptions``,
            ``calibrated``).

    Returns:
        Markdown.
    """
    return "\n\n".join([
        "## Cost model: predicted tokens / s / GPU (fwd + bwd, 32 layers)",
        _assumptions(res),
        "Goals (medians over seeds):",
        "\n".join(rp.cost_goal_lines(res["cost_goals"], "hf_hsap default (U auto, rounds auto)")
                  + rp.cost_goal_lines(res["cost_goals_batched"], "hf_hsap default in one batched round")
                  + rp.cost_goal_lines(res["cost_goals_U1"], "flat hf_hsap (U = 1)")
                  + rp.cost_goal_lines(res["cost_goals_bestU"], "hf_hsap with the best U ∈ {1, 2, 4, 8}")),
        "TGS per GPU; `(U…)` = the Ulysses degree(s) that won across seeds; † = wrong result on this layout "
        "(no document mask); infeasible = heads do not divide or memory cap exceeded. Ratios use the medians.",
        rp.cost_tables(res["cost_rows"]),
        "## GPU calibration",
        "`benchmarks/suites/gpu_calibrate.py` (`python -m benchmarks calibrate`) times one rank's work items against one varlen kernel over the same FLOPs "
        "on a lent GPU and writes `benchmarks/calibration.json`. " + calibration_note(res),
    ])


def calibration_note(res: dict) -> str:
    """Whether the cost model ran on a GPU calibration or on its default efficiencies.

    Args:
        res: the results dict of :mod:`benchmarks.suites.core` (``calibrated``).

    Returns:
        One sentence.
    """
    if res.get("calibrated"):
        return "A calibration file is present and was used (see its `source`)."
    return "No GPU was available to this work so far: the cost model runs on its default efficiencies."


PLANNING_TEXT = (
    "`plan_sequence` on the host (one process, numpy), T = 524288 with 2,000 documents (longtail-shaped "
    "lengths scaled to the row, see `benchmarks/suites/planning.py`), median of several runs in this process (15 "
    "for cold plans), by wall clock and by the planning thread's CPU time (`time.thread_time`; the goal is "
    "judged on the median CPU time: other jobs on the machine inflate wall time), and the minimum of the CPU "
    "times (what the code costs when nothing slows the machine: its speed moves by up to 2x from one minute "
    "to the next, and its slow phases inflate CPU time too); cached = a warm `PlanCache` hit (validation + "
    "hashing + lookup).")


def planning_detail(res: dict) -> str:
    """Planning time: how it is measured and the table.

    Args:
        res: the results dict of :mod:`benchmarks.suites.core` (``planning``).

    Returns:
        Markdown.
    """
    return "\n\n".join(["## Planning time", PLANNING_TEXT, rp.planning_table(res["planning"])])


def plots_detail(res: dict, folder: Path) -> str:
    """The plots of the run, linked from ``folder``.

    Args:
        res: the results dict of :mod:`benchmarks.suites.core` (its plots: :func:`benchmarks.report.plots.plot_paths`
            in ``benchmarks/plots/``).
        folder: where the detail file goes (the images' links are relative to it).

    Returns:
        Markdown.
    """
    paths = plot_paths(res, PLOTS)
    return "\n\n".join(["## Plots", "\n".join(f"![{p.relative_to(ROOT).as_posix()}]"
                                               f"({Path(os.path.relpath(p, folder)).as_posix()})" for p in paths)])
