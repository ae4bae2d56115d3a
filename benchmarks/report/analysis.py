"""The analysis detail file ``benchmarks/results/analysis.md`` ("Where hf_hsap loses, and why"): text around the
computed figures of the results dict of :mod:`benchmarks.suites.core`."""
from __future__ import annotations

import numpy as np

from . import format as rp


def _losses(res: dict) -> str:
    rows = [r for r in res["cost_rows"] if r["hsap_vs_best_other"] < 1.0]
    rows.sort(key=lambda r: r["hsap_vs_best_other"])
    body = []
    for r in rows[:12]:
        lh, lo = r["layer"]["hsap"], r["layer"][r["best_other"]]
        fmt = lambda l: " / ".join(f"{l.get(k, 0) * 1e3:.1f}" for k in ("gemm", "attn_fwd", "attn_bwd", "exposed_comm"))  # noqa: E731
        body.append([f"{r['hw']} {r['nodes']}×8 {r['model']} {r['T'] // 1024}K {r['dist']}", rp._f(r["hsap_vs_best_other"]),
                     r["best_other"], fmt(lh), fmt(lo), rp._f(r["tgs"]["hsap_batched"] / r["tgs"][r["best_other"]]),
                     rp._f(r["tgs"]["hsap_U1"] / r["tgs"][r["best_other"]]),
                     f"{r['bestU_vs_best_other']:.2f} ({rp._short_pick(r['picks']['hsap_bestU'])})"])
    head = (f"Predicted TGS of the default is below the best other scheme in {len(rows)} of "
            f"{len(res['cost_rows'])} configurations; the worst {len(body)} (per-layer ms of the slowest GPU: "
            "GEMM / attention fwd (incl. hidden + exposed P2P) / attention bwd / exposed collectives):\n\n")
    return head + rp.table(["configuration", "hsap / best", "best other", "hsap ms", "best other ms",
                            "one batched round / best", "flat U=1 / best", "best-U hsap / best (U)"], body) if body else head


def _inter_node(res: dict) -> str:
    rows = [r for r in res["traffic_rows"] if r["P"] >= 32 and r["scheme"] in ("hsap_U1", "hsap")]
    body = []
    for dist in dict.fromkeys(r["dist"] for r in rows):
        for T in sorted({r["T"] for r in rows}):
            for P in sorted({r["P"] for r in rows}):
                h = next((r for r in rows if (r["dist"], r["T"], r["P"], r["scheme"]) == (dist, T, P, "hsap_U1")), None)
                u = next((r for r in rows if (r["dist"], r["T"], r["P"], r["scheme"]) == (dist, T, P, "hsap")), None)
                if h and u:
                    body.append([dist, f"{T // 1024}K", P, f"{h['mb_inter_llama3-8b']:.0f}", f"{u['mb_inter_llama3-8b']:.0f}",
                                 f"{u['mb_intra_llama3-8b']:.0f}"])
    return rp.table(["dist", "T", "P", "flat U=1 inter MB", "default (U=8) inter MB", "default (U=8) intra MB"], body)


def _one_node(res: dict) -> str:
    a = [r for r in res["cost_rows"] if r["hw"] == "A100" and r["nodes"] == 1]
    if not a:
        return ""
    iu = [r["ideal_tgs"] / r["tgs"]["ulysses"] for r in a]
    ih = [r["ideal_over_hsap"] for r in a]
    g = [r["layer"]["hsap"]["gemm"] / r["layer"]["ulysses"]["gemm"] for r in a]
    vo = [r["hsap_vs_best_other"] for r in a]
    tok = [t["tok_max_mean"] for t in res["traffic_rows"] if t["scheme"] == "hsap" and t["P"] == 8]
    return ("**One node (8×A100).** Every balanced schedule is close to the model's ideal: ideal / Ulysses "
            f"{rp.span(iu)}, ideal / hf_hsap {rp.span(ih)}. So ≥ 1.2–1.3× Ulysses cannot be reached in this model "
            "(NVLink makes Ulysses' all-to-all cheap and it splits work exactly by heads); hf_hsap / best other is "
            f"{rp.span(vo)} there. On one node `ulysses_size=\"auto\"` gives flat SAP (U = 1) and `auto` "
            "prices KV at NVLink speed, so it keeps tokens balanced (tokens max/mean "
            f"{rp.span(tok, 3)} at P = 8; hsap / Ulysses GEMM ms of the slowest GPU {rp.span(g, 3)}); its refinement "
            "evens out each GPU's priced load (GEMM tokens + attention pairs), so at 512K, where attention "
            "dominates, a GPU may hold a few more tokens and fewer pairs.")


def _cpu_analysis(res: dict) -> str:
    lt = [c for c in res["measured"]["configs"] if c["dist"] == "longtail"]
    if not lt:
        return ""
    parts = []
    for c in lt:
        r = c["results"]
        parts.append(f"hkv={c['hkv']}: " + ", ".join(
            f"{n} {v['ratio']:.2f} (CPU {v['cpu_ratio']:.2f}, busiest rank's CPU {v['cpu_max_ms'] / r['hsap']['cpu_max_ms']:.2f})"
            for n, v in r.items() if n != "hsap"))
    kp = res.get("kernel_paths") or []
    ks = res.get("kernel_shapes") or []
    kp_txt = "; ".join(f"{k['dist']} hkv={k['hkv']}: {k['plan_tflops'] / k['single_tflops']:.2f}" for k in kp)
    work = np.array([i["attn_work"] for i in lt[0]["results"]["hsap"]["info"]], dtype=np.float64)
    k8 = [k for k in ks if k.get("heads") == 8 and k["kind"] == "causal" and "whole_fwd_ms" in k]
    shapes = (f" (8 heads, causal squares, fwd + bwd, one call / default: {k8[0]['nq']}: "
              f"{k8[0]['whole_mpairs_per_s']:.0f} / {k8[0]['default_mpairs_per_s']:.0f}, {k8[-1]['nq']}: "
              f"{k8[-1]['whole_mpairs_per_s']:.0f} / {k8[-1]['default_mpairs_per_s']:.0f} M pairs·head/s, "
              "the kernel table of [cpu.md](cpu.md))" if len(k8) >= 2 else "")
    world = (res.get("measure_config") or {}).get("world", 4)
    return (f"**CPU.** Every schedule computes the same pairs with {world} processes on {res['meta']['cores']} "
            "cores, so wall time follows the total and the busiest rank's CPU work; messages are memory copies. On longtail, schedule / hsap "
            "wall time: "
            + "; ".join(parts) + ". Ring and all-gather lose by moving and merging every block. Ulysses splits "
            f"work exactly by heads; hf_hsap's busiest rank holds {work.max() / work.mean():.3f} × the mean "
            "pairs: these runs plan with the cost model of the step they time (`ATTENTION_ONLY` in "
            "`benchmarks/suites/cpu_workers.py`: one attention layer, so a token costs nothing beyond its pairs; a full "
            "model's projections and MLP price it at about 18,000 pairs), and the `balanced` placement slides "
            "boundaries of split documents between ranks until the priced load is even "
            "(`hf_hsap/plan/refine.py`). In one process "
            "hf_hsap's compute path "
            "(local causal item, remote items on the receive buffer, LSE merges, gradient returns) reaches this "
            f"fraction of one causal varlen call over the same pairs: {kp_txt}. The CPU kernel runs every work "
            "item in place (segments on the un-gathered rows: no gathers, scatters or per-item gradient buffers). "
            "What remains is the shape of the calls: split documents give "
            "shorter causal squares, and PyTorch's CPU flash op computes about 256 masked keys per query row of a "
            "causal square. The kernel halves squares in the backward (down to 128 rows at ≥ 4 query heads, 256 "
            "below: Ulysses' calls gain too)" + shapes + "; it keeps the forward whole, where the merges cost "
            "more than the skipped keys.")


def analysis(res: dict) -> str:
    """The "Where hf_hsap loses, and why" section (the detail file ``benchmarks/results/analysis.md``).

    Args:
        res: the results dict of :mod:`benchmarks.suites.core` (``traffic_rows``, ``traffic_goals``, ``cost_rows``, and
            optionally ``measured``, ``kernel_paths``, ``kernel_shapes``).

    Returns:
        Markdown.
    """
    tg = res["traffic_goals"]
    mixed = [g for g in tg if g["dist"] == "mixed"]
    ideal = [r["ideal_over_hsap"] for r in res["cost_rows"]]
    ideal_b = [r["ideal_over_bestU"] for r in res["cost_rows"]]
    parts = [
        "## Where hf_hsap loses, and why",
        "",
        "1. **Received KV on `mixed` on one node.** With flat SAP (`ulysses_size=\"auto\"` inside one node) the rank holding "
        "the last token of the T/2 document needs every earlier token of it that it does not hold, and it holds at "
        "most the token cap (1.10 · T/P): the *recv floor* column is that bound. "
        + ("; ".join(f"P={g['P']}: floor {g['recv_floor']:.3f}, hf_hsap {g['recv']:.3f}"
                     + (f" ({g['recv'] / max(g['recv_floor'], 1e-9):.2f}× the floor)" if g["recv"] >= g["recv_floor"]
                        else " (the hierarchy: U = 8 moves heads inside nodes, below the flat floor)")
                     for g in mixed) if mixed else "")
        + ". The goal is below the floor of any flat KV-moving placement. Ulysses inside the node goes lower "
        "(`hsap_U2` … `hsap_U8` rows: 0.30 … 0.125) at equal predicted TGS on one node, where the default stays "
        "flat. Moving queries to the keys instead (the holder of a tail sends Q, gets O and the log-sum-exp back; "
        "backward: dO and O out, dQ back) costs about 5 · Hq · D per query row against 4 · Hkv · D per key row "
        "for KV and dK/dV: with GQA (Llama-3-8B, Hq = 4 Hkv) it pays for a (query rank, key rank) pair only when "
        "the queries are fewer than a fifth of the keys, while the tail chunk of a zigzag-split document meets "
        "each holder's two chunks at about 1 : 2 (and it must go to every holder); hf_hsap does not do it.",
        "2. **Several nodes: the hierarchy is the default.** Flat SAP (U = 1) treats all ranks alike, so split "
        "documents send KV over InfiniBand (25 GB/s per GPU on A100) although NVLink is 12× faster. "
        "`ulysses_size=\"auto\"` (the default of `init_sequence_parallel` when the model's heads are unknown) therefore runs Ulysses inside each "
        "node (U = 8) and SAP between nodes when an SP group spans nodes, which keeps most traffic on NVLink. "
        "Llama-3-8B, MB received per GPU per layer (fwd + bwd):\n\n"
        + _inter_node(res),
        "",
        "3. " + _one_node(res),
        "",
        "4. **Exposed transfers when remote work dominates.** In one batched round a rank's remote items wait for "
        "*all* of its KV (max(local, transfer) + remote). With one long document split over many parts (single, "
        "mixed) the part holding the first and last chunks has little local work and receives almost the whole "
        "document over InfiniBand at once. `rounds=\"auto\"` (the default) then moves the KV `by_peer`, one ring "
        "distance per round, all rounds posted at once: a round's remote items run as soon as it lands while later "
        "rounds are still on the wire, as in a KV ring "
        "but with only the needed tokens; backward collects the dK/dV returns at the end. The planner picks it "
        "with the same dataflow simulation that the cost model uses (`hf_hsap/plan/pipeline.py`). " + _losses(res),
        "",
        f"5. **Distance to the model's ideal.** Ideal / hf_hsap TGS (perfect balance, all communication hidden, "
        f"same kernel efficiencies): {rp.span(ideal)} for the default, {rp.span(ideal_b)} for the best U. The physical-bound goal "
        "(≤ 1.15×) is out of reach for every schedule while the model assumes the kernel efficiencies of "
        "[cost_model.md](cost_model.md).",
    ]
    if res.get("measured"):
        parts += ["", "6. " + _cpu_analysis(res)]
    return "\n".join(parts)
