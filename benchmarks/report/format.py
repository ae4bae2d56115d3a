"""Markdown tables of the benchmark results (pure formatting: every number comes from the results dict)."""
from __future__ import annotations

import re

MAIN_SCHEMES = ("ring", "zigzag_ring", "allgather_kv", "ulysses", "te_p2p", "whole_doc", "torch_cp")
COST_COLUMNS = ("hsap", "hsap_batched", "hsap_U1", "hsap_bestU", "ulysses", "ring", "zigzag_ring", "allgather_kv", "usp_best", "te_p2p",
                "te_a2a_p2p_best", "whole_doc", "torch_cp", "bound")


def table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def span(vals: list[float], nd: int = 2) -> str:
    """``"min–max"`` of the values (``"–"`` when empty)."""
    return f"{min(vals):.{nd}f}–{max(vals):.{nd}f}" if vals else "–"


def ratio(a: float | None, b: float | None) -> str:
    """``a / b`` with two decimals (``–`` when either is missing or ``b`` is 0)."""
    return "–" if a is None or b is None or not b else f"{a / b:.2f}"


def cpu_cell(v: dict) -> str:
    """A peers row's CPU ratio with the interval of its median (``–`` untimed; the bare ratio from results
    without the interval)."""
    if "cpu_ratio" not in v:
        return "–"
    return f"{v['cpu_ratio']:.2f}" + (f" ({v['cpu_lo']:.2f}–{v['cpu_hi']:.2f})" if "cpu_hi" in v else "")


def mib(x: float) -> str:
    """MiB: whole above 10, two decimals below."""
    return f"{x:,.0f}" if x >= 10 else f"{x:.2f}"


def secs(x: float | None) -> str:
    """Seconds with two decimals (``–`` when missing)."""
    return "–" if x is None else f"{x:.2f}"


def _f(x: float, nd: int = 2) -> str:
    return f"{x:.{nd}f}"


def _k(T: int) -> str:
    return f"{T // 1024}K"


def _met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def _short_pick(pick: str) -> str:
    """``hsap_U4, hsap`` → ``U4,U1``; ``usp_U8xR4`` → ``U8``."""
    out = []
    for p in pick.split(", "):
        m = re.search(r"U(\d+)", p)
        out.append(f"U{m.group(1)}" if m else "U1")
    return ",".join(dict.fromkeys(out))


# ----------------------------------------------------------------------------- traffic
def traffic_goal_table(goals: list[dict]) -> str:
    """The balance / traffic goals, per distribution and P."""
    rows = []
    for g in goals:
        rows.append([g["dist"], g["P"], f"{_f(g['work'], 3)} ({_f(g['work_worst'], 3)})", _met(g["work_met"]),
                     f"{_f(g['tok'], 3)} ({_f(g['tok_worst'], 3)})", _met(g["tok_met"]),
                     f"{_f(g['recv'], 3)} ({_f(g['recv_worst'], 3)})", f"≤ {g['recv_goal']}", _met(g["recv_met"]),
                     _f(g["recv_floor"], 3)])
    return table(["dist", "P", "work max/mean (worst seed)", "≤ 1.05", "tokens max/mean (worst)", "≤ 1.10",
                  "recv max / ring (worst)", "goal", "recv", "recv floor"], rows)


def _scheme_note(r: dict) -> str:
    notes = []
    if "placement" in r:
        notes.append(r["placement"])
    if r["feasible_seeds"] < r["seeds"]:
        notes.append(f"infeasible on {r['seeds'] - r['feasible_seeds']}/{r['seeds']} seeds")
    if not r["correct"]:
        notes.append("wrong result (no document mask)")
    return "; ".join(notes)


def traffic_tables(rows: list[dict]) -> str:
    """One table per (distribution, T, P): every scheme's traffic and balance."""
    blocks = []
    keys = list(dict.fromkeys((r["dist"], r["T"], r["P"]) for r in rows))
    for dist, T, P in keys:
        sel = [r for r in rows if (r["dist"], r["T"], r["P"]) == (dist, T, P)]
        body = []
        for r in sel:
            name = f"**{r['scheme']}**" if r["scheme"] == "hsap" else r["scheme"]
            body.append([name, _f(r["recv_max"], 3), _f(r["recv_mean"], 3), _f(r["work_max_mean"], 3),
                         _f(r["tok_max_mean"], 3), f"{r['mb_intra_llama2-7b']:.0f}", f"{r['mb_inter_llama2-7b']:.0f}",
                         f"{r['mb_intra_llama3-8b']:.0f}", f"{r['mb_inter_llama3-8b']:.0f}", _scheme_note(r)])
        blocks.append(f"#### {dist}, T = {T} ({_k(T)}), P = {P} (recv floor {sel[0]['recv_floor']:.3f})\n\n" + table(
            ["scheme", "recv max", "recv mean", "work max/mean", "tok max/mean", "L2-7B intra MB",
             "L2-7B inter MB", "L3-8B intra MB", "L3-8B inter MB", "note"], body))
    return "\n\n".join(blocks)


# ----------------------------------------------------------------------------- cost model
def cost_tables(rows: list[dict]) -> str:
    """One table per (hardware, nodes): predicted TGS of every scheme, the bound and the ratios."""
    blocks = []
    for hw, nodes in dict.fromkeys((r["hw"], r["nodes"]) for r in rows):
        sel = [r for r in rows if (r["hw"], r["nodes"]) == (hw, nodes)]
        body = []
        for r in sel:
            t = r["tgs"]
            cells = [r["model"], _k(r["T"]), r["dist"]]
            for c in COST_COLUMNS:
                if c not in t:
                    cells.append("–")
                    continue
                v = f"{t[c]:.0f}" if t[c] > 0 else "infeasible"
                if c in r["picks"]:
                    v += f" ({_short_pick(r['picks'][c])})"
                if c != "bound" and not r["correct"].get(c, True):
                    v += "†"
                cells.append(v)
            vs_u = _f(r["hsap_vs_ulysses"]) if r["tgs"].get("ulysses", 0) > 0 else "n/a"
            cells += [vs_u, f"{_f(r['hsap_vs_best_other'])} ({r['best_other']})",
                      _f(r["bestU_vs_best_other"]), _f(r["bound_over_hsap"])]
            body.append(cells)
        blocks.append(f"#### {hw}, {nodes} node(s) × 8 GPUs (P = {nodes * 8})\n\n" + table(
            ["model", "T", "dist", *COST_COLUMNS, "hsap / Ulysses", "hsap / best other", "best-U hsap / best other",
             "bound / hsap"], body))
    return "\n\n".join(blocks)


def cost_goal_lines(goals: dict, label: str) -> list[str]:
    """Bullet lines: counts and the misses of :func:`benchmarks.analytic.predictions.cost_goals`."""
    c = goals["counts"]
    lines = [f"- {label}: ≥ 1.3× / 1.2× Ulysses on 8×A100: {c['ulysses'][0]}/{c['ulysses'][1]} configurations; "
             f"≥ 1.1× the best other scheme: {c['best_other'][0]}/{c['best_other'][1]}; within 1.15× of the bound: "
             f"{c['bound'][0]}/{c['bound'][1]}."]
    return lines


# ----------------------------------------------------------------------------- measured
def measured_tables(measured: dict) -> str:
    """One table per measured configuration."""
    blocks = []
    for c in measured["configs"]:
        body = []
        for n, v in c["results"].items():
            info = ""
            if v["info"] and v["info"][0]:
                recv = [i["recv_kv_tokens"] for i in v["info"]]
                info = f"{v['info'][0]['placement']}, recv KV tokens per rank {recv}"
            body.append([f"**{n}**" if n == "hsap" else n, f"{v['ms']:.0f}", " ".join(f"{x:.0f}" for x in v["runs_ms"]),
                         _f(v["ratio"]), _f(v["min_ratio"]), f"{v['cpu_sum_ms']:.0f}", _f(v["cpu_ratio"]), f"{v['cpu_max_ms']:.0f}",
                         f"{v['bytes_max'] / 1e6:.1f} / {v['bytes_mean'] / 1e6:.1f}", f"{v['error']:.1e}", info])
        blocks.append(f"#### {c['dist']}, T = {c['T']}, {c['hq']} q heads, {c['hkv']} kv heads, head dim {c['d']} "
                      f"({c['n_docs']} documents, {c['pairs']:.3g} pairs)\n\n" + table(
                          ["schedule", "ms (median)", "runs ms", "time / hsap", "best run / hsap's best",
                           "CPU ms (all ranks)",
                           "CPU / hsap", "CPU ms (max rank)", "MB recv max / mean per rank", "max rel err vs hsap",
                           "plan"], body))
    return "\n\n".join(blocks)


def memory_table(rows: list[dict]) -> str:
    """Peak memory per rank against the model (own-token tensors + receive buffers)."""
    body = []
    for r in rows:
        for m in r["ranks"]:
            model = m["own_bytes"] + m["recv_buffer_bytes"]
            body.append([r["dist"], r["budget"] if r["budget"] is not None else "none", m["rank"], m["n_local"],
                         m["recv_tokens"], m["rounds"], m["max_round_recv"], f"{m['peak_delta_bytes'] / 2**20:.0f}",
                         f"{m['own_bytes'] / 2**20:.0f}", f"{m['recv_buffer_bytes'] / 2**20:.1f}",
                         _f(m["peak_delta_bytes"] / model)])
    return table(["dist", "recv budget", "rank", "own tokens", "recv KV tokens", "rounds", "largest round",
                  "peak Δ MiB", "own-token model MiB", "recv-buffer model MiB", "peak / model"], body)


def planning_table(rows: list[dict]) -> str:
    """Planning time rows."""
    body = [[r["P"], r["placement"], r["chosen"], _f(r["cold_ms"], 1), _f(r["cold_cpu_ms"], 1),
             _f(r["cold_cpu_min_ms"], 1) if "cold_cpu_min_ms" in r else "–", _f(r["schedule_ms"], 2),
             _f(r["cached_ms"], 4)] for r in rows]
    return table(["P", "placement", "chosen", "cold ms (wall)", "cold ms (CPU time)", "its minimum",
                  "+ schedule of one rank ms", "cached ms"], body)
