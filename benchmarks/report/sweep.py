"""The placement sweep's section of ``BENCHMARKS.md``: markdown from :func:`benchmarks.suites.sweep.run_sweep`'s rows
(no computation beyond the figures' statistics; the module docstring of :mod:`benchmarks.analytic.sweep` defines
them)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..analytic.sweep import (GOALS, MODEL_KV_HEADS, MODEL_Q_HEADS, NODE_GPUS, ORACLE_GOAL, OTHERS, loses_to,
                              missed_in_reach, searched)

__all__ = ["render_sweep"]


def _per_batch_lines(rows: list[dict]) -> list[str]:
    """The per-batch degree paragraph of the sweep's section."""
    if not rows:
        return []
    best = [r["by_u"][str(r["best_u"])] for r in rows]
    flat = [r["by_u"]["1"] for r in rows]
    fixed = {u: [r["by_u"][str(u)] for r in rows if str(u) in r["by_u"]] for u in (2, 4, 8)}
    chosen = [r["best_u"] for r in rows]
    return ["", f"Per-batch Ulysses degree (`ulysses_size=\"per_batch\"`) on groups of {NODE_GPUS}-GPU nodes spanning "
            f"several nodes ({len(rows)} layouts, P ∈ {sorted({r['P'] for r in rows})}; Ulysses inside nodes, SAP "
            "between them priced for the network; a rank's estimate / its share of LB): the degree chosen per layout "
            f"median {_q(best, .5):.3f}, p95 {_q(best, .95):.3f}, worst {max(best):.3f}, ≤ {GOALS['network']:.2f} on "
            f"{np.mean(np.asarray(best) <= GOALS['network']) * 100:.0f}%; flat U = 1 median {_q(flat, .5):.3f}, worst "
            f"{max(flat):.3f}; fixed " + ", ".join(f"U = {u} median {_q(v, .5):.3f}, worst {max(v):.3f}"
                                                   for u, v in fixed.items() if v)
            + f" (chosen: " + ", ".join(f"U = {u} on {chosen.count(u)}" for u in sorted(set(chosen))) + ")."]


def _q(xs: Sequence[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs, dtype=np.float64), q)) if len(xs) else float("nan")


def _share(rows: list[dict], link: str, U: int, goal: float) -> str:
    """The share of ``link``'s rows at Ulysses degree ``U`` whose est/LB is at most ``goal`` ("–" without rows)."""
    x = [r["est"]["auto"] / r["lb"] for r in rows if r["link"] == link and r["U"] == U]
    return f"{np.mean(np.asarray(x) <= goal) * 100:.1f}%" if x else "–"


def render_sweep(res: dict) -> str:
    """The sweep's section of ``BENCHMARKS.md`` (markdown)."""
    rows = res["rows"]
    cfg = res["config"]
    out = ["## Placement sweep (no clock)",
           f"`python -m benchmarks sweep` ({len(rows)} layouts x groups in {res['seconds']:.0f} s; "
           "`benchmarks/analytic/sweep.py` documents the layouts, groups and figures). Distributions: "
           + ", ".join(f"`{d}`" for d in cfg["distributions"]) + f"; {cfg['seeds']} seeds; P ∈ {cfg['Ps']}, "
           f"U ∈ {cfg['Us']}; T = {cfg['tokens_per_rank']} x P (at most {cfg['max_T']}). est = the planner's "
           "cost model, slowest part, one full-attention layer; LB = no communication, every part equally "
           "loaded; oracle = local search from auto's and every simpler placement (parts ≤ "
           f"{cfg['oracle_max_parts']}, {cfg['oracle_moves']} moves).",
           "",
           "| link | layouts | est/LB median | p95 | worst | share ≤ goal | losses to " + " / ".join(OTHERS)
           + f" | est/oracle median | worst | share ≤ {ORACLE_GOAL:.2f} | recv max/ring median | worst | "
           "tokens max/mean worst | work max/mean median | worst | plan ms median | max |",
           "|" + "---|" * 17]
    for link, goal in GOALS.items():
        rs = [r for r in rows if r["link"] == link]
        if not rs:
            continue
        ratio = [r["est"]["auto"] / r["lb"] for r in rs]
        losses = [sum(loses_to(r, o) for r in rs) for o in OTHERS]
        orc = [r["est"]["auto"] / r["oracle"] for r in rs if "oracle" in r]
        recv = [r["recv_ring"] for r in rs]
        work = [r["work"] for r in rs]
        ms = [r["plan_ms"] for r in rs]
        out.append(f"| {link} | {len(rs)} | {_q(ratio, .5):.3f} | {_q(ratio, .95):.3f} | {max(ratio):.3f} | "
                   f"{np.mean(np.asarray(ratio) <= goal) * 100:.1f}% (≤ {goal:.2f}) | "
                   + " / ".join(str(x) for x in losses)
                   + (f" | {_q(orc, .5):.3f} | {max(orc):.3f} | {np.mean(np.asarray(orc) <= ORACLE_GOAL) * 100:.1f}%"
                      if orc else " | – | – | –")
                   + f" | {_q(recv, .5):.3f} | {max(recv):.3f} | {max(r['tokens'] for r in rs):.3f} | "
                   f"{_q(work, .5):.3f} | {max(work):.3f} | {_q(ms, .5):.1f} | {max(ms):.1f} |")
    lo, hi = sorted(GOALS.values())
    out += ["", f"By Ulysses degree (share of layouts with est/LB ≤ {lo:.2f} / ≤ {hi:.2f}; network groups put U GPUs "
            "in a node, so U = 1 is one GPU per node): " + "; ".join(
                f"{link} U = {u}: {_share(rows, link, u, lo)} / {_share(rows, link, u, hi)}"
                for link in ("nvlink", "network") for u in cfg["Us"]) + "."]
    sim_cells = []
    for link, goal in GOALS.items():
        sr = [r["sim"] / r["lb"] for r in rows if r["link"] == link and "sim" in r]
        if sr:
            sim_cells.append(f"{link} median {_q(sr, .5):.3f}, p95 {_q(sr, .95):.3f}, worst {max(sr):.3f}, "
                             f"≤ {goal:.2f} on {np.mean(np.asarray(sr) <= goal) * 100:.1f}%")
    if sim_cells:
        out += ["", "With the rounds simulated (`hf_hsap.plan.simulation.simulated_time`: the runtime's forward and "
                "backward steps timed by dataflow over consecutive layers in steady state, each part starting a "
                "layer when its own previous one is done; a part also waits for the dK/dV its keys get back), "
                "auto's slowest part / LB: " + "; ".join(sim_cells) + ". The one-layer "
                "est above charges a transfer to the part that receives it, never to the part that sent the keys and "
                "waits for their dK/dV; `auto` takes a refinement only where both models agree "
                "(`hf_hsap.plan.search.Search.accepts`)."]
    out += _bound_lines(rows)
    out += _oracle_gap_lines(rows)
    out += ["", "By distribution (est/LB of auto, median / worst over P, U and seeds; the placement auto chose "
            "most often):", "", "| distribution | nvlink | network | chosen (nvlink) | chosen (network) |",
            "|---|---|---|---|---|"]
    for dist in cfg["distributions"]:
        cells = []
        chosen = []
        for link in ("nvlink", "network"):
            rs = [r for r in rows if r["dist"] == dist and r["link"] == link]
            rt = [r["est"]["auto"] / r["lb"] for r in rs]
            cells.append(f"{_q(rt, .5):.3f} / {max(rt):.3f}" if rt else "–")
            names = [r["chosen"] for r in rs]
            chosen.append(max(sorted(set(names)), key=names.count) if names else "–")
        out.append(f"| `{dist}` | {cells[0]} | {cells[1]} | {chosen[0]} | {chosen[1]} |")
    uly = [r for r in rows if "by_u" in r and str(r["P"]) in r["by_u"]]
    if uly:
        flat = [r["by_u"]["1"] / r["by_u"][str(r["P"])] for r in uly]
        best = [r["by_u"][str(r["best_u"])] / r["by_u"][str(r["P"])] for r in uly]
        chosen = [r["best_u"] for r in uly]
        out += ["", f"Against Ulysses (U = P, one part; NVLink, {len(uly)} layouts with P dividing "
                f"{MODEL_Q_HEADS} query heads; `hf_hsap.choose_ulysses_size`, the cost model, among the degrees "
                f"whose modelled activation memory is at most the highest degree's, {MODEL_KV_HEADS} key/value "
                "heads): flat hf_hsap "
                f"(U = 1) / Ulysses median {_q(flat, .5):.3f}, worst {max(flat):.3f}, ≤ 1 on "
                f"{np.mean(np.asarray(flat) <= 1 + 1e-12) * 100:.0f}%; with U chosen per layout median "
                f"{_q(best, .5):.3f}, worst {max(best):.3f} (U = 1 chosen on {chosen.count(1)}, U = P on "
                f"{sum(c == r['P'] for c, r in zip(chosen, uly))}). The all-to-all is priced at NVLink speed "
                "(`a2a_token_cost`); kv-head replication for U above the kv heads is not priced."]
    out += _per_batch_lines(res.get("per_batch", []))
    worst = sorted(rows, key=lambda r: -r["est"]["auto"] / r["lb"])[:5]
    out += ["", "Worst layouts by est/LB: " + "; ".join(
        f"`{r['dist']}` seed {r['seed']} P={r['P']} U={r['U']} {r['link']}: {r['est']['auto'] / r['lb']:.3f}"
        + (f" (oracle {r['oracle'] / r['lb']:.3f})" if "oracle" in r else "") for r in worst) + "."]
    return "\n".join(out)


def _bound_lines(rows: list[dict]) -> list[str]:
    """auto against the lower bound of every placement within the token cap (:func:`benchmarks.analytic.relaxation.
    relaxed_bound`): how far above it, on how many layouts no placement meets the goal (by it and by the transfer
    bound alone), and the share that meets the goal among the others."""
    cells = []
    for link, goal in GOALS.items():
        rs = [r for r in rows if r["link"] == link and "bound" in r]
        if not rs:
            continue
        gap = [r["est"]["auto"] / r["bound"] for r in rs]
        out_of_reach = [r for r in rs if r["bound"] > goal * r["lb"]]
        by_transfers = sum(r.get("transfer_bound", r["bound"]) > goal * r["lb"] for r in rs)
        rest = [r for r in rs if r["bound"] <= goal * r["lb"]]
        met = np.mean([r["est"]["auto"] <= goal * r["lb"] for r in rest]) * 100 if rest else float("nan")
        cells.append(f"{link}: est/bound median {_q(gap, .5):.3f}, p95 {_q(gap, .95):.3f}, worst {max(gap):.3f}; "
                     f"the bound itself is above {goal:.2f} · LB on {len(out_of_reach)} of {len(rs)} layouts "
                     f"({by_transfers} by the transfers alone: no placement meets the goal there, so at most "
                     f"{len(rest) / len(rs) * 100:.1f}% can); auto meets it on {met:.1f}% of the other {len(rest)}"
                     + _missed_clause([r for r in rest if missed_in_reach(r)], goal))
    if not cells:
        return []
    return ["", "Against a lower bound of every placement within the token cap "
            "(`benchmarks.analytic.relaxation.relaxed_bound`, at least `benchmarks.analytic.bound.transfer_bound`: a part holding "
            "a row deep in a long document receives most of the keys before it and hides at most its own pairs; a "
            "linear program over the parts that hold the longest document, by the block of their last row, adds "
            "that those parts run out of time before they run out of tokens, so the other documents' tokens fill "
            "the rest to the cap; LB counts neither): "
            + "; ".join(cells) + "."]


def _missed_clause(missed: list[dict], goal: float) -> str:
    """What the oracle finds on the layouts within reach where auto misses the goal: on how many its placement
    meets it, and on how many of those that placement is slower than auto's with the rounds simulated."""
    found = [(r, searched(r)) for r in missed if searched(r) is not None]
    if not found:
        return ""
    met = [(r, s) for r, s in found if s[0] <= goal * r["lb"]]
    slower = sum(s[1] > r["sim"] for r, s in met)
    return (f"; on the {len(found)} where auto misses it, the oracle (run on each, whatever its size) meets it on "
            f"{len(met)}, with a plan slower than auto's by the rounds simulated on {slower} of them")


def _oracle_gap_lines(rows: list[dict]) -> list[str]:
    """Where ``auto`` is more than 2 % above the oracle: how often the oracle's placement is slower than auto's
    with the rounds simulated (the one-layer optimum auto does not reach is then no faster by the fuller model)."""
    gap = [r for r in rows if "oracle_sim" in r and r["est"]["auto"] > ORACLE_GOAL * r["oracle"]]
    if not gap:
        return []
    slower = [r["oracle_sim"] / r["sim"] - 1 for r in gap if r["oracle_sim"] > r["sim"]]
    by_link = ", ".join(f"{link} {sum(r['link'] == link for r in gap)}" for link in ("nvlink", "network"))
    return ["", f"Where auto is more than 2 % above the oracle ({len(gap)} layouts: {by_link}), the oracle's placement "
            f"is slower than auto's with the rounds simulated on {len(slower)} of them"
            + (f" (by a median {_q(slower, .5) * 100:.1f} %, at most {max(slower) * 100:.1f} %)" if slower else "")
            + ": there the one-layer optimum is not a faster plan by the fuller model. `auto` keeps its local search's "
            "result (groups of at most 16 parts) only where both models agree (`hf_hsap.plan.search`)."]


