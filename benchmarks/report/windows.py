"""The sliding windows' detail file (``benchmarks/results/windows.md``) from their results
(:func:`benchmarks.suites.windows.run_windows`'s; the figures are defined in :mod:`benchmarks.analytic.windows`)."""
from __future__ import annotations

import numpy as np

from ..analytic.windows import TOK_GOAL, WINDOW_MODELS, WORK_GOAL
from .format import table

__all__ = ["render_windows"]


def _fmt(x: float | None, nd: int = 3) -> str:
    if x is None:
        return "–"
    return "inf" if np.isinf(x) else f"{x:.{nd}f}"


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def _kind_label(kind: str) -> str:
    return {"full": "full", "model": "model (mean over layers)"}.get(kind, kind.replace("window=", "W = "))


def standing(res: dict) -> str:
    """The short paragraph of where hf_hsap stands against the goal (every figure from ``res``)."""
    goals = res["goals"]
    if not goals:
        return "No windowed configuration was run."
    n = len(goals)
    rm, wm, tm = (sum(g[k] for g in goals) for k in ("recv_met", "work_met", "tok_met"))
    worst = max(goals, key=lambda g: g["goal_worst"])
    wworst = max(goals, key=lambda g: g["work_max_mean"])
    tworst = max(goals, key=lambda g: g["tok_max_mean"])
    where = lambda g: f"{g['model']} {g['kind']}, {g['dist']}, T = {g['T'] // 1024}K, P = {g['P']}"  # noqa: E731
    miss = [g for g in goals if not g["met"]]
    parts = [f"**Where it stands**: all three goals met in {n - len(miss)}/{n} windowed configurations. "
             f"Received KV ≤ 2·W per split document held (every seed): {rm}/{n}; the largest ratio is "
             f"{_fmt(worst['goal_worst'], 4)} ({where(worst)}). Work max/mean ≤ {WORK_GOAL}: {wm}/{n} (worst "
             f"{_fmt(wworst['work_max_mean'])}, {where(wworst)}). Tokens max/mean ≤ {TOK_GOAL}: {tm}/{n} (worst "
             f"{_fmt(tworst['tok_max_mean'])}, {where(tworst)})."]
    rows = res["rows"]
    h = [r for r in rows if r["scheme"] == "hsap" and r["window"] is not None]
    ring = {(r["model"], r["kind"], r["dist"], r["T"], r["P"]): r for r in rows if r["scheme"] == "ring"}
    if h:
        parts.append(f"hf_hsap's windowed layers receive {min(r['recv_max'] for r in h):.4f}–"
                     f"{max(r['recv_max'] for r in h):.4f} of ring's KV (busiest rank); ring's work max/mean on the "
                     f"same layers is {min(ring[k]['work_max_mean'] for k in ring if k[1] != 'full'):.2f}–"
                     f"{max(ring[k]['work_max_mean'] for k in ring if k[1] != 'full'):.2f}.")
    mixed = [r for r in rows if r["scheme"] == "hsap" and r["kind"] == "full"]
    if mixed:
        fw = max(mixed, key=lambda r: r["work_max_mean"])
        model = {(r["model"], r["dist"], r["T"], r["P"]): r for r in rows
                 if r["scheme"] == "hsap" and r["kind"] == "model"}
        mw = max(model.values(), key=lambda r: r["work_max_mean"])
        ws = max(mixed, key=lambda r: r["work_max_mean_worst"])
        parts.append(f"On the full-attention layers of the mixed models (same placement) hf_hsap's work max/mean is "
                     f"{min(r['work_max_mean'] for r in mixed):.3f}–{fw['work_max_mean']:.3f} (worst {fw['model']}, "
                     f"{fw['dist']}, T = {fw['T'] // 1024}K, P = {fw['P']}, placement {fw['placement']}; worst single "
                     f"seed {ws['work_max_mean_worst']:.3f}, {ws['dist']}, T = {ws['T'] // 1024}K, P = {ws['P']}); "
                     f"over the model's layers {min(r['work_max_mean'] for r in model.values()):.3f}–"
                     f"{mw['work_max_mean']:.3f} (worst seed {max(r['work_max_mean_worst'] for r in model.values()):.3f}).")
    checks = [r["check"] for r in rows if r["scheme"] == "hsap"]
    if any(r.get("source") == "derived" for r in h):
        parts.append("The planner has no `windows` option in this run: hf_hsap's rows are its full-attention "
                     "placement with the minimal windowed KV computed here.")
    elif checks:
        parts.append("The planner's received KV equals this module's own minimum for its placement on every layout."
                     if max(checks) == 0 else
                     f"**The planner's received KV differs from this module's minimum for its placement by up to "
                     f"{max(checks):.0f} tokens on a rank.**")
    plan = list({(r["model"], r["dist"], r["T"], r["P"]): r for r in rows if r["scheme"] == "hsap"}.values())
    slow = max(plan, key=lambda r: r["plan_ms_max"])
    parts.append(f"Planning (every kind, one plan) took {min(r['plan_ms'] for r in plan):.0f}–"
                 f"{max(r['plan_ms'] for r in plan):.0f} ms (median per configuration; slowest single plan "
                 f"{slow['plan_ms_max']:.0f} ms, {slow['model']} {slow['dist']} T = {slow['T'] // 1024}K "
                 f"P = {slow['P']}); "
                 f"the section took {res['seconds']:.0f} s.")
    return " ".join(parts)


def goal_table(goals: list[dict]) -> str:
    """hf_hsap's windowed kinds against the goal."""
    body = [[g["model"], _kind_label(g["kind"]), g["dist"], f"{g['T'] // 1024}K", g["P"],
             f"{_fmt(g['goal'], 2)} ({_fmt(g['goal_worst'], 2)})",
             _mark(g["recv_met"]) + ("" if g["recv_met"] else f" {_fmt(g['goal_worst'], 2)}"),
             f"{_fmt(g['work_max_mean'])} ({_fmt(g['work_max_mean_worst'])})", _mark(g["work_met"]),
             f"{_fmt(g['tok_max_mean'])} ({_fmt(g['tok_max_mean_worst'])})", _mark(g["tok_met"]),
             _fmt(g["recv_max"], 4), f"{g['split_max']:.0f}", g["placement"], f"{g['plan_ms']:.0f}"]
            for g in goals]
    return table(["model", "layers", "dist", "T", "P", "recv / (2W·split) (worst seed)", "≤ 1",
                  "work max/mean (worst)", f"≤ {WORK_GOAL}", "tokens max/mean (worst)", f"≤ {TOK_GOAL}",
                  "recv max / ring", "split docs (max rank)", "placement", "plan ms"], body)


def scheme_tables(rows: list[dict]) -> str:
    """One table per (model, dist, T, P): every scheme, per layer kind (and the model's mean)."""
    blocks = []
    for model, dist, T, P in dict.fromkeys((r["model"], r["dist"], r["T"], r["P"]) for r in rows):
        sel = [r for r in rows if (r["model"], r["dist"], r["T"], r["P"]) == (model, dist, T, P)]
        kinds = list(dict.fromkeys(r["kind"] for r in sel))
        body = []
        for name in dict.fromkeys(r["scheme"] for r in sel):
            for kind in kinds:
                r = next(x for x in sel if x["scheme"] == name and x["kind"] == kind)
                note = []
                if r["feasible_seeds"] < r["seeds"]:
                    note.append(f"infeasible on {r['seeds'] - r['feasible_seeds']}/{r['seeds']} seeds")
                if name == "hsap" and r["check"] > 0:
                    note.append(f"planner recv ≠ placement minimum by {r['check']:.0f}")
                body.append([f"**{name}**" if name == "hsap" else name, _kind_label(kind), _fmt(r["recv_max"]),
                             _fmt(r["recv_mean"]), _fmt(r["work_max_mean"]), _fmt(r["tok_max_mean"]),
                             f"{r['mb_intra']:.0f}", f"{r['mb_inter']:.0f}",
                             _fmt(r.get("goal"), 2) if "goal" in r else "–", "; ".join(note)])
        blocks.append(f"#### {model}, {dist}, T = {T} ({T // 1024}K), P = {P}\n\n" + table(
            ["scheme", "layers", "recv max", "recv mean", "work max/mean", "tok max/mean", "L3-8B intra MB",
             "L3-8B inter MB", "recv / (2W·split)", "note"], body))
    return "\n\n".join(blocks)


def render_windows(res: dict) -> str:
    """The ``## Sliding windows`` section of ``BENCHMARKS.md`` from :func:`run_windows`'s result."""
    cfg = res["config"]
    models = "; ".join(f"`{m}`: {WINDOW_MODELS[m]['label']}" for m in cfg["models"])
    intro = (
        f"Models: {models}. Distributions {', '.join(cfg['dists'])}; T ∈ {{{', '.join(map(str, cfg['Ts']))}}}; "
        f"P ∈ {{{', '.join(map(str, cfg['Ps']))}}} (U = 1, 8 GPUs per node); medians over seeds "
        f"{{{', '.join(map(str, cfg['seeds']))}}} (worst seed in brackets). A query at i keeps the keys j of its "
        "document with j ≤ i < j + W. hf_hsap: `plan_sequence(cu, P, \"auto\", windows=layers)` (one placement for "
        "every layer; each kind has its own minimal transfers and rounds; the planner weighs the kinds by their "
        f"layers; Llama-3-8B cost model on {cfg['hardware']}), figures from `plan.stats(window=W)`. Baselines "
        "(`benchmarks/analytic/schemes.py`, `window=W`): their traffic does not change with a window — ring and zigzag ring "
        "pass every KV block round the ring, Ulysses moves every head's full sequence, all-gather gathers all KV, "
        "TE as without a window — but their work counts only the pairs the window keeps (generous: their kernels "
        "are assumed to skip masked pairs). Units as the traffic tables: recv = KV tokens received per layer, "
        "forward (Llama-3-8B full-KV units) / ring's (P − 1)/P · T; work = pairs a window keeps, max/mean over "
        "ranks; tok = tokens held, max/mean; MB = bytes received per GPU per layer, forward + backward, by the "
        "busiest GPU, bf16, Llama-3-8B heads (intra = NVLink, inter = InfiniBand). recv / (2W·split) = max over "
        "ranks of the KV received on the layer over 2·W times the split documents (on more than one rank) the rank "
        "holds a piece of (– for head-sharded schemes, inf when a rank receives KV but holds no split document). "
        "`model` rows: every layer's figures averaged over the model's layers (recv and MB: the busiest rank of "
        "each layer; work: Σ layers max / Σ layers mean, as every layer waits for its slowest rank).")
    goal = ("Goal: received KV on windowed layers at most 2·W tokens per rank per split document it holds "
            "(judged on every seed), within the unwindowed balance goals (work max/mean ≤ 1.05, tokens max/mean ≤ "
            "1.10, on the median over seeds).")
    return "\n\n".join(["## Sliding windows (no clock)", intro, goal, standing(res), goal_table(res["goals"]),
                        "### Every scheme, per layer kind", scheme_tables(res["rows"])])
