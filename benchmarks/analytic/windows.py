"""Sliding windows: hf_hsap's traffic and balance on windowed layers beside every scheme (no clock).

Its run: :mod:`benchmarks.suites.windows` (``python -m benchmarks windows [--quick]`` prints the section's markdown;
the core suite, :mod:`benchmarks.suites.core`, puts it in ``benchmarks/results/windows.md``).

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
* Baselines (:func:`benchmarks.analytic.schemes.all_schemes` with ``window=W``): traffic as without a window (ring
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

from dataclasses import dataclass

import numpy as np

from .distributions import DISTRIBUTIONS, zigzag_owner
from .hsap_scheme import hsap_stats_from_plan
from .schemes import LLAMA3_8B_SHAPE, SchemeStats
from .window_pairs import doc_chunk_segments, row_segments, window_rows_work, window_useful_pairs

WINDOW_MODELS: dict[str, dict] = {
    "mistral": {"label": "Mistral-style: W = 4096 on every layer", "layers": {4096: 32}},
    "gemma3": {"label": "Gemma-3-style 5 : 1: 30 sliding layers of W = 1024, 6 full-attention layers",
               "layers": {1024: 30, None: 6}},
}
SHAPE_KEY = "llama3-8b"  # head shape of bytes and recv units, and the planner's cost model (as the traffic tables)
SKIP_SCHEMES = ("torch_cp",)  # not a scheme of the spec (and wrong on packed rows)
SHARDED = {"ring", "zigzag_ring", "allgather_kv", "te_p2p", "whole_doc", "hsap"}  # the goal ratio applies
WORK_GOAL, TOK_GOAL = 1.05, 1.10  # the unwindowed balance goals (benchmarks.analytic.traffic.traffic_goals)


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


def hsap_kind_stats(plan, source: str, window: int | None, lengths: np.ndarray, cfg: WindowConfig
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
def scheme_metrics(s: SchemeStats) -> dict:
    """Per-rank arrays of one scheme on one layer kind."""
    return {"recv": np.asarray(s.recv_kv, dtype=np.float64), "work": np.asarray(s.work, dtype=np.float64),
            "tok": np.asarray(s.tokens, dtype=np.float64), "intra": np.asarray(s.bytes_intra, dtype=np.float64),
            "inter": np.asarray(s.bytes_inter, dtype=np.float64), "feasible": bool(s.feasible)}


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
