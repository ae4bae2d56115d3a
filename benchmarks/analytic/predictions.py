"""Cost-model tables: predicted TGS of every scheme beside hf_hsap and the physical bound.

Takes the :class:`~benchmarks.analytic.traffic.LayoutResult` of the traffic grid (the exact counts) and runs
:func:`benchmarks.analytic.cost_model.predict_all` for every hardware, node count and model of the spec. A
topology of ``n`` nodes uses the layouts with ``P = 8 n``. Figures are medians over seeds; ratios are
ratios of those medians.

Names in the rows: ``hsap`` is ``ulysses_size="auto"`` (``U = 1`` on one node, ``U = 8`` across nodes; placement
and rounds ``auto``; the default when the model's heads are unknown); ``hsap_batched`` the same in one batched round;
``hsap_U1`` flat SAP over every GPU; ``hsap_bestU`` the best of ``U`` ∈ {1, 2, 4, 8} with placement
``auto`` (a choice of ``U`` per layout, as the default ``"per_batch"`` makes with the heads known); ``usp_best`` / ``te_a2a_p2p_best`` the best ``U`` of
those families.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cost_model import HARDWARE, MODELS, load_assumptions, predict_all
from .traffic import LayoutResult

TOPOLOGIES: tuple[tuple[str, int], ...] = (("A100", 1), ("A100", 4), ("A100", 8), ("H100", 1), ("H100", 4), ("H100", 8))
MODEL_KEYS: tuple[str, ...] = ("llama2-7b", "llama3-8b")
FAMILIES = ("usp_", "te_a2a_p2p_", "hsap")  # families folded into one "best" column
HSAP_U_VARIANTS = ("hsap_U1", "hsap_U2", "hsap_U4", "hsap_U8")


@dataclass(frozen=True)
class CostConfig:
    """Which predictions to make (defaults: the spec's)."""

    topologies: tuple[tuple[str, int], ...] = TOPOLOGIES
    models: tuple[str, ...] = MODEL_KEYS
    calibration: str | None = None  # path of the calibration JSON; None: cost_model's default file


def _ideal_tgs(res: LayoutResult, model: str, hw: str, nodes: int, a) -> float:
    """TGS if every GPU did exactly its share of the FLOPs at the *assumed* kernel efficiencies and no
    communication were exposed: the best any schedule can reach under the model's own assumptions."""
    m, h = MODELS[model], HARDWARE[hw]
    P = nodes * h.gpus_per_node
    useful = next(iter(res.schemes[model].values())).useful_pairs
    gemm = 6.0 * m.layer_linear_params * res.T / (h.peak_flops * a.gemm_efficiency)
    attn = 4.0 * m.head_dim * m.q_heads * (1 + a.attn_bwd_factor) * useful / (h.peak_flops * a.attn_efficiency)
    return res.T / (P * m.layers * (gemm + attn) / P)


def _per_seed(res: LayoutResult, model: str, hw: str, nodes: int, calibration: str | None) -> dict[str, dict]:
    """``{scheme: prediction}`` on one layout, plus ``hsap_bestU``, ``usp_best``, ``te_a2a_p2p_best``."""
    kw = {} if calibration is None else {"path": calibration}
    a = load_assumptions(HARDWARE[hw].name, **kw)
    schemes = {**res.schemes[model], **res.hsap_by_hw.get((model, hw), {})}  # hf_hsap planned for this GPU
    preds = {p["scheme"]: p for p in predict_all(schemes, model, hw, nodes, a)}
    preds["ideal"] = {"scheme": "ideal", "tgs": _ideal_tgs(res, model, hw, nodes, a), "correct": True}
    for fam, prefix, members in (("hsap_bestU", "", HSAP_U_VARIANTS), ("usp_best", "usp_", None),
                                 ("te_a2a_p2p_best", "te_a2a_p2p_", None)):
        cands = [n for n in preds if (members is not None and n in members) or
                 (members is None and n.startswith(prefix))]
        if cands:
            best = max(cands, key=lambda n: preds[n]["tgs"])
            preds[fam] = dict(preds[best], scheme=fam, pick=best)
    return preds


def run_predictions(results: list[LayoutResult], cfg: CostConfig) -> list[dict]:
    """Median predictions per (hardware, nodes, model, T, distribution).

    Args:
        results: the traffic grid (must contain ``P = 8 · nodes`` for every topology used).
        cfg: topologies, models and calibration file.

    Returns:
        Rows ``{hw, nodes, P, model, T, dist, tgs: {scheme: median TGS}, picks: {family: U choices},
        bound_tgs, layer: {scheme: seconds of the slowest GPU by part}, hsap_vs_ulysses,
        hsap_vs_best_other, best_other, bestU_vs_best_other, bound_over_hsap, bound_over_bestU,
        ideal_tgs, ideal_over_hsap, ideal_over_bestU}``; ``ideal`` is the TGS of a perfectly balanced
        schedule with all communication hidden at the model's kernel efficiencies.
        Infeasible schemes count 0 TGS; incorrect ones (``torch_cp`` on several documents) never count
        as "best other".
    """
    groups: dict[tuple, list[LayoutResult]] = {}
    for r in results:
        groups.setdefault((r.T, r.P, r.dist), []).append(r)
    rows = []
    for hw, nodes in cfg.topologies:
        P = nodes * HARDWARE[hw].gpus_per_node
        for model in cfg.models:
            for (T, P_r, dist), rs in groups.items():
                if P_r != P:
                    continue
                seeds = [_per_seed(r, model, hw, nodes, cfg.calibration) for r in rs]
                names = list(seeds[0])
                tgs = {n: float(np.median([s[n]["tgs"] for s in seeds])) for n in names}
                correct = {n: all(s[n]["correct"] for s in seeds) for n in names}
                picks = {f: ", ".join(sorted({s[f]["pick"] for s in seeds if f in s}))
                         for f in ("hsap_bestU", "usp_best", "te_a2a_p2p_best") if f in seeds[0]}
                layer = {n: seeds[0][n].get("layer", {}) for n in names}
                others = {n: v for n, v in tgs.items()
                          if not n.startswith("hsap") and n not in ("bound", "ideal") and correct[n]}
                best_other = max(others, key=others.get)
                h, hb, b = tgs["hsap"], tgs["hsap_bestU"], tgs["bound"]
                rows.append({
                    "hw": hw, "nodes": nodes, "P": P, "model": MODELS[model].name, "model_key": model, "T": T,
                    "dist": dist, "tgs": tgs, "picks": picks, "bound_tgs": b, "layer": layer,
                    "correct": correct,
                    "hsap_vs_ulysses": h / tgs["ulysses"] if tgs.get("ulysses", 0) > 0 else float("inf"),
                    "bestU_vs_ulysses": hb / tgs["ulysses"] if tgs.get("ulysses", 0) > 0 else float("inf"),
                    "best_other": best_other,
                    "hsap_vs_best_other": h / others[best_other],
                    "bestU_vs_best_other": hb / others[best_other],
                    "bound_over_hsap": b / h, "bound_over_bestU": b / hb,
                    "ideal_tgs": tgs["ideal"], "ideal_over_hsap": tgs["ideal"] / h, "ideal_over_bestU": tgs["ideal"] / hb,
                })
    return rows


def cost_goals(rows: list[dict], scheme: str = "hsap") -> dict:
    """The throughput goals for one hf_hsap row, judged on the medians.

    Goals: on 8×A100 (1 node) ≥ 1.3× Ulysses at ``T = 524288`` and ≥ 1.2× at ``T = 131072``; ≥ 1.1× the
    best other scheme in every configuration; within 1.15× of the physical bound in every configuration.

    Args:
        rows: from :func:`run_predictions`; scheme: the hf_hsap column judged (``hsap``: the default U = 1;
            ``hsap_U8``: what ``ulysses_size="auto"`` picks on 8-GPU nodes; ``hsap_bestU``: the best U).

    Returns:
        ``{"ulysses": [...], "best_other": [...], "bound": [...]}``: per goal, the rows that miss it
        (``(config label, value, reference)``), and ``"counts"``: ``{goal: (met, total)}``.
    """
    miss: dict[str, list] = {"ulysses": [], "best_other": [], "bound": []}
    counts = {k: [0, 0] for k in miss}
    for r in rows:
        t = r["tgs"]
        h = t[scheme]
        label = f"{r['hw']} {r['nodes']}×8 {r['model']} T={r['T'] // 1024}K {r['dist']}"
        if r["hw"] == "A100" and r["nodes"] == 1 and t.get("ulysses", 0) > 0:
            need = 1.3 if r["T"] >= 524288 else 1.2
            counts["ulysses"][1] += 1
            if h >= need * t["ulysses"]:
                counts["ulysses"][0] += 1
            else:
                miss["ulysses"].append((label, h / t["ulysses"], need))
        counts["best_other"][1] += 1
        if h >= 1.1 * t[r["best_other"]]:
            counts["best_other"][0] += 1
        else:
            miss["best_other"].append((label, h / t[r["best_other"]], r["best_other"]))
        counts["bound"][1] += 1
        if r["bound_tgs"] <= 1.15 * h:
            counts["bound"][0] += 1
        else:
            miss["bound"].append((label, r["bound_tgs"] / h, None))
    return {**miss, "counts": {k: tuple(v) for k, v in counts.items()}}
