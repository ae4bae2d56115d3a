"""Sliding windows: hf_hsap's traffic and balance on windowed layers beside every scheme (no clock).

Run alone: ``python -m benchmarks.windows [--quick]`` prints the section's markdown (the full run puts it in
``BENCHMARKS.md``, :mod:`benchmarks.run`).

Models (:data:`WINDOW_MODELS`): Mistral-style, ``W = 4096`` on every layer; Gemma-3-style, 5 sliding layers
of ``W = 1024`` to 1 full-attention layer. Layouts: the spec's distributions at ``T`` ∈ {131072, 524288},
``P`` ∈ {8, 32} (``U = 1``), seeds 0–4, medians over seeds. A query at ``i`` keeps the keys ``j`` of its
document with ``j <= i < j + W`` (Transformers' ``sliding_window``).

* hf_hsap: ``plan_sequence(cu, P, "auto", windows=layers, cost=...)`` (the model's layers of every mask
  kind weighed by the planner; Llama-3-8B on A100, as the traffic section's plans), each kind's figures
  from ``plan.stats(window=W)``. Independently of the planner, this module recomputes each kind's minimal
  KV for the plan's placement (a query range needs the ``W - 1`` keys before it, :func:`placement_window_need`)
  and reports any difference (``check`` column); when the planner has no ``windows`` option, those numbers
  stand in for it (``source`` says which).
* Baselines (:func:`benchmarks.schemes.all_schemes` with ``window=W``): traffic as without a window (ring
  shards still travel the whole ring, Ulysses moves every head's sequence, all-gather gathers all KV, TE as
  today), work counting only the pairs the window keeps (their kernels assumed to skip masked pairs).
* Goal (``recv / (2W·split)``): the most KV a rank receives on a windowed layer divided by ``2 W`` times the
  number of split documents (held by more than one rank) it holds a piece of; at most 1 is the goal
  (``0 / 0 = 0``; KV received with no split document is ``inf``). Computed for every scheme that shards the
  sequence (``–`` for the head-sharded Ulysses / USP / TE a2a+p2p).
* ``model`` rows (models with several kinds): per layer, the figures of its kind, averaged over the model's
  layers: ``recv`` and MB are the means over layers of the busiest rank's; ``work max/mean`` is
  ``sum over layers of max work / sum over layers of mean work`` (every layer waits for its slowest rank).
"""
from __future__ import annotations

import argparse
import inspect
import time
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

import numpy as np

from .distributions import DISTRIBUTIONS, cu_seqlens, doc_lengths, zigzag_owner
from .hsap_scheme import hsap_stats_from_plan
from .schemes import (LLAMA3_8B_SHAPE, SchemeStats, all_schemes, doc_chunk_segments, row_segments,
                      window_rows_work, window_useful_pairs)

WINDOW_MODELS: dict[str, dict] = {
    "mistral": {"label": "Mistral-style: W = 4096 on every layer", "layers": {4096: 32}},
    "gemma3": {"label": "Gemma-3-style 5 : 1: 30 sliding layers of W = 1024, 6 full-attention layers",
               "layers": {1024: 30, None: 6}},
}
SHAPE_KEY = "llama3-8b"  # head shape of bytes and recv units, and the planner's cost model (as the traffic tables)
SKIP_SCHEMES = ("torch_cp",)  # not a scheme of the spec (and wrong on packed rows)
SHARDED = {"ring", "zigzag_ring", "allgather_kv", "te_p2p", "whole_doc", "hsap"}  # the goal ratio applies
WORK_GOAL, TOK_GOAL = 1.05, 1.10  # the unwindowed balance goals (benchmarks.traffic.traffic_goals)


def kind_key(window: int | None) -> str:
    """``"full"`` or ``"window=<W>"`` (as ``hf_hsap``'s ``PlanStats.kinds``)."""
    return "full" if window is None else f"window={window}"


@dataclass(frozen=True)
class WindowConfig:
    """The grid of the section (defaults: the issue's)."""

    models: tuple[str, ...] = tuple(WINDOW_MODELS)
    dists: tuple[str, ...] = DISTRIBUTIONS
    Ts: tuple[int, ...] = (131072, 524288)
    Ps: tuple[int, ...] = (8, 32)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    gpus_per_node: int = 8
    u_values: tuple[int, ...] = (2, 4, 8)
    hardware: str = "A100"


# ----------------------------------------------------------------------------- placements, split documents
def split_docs_per_part(doc: np.ndarray, part: np.ndarray, n_parts: int) -> np.ndarray:
    """``[n_parts]`` how many split documents (documents with tokens on more than one part) each part holds
    a piece of.

    Args:
        doc, part: ``[n_segments]`` document and owner of every segment (several segments of one document
            on one part count once).
        n_parts: number of parts.
    """
    doc, part = np.asarray(doc, dtype=np.int64), np.asarray(part, dtype=np.int64)
    if doc.size == 0:
        return np.zeros(n_parts, dtype=np.int64)
    pairs = np.unique(doc * n_parts + part)  # distinct (doc, part)
    d, p = pairs // n_parts, pairs % n_parts
    split = np.bincount(d)[d] > 1
    return np.bincount(p[split], minlength=n_parts).astype(np.int64)


def scheme_segments(name: str, lengths: np.ndarray, P: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(doc, owner)`` of the segments of a sequence-sharded baseline's placement (as :mod:`.schemes`
    places tokens); None for the head-sharded schemes."""
    L = np.asarray(lengths, dtype=np.int64)
    if name == "ring":
        d, _, _, c = row_segments(L, P)
        return d, c
    if name in ("zigzag_ring", "allgather_kv"):
        d, _, _, c = row_segments(L, 2 * P)
        return d, zigzag_owner(P)[c]
    if name == "te_p2p":
        d, _, _, c = doc_chunk_segments(-(-L // (2 * P)) * (2 * P), 2 * P)
        return d, zigzag_owner(P)[c]
    if name == "whole_doc":
        return np.arange(L.size), np.zeros(L.size, dtype=np.int64)  # one rank per document: never split
    return None


def goal_ratio(recv: np.ndarray, split: np.ndarray, window: int) -> float:
    """``max over ranks of recv / (2 W split)`` (``0 / 0 = 0``; ``x / 0 = inf``)."""
    recv, split = np.asarray(recv, dtype=np.float64), np.asarray(split, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(recv > 0, recv / (2.0 * window * split), 0.0)
    return float(r.max())


def placement_window_need(doc: np.ndarray, start: np.ndarray, end: np.ndarray, part: np.ndarray,
                          cu: np.ndarray, n_parts: int, window: int | None) -> np.ndarray:
    """Minimal forward KV of a placement under a window, computed here independently of the planner.

    A segment ``[s, e)`` of document ``d`` needs the keys ``[max(cu[d], s - W + 1), s)`` (``W = None``:
    from ``cu[d]``); a part receives the union of its segments' needs minus what it holds.

    Args:
        doc, start, end, part: ``[n_segments]`` the placement (global ``[start, end)``).
        cu: ``[n_docs + 1]`` document boundaries. n_parts: parts. window: ``W`` or None.

    Returns:
        ``[n_parts, n_parts]`` int64: KV tokens part ``i`` (row) sends part ``j`` (column).
    """
    doc, start, end, part = (np.asarray(x, dtype=np.int64) for x in (doc, start, end, part))
    lo = cu[doc] if window is None else np.maximum(cu[doc], start - int(window) + 1)
    out = np.zeros((n_parts, n_parts), dtype=np.int64)
    for p in range(n_parts):
        mine = (part == p) & (start > lo)
        if not mine.any():
            continue
        o = np.argsort(lo[mine], kind="stable")
        a, b = lo[mine][o], start[mine][o]
        top = np.maximum.accumulate(b)
        new = np.concatenate([[True], a[1:] > top[:-1]])  # a new merged interval starts here
        gid = np.cumsum(new) - 1
        ma = a[new]
        mb = np.zeros(ma.size, dtype=np.int64)
        np.maximum.at(mb, gid, b)
        before = np.concatenate([[0], np.cumsum(mb - ma)[:-1]])  # covered length before each interval

        def cover(x: np.ndarray) -> np.ndarray:  # measure of the need inside [0, x)
            i = np.searchsorted(ma, x, side="right") - 1
            ic = np.maximum(i, 0)
            return np.where(i >= 0, before[ic] + np.minimum(x, mb[ic]) - ma[ic], 0)

        other = part != p
        np.add.at(out[:, p], part[other], cover(end[other]) - cover(start[other]))
    return out


# ----------------------------------------------------------------------------- hf_hsap
def _plan(cu: np.ndarray, P: int, layers: Mapping, cfg: WindowConfig):
    """``(plan, source, ms)``: the plan of every kind (``source="planner"``), or without the ``windows``
    option when the planner has none (``source="derived"``)."""
    from hf_hsap.plan.planner import offline_link, plan_sequence

    from .traffic import planner_cost

    cost = planner_cost(SHAPE_KEY, offline_link(P, cfg.gpus_per_node), cfg.hardware)
    has_windows = "windows" in inspect.signature(plan_sequence).parameters
    t0 = time.perf_counter()
    if has_windows:
        plan = plan_sequence(cu, P, "auto", windows=dict(layers), cost=cost)
    else:  # a planner without windows: its full-attention placement, the windowed minimum computed here
        plan = plan_sequence(cu, P, "auto", cost=cost)
    return plan, "planner" if has_windows else "derived", (time.perf_counter() - t0) * 1e3


def _hsap_kind(plan, source: str, window: int | None, lengths: np.ndarray, cfg: WindowConfig
               ) -> tuple[SchemeStats, float]:
    """hf_hsap's figures of one kind as :class:`SchemeStats`, and the largest per-rank difference between
    the planner's received KV and the placement's minimum (:func:`placement_window_need`; 0 when derived)."""
    pl = plan.placement
    cu = np.asarray(plan.layout.cu_seqlens, dtype=np.int64)
    need = placement_window_need(pl.doc, pl.start, pl.end, pl.part, cu, pl.n_parts, window)
    if source == "planner":
        st = plan.stats(window=window)
        s = hsap_stats_from_plan(st, LLAMA3_8B_SHAPE, cfg.gpus_per_node, U=1, lengths=lengths, name="hsap")
        diff = float(np.max(np.abs(np.asarray(st.recv_kv_tokens) - need.sum(0))))
    else:
        ds = cu[pl.doc]
        work = np.bincount(pl.part, weights=window_rows_work(pl.start - ds, pl.end - ds, window).astype(np.float64),
                           minlength=pl.n_parts)
        st = {"tokens": pl.tokens_per_part().tolist(), "attn_work": work.tolist(),
              "recv_kv_tokens": need.sum(0).tolist(), "send_kv_pairs": need.tolist()}
        s = hsap_stats_from_plan(st, LLAMA3_8B_SHAPE, cfg.gpus_per_node, U=1, lengths=lengths, name="hsap")
        diff = 0.0
    s.useful_pairs = window_useful_pairs(lengths, window)
    return s, diff


# ----------------------------------------------------------------------------- one layout
def _metrics(s: SchemeStats) -> dict:
    """Per-rank arrays of one scheme on one layer kind."""
    return {"recv": np.asarray(s.recv_kv, dtype=np.float64), "work": np.asarray(s.work, dtype=np.float64),
            "tok": np.asarray(s.tokens, dtype=np.float64), "intra": np.asarray(s.bytes_intra, dtype=np.float64),
            "inter": np.asarray(s.bytes_inter, dtype=np.float64), "feasible": bool(s.feasible)}


def evaluate_window_layout(model: str, dist: str, T: int, P: int, seed: int, cfg: WindowConfig) -> dict:
    """Every scheme on one layout, per layer kind of ``model``.

    Returns:
        ``{"model", "dist", "T", "P", "seed", "n_docs", "source", "plan_ms", "placement", "check",
        "kinds": {kind: {scheme: metrics}}, "split": {scheme: [P] split documents per rank},
        "layers": {kind: count}}`` (metrics: per-rank arrays, :func:`_metrics`).
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
        per = {n: _metrics(s) for n, s in all_schemes(lengths, P, LLAMA3_8B_SHAPE, cfg.gpus_per_node,
                                                      cfg.u_values, window=w).items() if n not in SKIP_SCHEMES}
        hs, diff = _hsap_kind(plan, source, w, lengths, cfg)
        out["kinds"][k] = {"hsap": _metrics(hs), **per}
        out["check"] = max(out["check"], diff)
    for name in out["kinds"][kind_key(next(iter(layers)))]:
        if name not in split:
            seg = scheme_segments(name, lengths, P)
            if seg is not None:
                split[name] = split_docs_per_part(seg[0], seg[1], P)
    out["split"] = split
    return out


def _layout_figures(lay: dict, name: str) -> dict[str, dict]:
    """``{kind or "model": figures}`` of one scheme on one layout (ring-relative recv, MB of the busiest GPU)."""
    ring_ref = (lay["P"] - 1) / lay["P"] * lay["T"]
    out, per_kind = {}, {}
    for k, schemes in lay["kinds"].items():
        m = schemes[name]
        f = {"recv_max": m["recv"].max() / ring_ref, "recv_mean": m["recv"].mean() / ring_ref,
             "work_max_mean": m["work"].max() / m["work"].mean(), "tok_max_mean": m["tok"].max() / m["tok"].mean(),
             "mb_intra": m["intra"].max() / 1e6, "mb_inter": m["inter"].max() / 1e6, "feasible": m["feasible"]}
        w = lay["windows"][k]
        if w is not None and name in lay["split"]:
            f["goal"] = goal_ratio(m["recv"], lay["split"][name], w)
            f["split_max"] = float(lay["split"][name].max())
        out[k] = f
        per_kind[k] = m
    if len(per_kind) > 1:
        n = {k: lay["layers"][k] for k in per_kind}
        tot = sum(n.values())
        avg = lambda f: sum(n[k] * f(m) for k, m in per_kind.items()) / tot  # noqa: E731
        out["model"] = {"recv_max": avg(lambda m: m["recv"].max()) / ring_ref,
                        "recv_mean": avg(lambda m: m["recv"].mean()) / ring_ref,
                        "work_max_mean": avg(lambda m: m["work"].max()) / avg(lambda m: m["work"].mean()),
                        "tok_max_mean": out[next(iter(per_kind))]["tok_max_mean"],
                        "mb_intra": avg(lambda m: m["intra"].max()) / 1e6,
                        "mb_inter": avg(lambda m: m["inter"].max()) / 1e6,
                        "feasible": all(m["feasible"] for m in per_kind.values())}
    return out


def summarize_windows(layouts: list[dict]) -> list[dict]:
    """Median over seeds per (model, dist, T, P, scheme, kind); ``*_worst`` the worst seed's.

    Returns:
        Rows with ``model, dist, T, P, scheme, kind, seeds, feasible_seeds`` and the figures of
        :func:`_layout_figures`; hf_hsap rows also carry ``source``, ``placement``, ``plan_ms`` and ``check``.
    """
    groups: dict[tuple, list[dict]] = {}
    for lay in layouts:
        groups.setdefault((lay["model"], lay["dist"], lay["T"], lay["P"]), []).append(lay)
    rows = []
    for (model, dist, T, P), lays in groups.items():
        names = list(lays[0]["kinds"][next(iter(lays[0]["kinds"]))])
        for name in names:
            figs = [_layout_figures(lay, name) for lay in lays]
            for kind in figs[0]:
                fs = [f[kind] for f in figs]
                row = {"model": model, "dist": dist, "T": T, "P": P, "scheme": name, "kind": kind,
                       "window": lays[0]["windows"].get(kind), "seeds": len(fs),
                       "feasible_seeds": int(sum(f["feasible"] for f in fs))}
                for key in fs[0]:
                    if key != "feasible":
                        vals = [f[key] for f in fs]
                        row[key] = float(np.median(vals))
                        row[f"{key}_worst"] = float(np.max(vals))
                if name == "hsap":
                    picks = [lay["placement"] for lay in lays]
                    row["placement"] = ", ".join(f"{p}×{picks.count(p)}" for p in sorted(set(picks)))
                    row["source"] = ", ".join(sorted({lay["source"] for lay in lays}))
                    row["plan_ms"] = float(np.median([lay["plan_ms"] for lay in lays]))
                    row["plan_ms_max"] = float(np.max([lay["plan_ms"] for lay in lays]))
                    row["check"] = float(max(lay["check"] for lay in lays))
                    row["n_docs"] = float(np.median([lay["n_docs"] for lay in lays]))
                rows.append(row)
    return rows


def window_goals(rows: list[dict]) -> list[dict]:
    """The issue's goal per windowed kind of hf_hsap: ``recv / (2W·split) <= 1`` on every seed, work
    max/mean <= 1.05 and tokens max/mean <= 1.10 (median over seeds, as the unwindowed goals).

    Returns:
        One row per (model, kind, dist, T, P) with the values and ``*_met`` flags.
    """
    out = []
    for r in rows:
        if r["scheme"] != "hsap" or r["window"] is None or "goal" not in r:
            continue
        g = {k: r[k] for k in ("model", "kind", "window", "dist", "T", "P", "goal", "goal_worst", "work_max_mean",
                               "work_max_mean_worst", "tok_max_mean", "tok_max_mean_worst", "recv_max", "split_max",
                               "placement", "plan_ms", "plan_ms_max", "check", "source")}
        g["recv_met"] = r["goal_worst"] <= 1.0
        g["work_met"] = r["work_max_mean"] <= WORK_GOAL
        g["tok_met"] = r["tok_max_mean"] <= TOK_GOAL
        g["met"] = g["recv_met"] and g["work_met"] and g["tok_met"]
        out.append(g)
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


# ----------------------------------------------------------------------------- rendering
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
    from .report import table

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
    from .report import table

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
        "(`benchmarks/schemes.py`, `window=W`): their traffic does not change with a window — ring and zigzag ring "
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
    goal = ("Goal (issue): received KV on windowed layers at most 2·W tokens per rank per split document it holds "
            "(judged on every seed), within the unwindowed balance goals (work max/mean ≤ 1.05, tokens max/mean ≤ "
            "1.10, on the median over seeds).")
    return "\n\n".join(["## Sliding windows (no clock)", intro, goal, standing(res), goal_table(res["goals"]),
                        "### Every scheme, per layer kind", scheme_tables(res["rows"])])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.windows [--quick]``: run the section and print its markdown."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.windows", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one seed")
    p.add_argument("--progress", action="store_true", help="progress lines on stderr")
    args = p.parse_args(argv)
    import contextlib
    import sys

    cfg = WindowConfig(seeds=(0,)) if args.quick else WindowConfig()
    with contextlib.redirect_stdout(sys.stderr):
        res = run_windows(cfg, progress=args.progress)
    print(render_windows(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
