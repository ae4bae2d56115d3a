"""The placement sweep: ``placement="auto"`` on layouts nobody tuned for, against every other placement,
the compute lower bound and the offline optimiser (no clock but planning time).

Run alone: ``python -m benchmarks.sweep [--quick]`` prints the section's markdown (the full run puts it in
``BENCHMARKS.md``, :mod:`benchmarks.run`).

* Layouts (:data:`SWEEP_DISTRIBUTIONS`, :func:`sweep_lengths`): log-normal lengths of four spreads,
  Pareto tails, a two-mode mixture, rows where one or two documents hold most of the pairs, many tiny
  documents, and the spec's ``sft``; seeds ``0..n-1``; ``T = tokens_per_rank * P`` (at most
  :attr:`SweepConfig.max_T`).
* Groups: ``P`` ∈ {2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64} ranks (not only powers of two), ``U`` ∈ {1, 2, 4,
  8} dividing ``P`` with at least two parts, priced for NVLink (every rank in one node) or for the
  network (``U`` ranks per node, SAP between nodes): ``CostModel.for_link(link)`` as the planner's default.
* Figures, one full-attention layer, by the planner's own cost model (:func:`hf_hsap.plan.cost.part_times`;
  a rank's time is its part's divided by ``U``): *est max* of the slowest part; ``LB = (token_cost' * T +
  sum_d L_d (L_d + 1) / 2) / parts`` (every part equally loaded, no communication; ``token_cost'`` is the
  plan's, with the all-to-all's share when ``U > 1``); *losses*: layouts where ``auto``'s est max exceeds
  another placement's (``contiguous``, ``zigzag``, ``balanced``, ``density``); *oracle*: the local search
  of :mod:`hf_hsap.plan.oracle` started from ``auto``'s placement and every simpler one, run where
  ``parts <= oracle_max_parts`` (and its placement's rounds simulated, ``oracle_sim``, beside auto's ``sim``);
  recv max / ring (ring attention receives every other part's ``T - T/parts`` KV tokens); *sim*: auto's slowest
  part with its rounds simulated forward and backward (:func:`hf_hsap.plan.simulation.simulated_time`); *bound*: the
  lower bound of :func:`hf_hsap.plan.relaxation.relaxed_bound` (at least :func:`hf_hsap.plan.bound.transfer_bound`,
  ``transfer_bound`` in the row), which also counts the transfers no placement within the token cap avoids and
  the tokens the other documents need (where it exceeds the goal, no placement meets it); tokens and work
  max/mean; planning time of ``auto`` (cold, no cache, wall clock); on NVLink with ``U = 1``, every
  Ulysses degree's estimate (:func:`hf_hsap.choose_ulysses_size`, Llama-3-8B's 32 query heads) against
  Ulysses itself (``U = P``); on groups of several 8-GPU nodes, the degree ``ulysses_size="per_batch"`` picks per
  layout against a rank's share of the bound (:func:`_per_batch_rows`).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hf_hsap.plan.bound import transfer_bound
from hf_hsap.plan.cost import CostModel, balance_bound, part_times
from hf_hsap.plan.simulation import simulated_time
from hf_hsap.plan.group import GroupSpec
from hf_hsap.plan.layout import make_layout
from hf_hsap.plan.oracle import optimise_placement
from hf_hsap.plan.placement import DEFAULT_TOKEN_SLACK, token_cap
from hf_hsap.plan.planner import choose_ulysses_size, plan_layout
from hf_hsap.plan.relaxation import relaxed_bound
from hf_hsap.plan.transfers import compute_transfers

from .distributions import doc_lengths

SWEEP_DISTRIBUTIONS = ("lognormal-0.5", "lognormal-1.0", "lognormal-1.6", "lognormal-2.2", "pareto-1.1",
                       "pareto-1.5", "bimodal", "one-dominant", "two-dominant", "tiny", "sft")
OTHERS = ("contiguous", "zigzag", "balanced", "density")
MODEL_Q_HEADS = 32  # Llama-3-8B: Ulysses (U = P) runs where P divides the query heads
MODEL_KV_HEADS = 8  # and its key/value heads: what the per-batch degree's memory cap weighs
NODE_GPUS = 8  # the per-batch degree rows: groups of 8-GPU nodes spanning several nodes


@dataclass(frozen=True)
class SweepConfig:
    """Sizes of the sweep (module docstring)."""

    Ps: Sequence[int] = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    Us: Sequence[int] = (1, 2, 4, 8)
    links: Sequence[str] = ("nvlink", "network")
    distributions: Sequence[str] = SWEEP_DISTRIBUTIONS
    seeds: int = 2
    tokens_per_rank: int = 2048
    max_T: int = 65536
    oracle_max_parts: int = 8
    oracle_moves: int = 150

    @staticmethod
    def quick() -> "SweepConfig":
        return SweepConfig(Ps=(3, 8, 16), Us=(1, 2), seeds=1, tokens_per_rank=2048, oracle_max_parts=8,
                           oracle_moves=100)


def _fill(draw, T: int) -> np.ndarray:
    """Lengths drawn by ``draw(n)`` (an array of ``n`` positive ints) until they reach ``T``; the last cut."""
    out, acc = [], 0
    while acc < T:
        x = np.maximum(1, np.asarray(draw(256), dtype=np.int64))
        out.append(x)
        acc += int(x.sum())
    lens = np.concatenate(out)
    c = np.cumsum(lens)
    n = int(np.searchsorted(c, T)) + 1
    lens = lens[:n].copy()
    lens[-1] = T - (int(c[n - 2]) if n > 1 else 0)
    return lens


def sweep_lengths(name: str, T: int, seed: int) -> np.ndarray:
    """Document lengths of one row of the sweep.

    Args:
        name: one of :data:`SWEEP_DISTRIBUTIONS`. T: row length. seed: ``numpy.random.default_rng`` seed.

    Returns:
        ``[n_docs]`` int64 lengths summing to ``T``, each ``>= 1``.
    """
    rng = np.random.default_rng(seed)
    if name.startswith("lognormal-"):
        sigma = float(name.split("-")[1])
        return _fill(lambda n: np.clip(rng.lognormal(np.log(1024.0), sigma, n), 16, T), T)
    if name.startswith("pareto-"):
        alpha = float(name.split("-")[1])
        return _fill(lambda n: np.clip(16 + 128 * rng.pareto(alpha, n), 16, T), T)
    if name == "bimodal":  # short chats and long documents of ~T/8
        return _fill(lambda n: np.where(rng.random(n) < 0.9, rng.lognormal(np.log(300.0), 0.5, n),
                                        rng.lognormal(np.log(T / 8), 0.3, n)).clip(16, T), T)
    if name in ("one-dominant", "two-dominant"):  # one or two documents hold most of the pairs
        k = 1 if name == "one-dominant" else 2
        big = (T * rng.uniform(0.25, 0.45, k)).astype(np.int64)
        rest = _fill(lambda n: np.clip(rng.lognormal(np.log(500.0), 1.0, n), 16, T), T - int(big.sum()))
        return rng.permutation(np.concatenate([big, rest]))
    if name == "tiny":
        return _fill(lambda n: rng.integers(16, 65, n), T)
    if name == "sft":
        return doc_lengths("sft", T, seed)
    raise ValueError(f"unknown sweep distribution {name!r}; choose one of {', '.join(SWEEP_DISTRIBUTIONS)}")


def _groups(cfg: SweepConfig):
    """Every (P, U, link) of the sweep with at least two parts."""
    for P in cfg.Ps:
        for U in cfg.Us:
            if P % U or P // U < 2:
                continue
            for link in cfg.links:
                yield P, U, link


def run_sweep(cfg: SweepConfig = SweepConfig(), progress: bool = False) -> dict:
    """Every layout x group of the sweep (module docstring).

    Returns:
        ``{"rows": [...], "config": {...}, "seconds": float}``; a row per (distribution, seed, P, U, link).
    """
    t_start = time.perf_counter()
    rows = []
    for P, U, link in _groups(cfg):
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
                       "tokens": _max_mean(auto.placement.tokens_per_part()),
                       "work": _max_mean(auto.placement.work_per_part(layout)),
                       "recv_ring": float(np.bincount(auto.transfers.dst, weights=auto.transfers.lengths,
                                                      minlength=parts).max() / (T - T / parts))}
                if U == 1 and link == "nvlink":  # the hierarchy degree chosen for this layout, up to Ulysses
                    best_u, by_u = choose_ulysses_size(layout, P, num_heads=MODEL_Q_HEADS, gpus_per_node=P,
                                                       num_kv_heads=MODEL_KV_HEADS)
                    row["by_u"] = {str(u): t for u, t in by_u.items()}
                    row["best_u"] = best_u
                if parts <= cfg.oracle_max_parts:
                    o = optimise_placement(layout, parts, cost, auto.placement, max_moves=cfg.oracle_moves)
                    o_tr = compute_transfers(o)
                    row["oracle"] = float(part_times(layout, o, o_tr, cost).max())
                    row["oracle_sim"] = simulated_time(layout, o, o_tr, cost)  # the oracle's plan, rounds simulated
                rows.append(row)
        if progress:
            print(f"  sweep P={P} U={U} {link}: {time.perf_counter() - t_start:.0f} s", flush=True)
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(cfg).items()}
    return {"rows": rows, "per_batch": _per_batch_rows(cfg), "config": config, "seconds": time.perf_counter() - t_start}


def _per_batch_rows(cfg: SweepConfig) -> list[dict]:
    """What ``ulysses_size="per_batch"`` runs on groups of several :data:`NODE_GPUS`-GPU nodes: per layout, every
    degree dividing P and a node (Ulysses inside nodes, SAP between them over the network) priced by
    :func:`hf_hsap.choose_ulysses_size`; a rank's estimate against the rank's share of the compute lower bound
    ``(token_cost * T + pairs) / P`` (no communication, no all-to-all)."""
    out = []
    for P in cfg.Ps:
        if P % NODE_GPUS or P == NODE_GPUS:
            continue
        T = min(cfg.max_T, cfg.tokens_per_rank * P)
        network = CostModel.for_link("network")
        for dist in cfg.distributions:
            for seed in range(cfg.seeds):
                L = sweep_lengths(dist, T, seed)
                layout = make_layout(np.concatenate([[0], np.cumsum(L)]))
                best_u, by_u = choose_ulysses_size(layout, P, num_heads=MODEL_Q_HEADS, gpus_per_node=NODE_GPUS,
                                                   num_kv_heads=MODEL_KV_HEADS)
                lb = balance_bound(layout, P, network)  # a rank's share: no communication, no all-to-all
                out.append({"dist": dist, "seed": seed, "P": P, "best_u": best_u,
                            "by_u": {str(u): t / lb for u, t in by_u.items()}})
    return out


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
            f"median {_q(best, .5):.3f}, p95 {_q(best, .95):.3f}, worst {max(best):.3f}, ≤ 1.10 on "
            f"{np.mean(np.asarray(best) <= 1.10) * 100:.0f}%; flat U = 1 median {_q(flat, .5):.3f}, worst "
            f"{max(flat):.3f}; fixed " + ", ".join(f"U = {u} median {_q(v, .5):.3f}, worst {max(v):.3f}"
                                                   for u, v in fixed.items() if v)
            + f" (chosen: " + ", ".join(f"U = {u} on {chosen.count(u)}" for u in sorted(set(chosen))) + ")."]


def _max_mean(x: np.ndarray) -> float:
    return float(np.max(x) / np.mean(x))


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
           f"`python -m benchmarks.sweep` ({len(rows)} layouts x groups in {res['seconds']:.0f} s; "
           "`benchmarks/sweep.py` documents the layouts, groups and figures). Distributions: "
           + ", ".join(f"`{d}`" for d in cfg["distributions"]) + f"; {cfg['seeds']} seeds; P ∈ {cfg['Ps']}, "
           f"U ∈ {cfg['Us']}; T = {cfg['tokens_per_rank']} x P (at most {cfg['max_T']}). est = the planner's "
           "cost model, slowest part, one full-attention layer; LB = no communication, every part equally "
           "loaded; oracle = local search from auto's and every simpler placement (parts ≤ "
           f"{cfg['oracle_max_parts']}, {cfg['oracle_moves']} moves).",
           "",
           "| link | layouts | est/LB median | p95 | worst | share ≤ goal | losses to " + " / ".join(OTHERS)
           + " | est/oracle median | worst | share ≤ 1.02 | recv max/ring median | worst | tokens max/mean worst "
           "| work max/mean median | worst | plan ms median | max |",
           "|" + "---|" * 17]
    for link, goal in (("nvlink", 1.05), ("network", 1.10)):
        rs = [r for r in rows if r["link"] == link]
        if not rs:
            continue
        ratio = [r["est"]["auto"] / r["lb"] for r in rs]
        losses = [sum(r["est"]["auto"] > r["est"][o] * (1 + 1e-9) for r in rs) for o in OTHERS]
        orc = [r["est"]["auto"] / r["oracle"] for r in rs if "oracle" in r]
        recv = [r["recv_ring"] for r in rs]
        work = [r["work"] for r in rs]
        ms = [r["plan_ms"] for r in rs]
        out.append(f"| {link} | {len(rs)} | {_q(ratio, .5):.3f} | {_q(ratio, .95):.3f} | {max(ratio):.3f} | "
                   f"{np.mean(np.asarray(ratio) <= goal) * 100:.1f}% (≤ {goal:.2f}) | "
                   + " / ".join(str(x) for x in losses)
                   + (f" | {_q(orc, .5):.3f} | {max(orc):.3f} | {np.mean(np.asarray(orc) <= 1.02) * 100:.1f}%"
                      if orc else " | – | – | –")
                   + f" | {_q(recv, .5):.3f} | {max(recv):.3f} | {max(r['tokens'] for r in rs):.3f} | "
                   f"{_q(work, .5):.3f} | {max(work):.3f} | {_q(ms, .5):.1f} | {max(ms):.1f} |")
    out += ["", "By Ulysses degree (share of layouts with est/LB ≤ 1.05 / ≤ 1.10; network groups put U GPUs in a "
            "node, so U = 1 is one GPU per node): " + "; ".join(
                f"{link} U = {u}: {_share(rows, link, u, 1.05)} / {_share(rows, link, u, 1.10)}"
                for link in ("nvlink", "network") for u in cfg["Us"]) + "."]
    sim_cells = []
    for link, goal in (("nvlink", 1.05), ("network", 1.10)):
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
                "waits for their dK/dV; `auto` evens out its winner's exposed transfers only where both models agree "
                "(`hf_hsap.plan.exposure`)."]
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
            chosen.append(max(set(names), key=names.count) if names else "–")
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
    """auto against the lower bound of every placement within the token cap (:func:`hf_hsap.plan.relaxation.
    relaxed_bound`): how far above it, on how many layouts no placement meets the goal (by it and by the transfer
    bound alone), and the share that meets the goal among the others."""
    cells = []
    for link, goal in (("nvlink", 1.05), ("network", 1.10)):
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
                     f"{len(rest) / len(rs) * 100:.1f}% can); auto meets it on {met:.1f}% of the other {len(rest)}")
    if not cells:
        return []
    return ["", "Against a lower bound of every placement within the token cap "
            "(`hf_hsap.plan.relaxation.relaxed_bound`, at least `hf_hsap.plan.bound.transfer_bound`: a part holding "
            "a row deep in a long document receives most of the keys before it and hides at most its own pairs; a "
            "linear program over the parts that hold the longest document, by the block of their last row, adds "
            "that those parts run out of time before they run out of tokens, so the other documents' tokens fill "
            "the rest to the cap; LB counts neither): "
            + "; ".join(cells) + "."]


def _oracle_gap_lines(rows: list[dict]) -> list[str]:
    """Where ``auto`` is more than 2 % above the oracle: how often the oracle's placement is slower than auto's
    with the rounds simulated (the one-layer optimum auto does not reach is then no faster by the fuller model)."""
    gap = [r for r in rows if "oracle_sim" in r and r["est"]["auto"] > 1.02 * r["oracle"]]
    if not gap:
        return []
    slower = [r["oracle_sim"] / r["sim"] - 1 for r in gap if r["oracle_sim"] > r["sim"]]
    by_link = ", ".join(f"{link} {sum(r['link'] == link for r in gap)}" for link in ("nvlink", "network"))
    return ["", f"Where auto is more than 2 % above the oracle ({len(gap)} layouts: {by_link}), the oracle's placement "
            f"is slower than auto's with the rounds simulated on {len(slower)} of them"
            + (f" (by a median {_q(slower, .5) * 100:.1f} %, at most {max(slower) * 100:.1f} %)" if slower else "")
            + ": there the one-layer optimum is not a faster plan by the fuller model. `auto` keeps a search's result "
            "(its winner's, or from `density` and `contiguous` on groups of at most 16 parts) only where both models "
            "agree (`hf_hsap.plan.polishing`)."]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    args = ap.parse_args(argv)
    print(render_sweep(run_sweep(SweepConfig.quick() if args.quick else SweepConfig(), progress=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
