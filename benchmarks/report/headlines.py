"""The headline tables of ``BENCHMARKS.md`` (:mod:`benchmarks.report.page`), each after the command that made it:
against the peers, memory and the longest row, planning time, the placement sweep and model coverage. Every figure is
read from the results JSON (:func:`benchmarks.report.sources.load_results`); the detail files hold the full tables.
"""
from __future__ import annotations

import importlib.util
from functools import cache
from types import ModuleType
from typing import Any

import numpy as np

from ..analytic.sweep import GOALS, ORACLE_GOAL, OTHERS, loses_to
from . import format as rp
from .memory import LONGEST_HEADER, best_row_table, longest_rows_caption
from .placement_goals import PEERS
from .recurrent_split import split_headline
from .sft_memory import sft_headline_line
from .sources import HYBRID_CMD, MEMORY_CMD, PEERS_CMD, ROOT, RUN_CMD, SOAK_CMD, VLM_CMD

__all__ = ["coverage_headline", "memory_headline", "peers_headline", "planning_headline", "run_cmd",
           "sweep_headline"]

PEER_NAMES = {"deepspeed_ulysses": "DeepSpeed Ulysses", "alst": "ALST"}


def run_cmd(res: dict[str, Any]) -> str:
    """The main run's command as the page names it.

    Args:
        res: the results dict (``meta``).

    Returns:
        Markdown: the script and the module command.
    """
    return f"`{RUN_CMD}` (`{res['meta']['command']}`)"


def peers_headline(res: dict[str, Any]) -> list[str]:
    """hf_hsap against DeepSpeed's schemes (peers.json), then against the other schedules of the CPU run.

    Args:
        res: the results dict (``peers``, ``measured``, ``measure_config``).

    Returns:
        The section's lines (none without either result).
    """
    out = ["## Against the peers, measured side by side"]
    peers = res.get("peers")
    if peers:
        cfg = peers["config"]
        body, ratios = [], []
        for c in peers["configs"]:
            r = c["results"]
            h = r["hsap"]
            us = sorted({i.get("ulysses") for i in h.get("info", []) if isinstance(i, dict) and i.get("ulysses")})
            cells = [c["label"], c["hkv"], f"{h['ms']:.0f} (U {', '.join(map(str, us)) or '–'})"]
            for n in PEERS:
                v = r.get(n, {})
                cells.append(f"{v['ratio']:.2f} / {rp.cpu_cell(v)}" if "ratio" in v else "–")
                ratios += [v["ratio"]] if "ratio" in v else []
            cells.append(" / ".join(f"{r[n]['tensor_mib']:.1f}" if "tensor_mib" in r.get(n, {}) else "–"
                                    for n in ("hsap", *PEERS)))
            body.append(cells)
        out += ["", f"Command: `{PEERS_CMD}` (`{peers['command']}`): world {cfg['world']} on gloo (CPU), T = "
                f"{cfg['T']}, {cfg['hq']} query heads, one attention layer forward + backward, every scheme on "
                "hf_hsap's CPU kernel and checked against float64 first; time = median over "
                f"{cfg['reps']} interleaved rounds of scheme / hf_hsap in the same round, CPU = process time summed "
                "over ranks, the same median, with the interval of that median in brackets (≥ 95 % confidence; "
                "holding 1: a tie within the noise) (> 1: hf_hsap faster); tensors = the largest rank's exact tensor "
                "peak.",
                "", rp.table(["row", "kv heads", "hf_hsap ms (U)",
                              *(f"{PEER_NAMES[n]} time / CPU vs hf_hsap" for n in PEERS),
                              "tensors MiB hf_hsap / " + " / ".join(PEER_NAMES[n] for n in PEERS)], body)]
        if ratios:
            out += ["", f"DeepSpeed's schemes / hf_hsap: {rp.span(ratios)} (time); hf_hsap faster in "
                        f"{sum(x > 1 for x in ratios)}/{len(ratios)}."]
    m = res.get("measured")
    if m:
        names = [n for n in m["configs"][0]["results"] if n != "hsap"]
        body = [[c["dist"], c["hkv"], f"{c['results']['hsap']['ms']:.0f}",
                 *(f"{c['results'][n]['ratio']:.2f} ({c['results'][n]['cpu_ratio']:.2f})" for n in names)]
                for c in m["configs"]]
        cfg = res.get("measure_config", {})
        out += ["", f"Command: {run_cmd(res)}, its CPU part: world {cfg.get('world', 4)} on gloo, T = "
                f"{m['configs'][0]['T']}, one attention layer forward + backward, the other schedules implemented "
                f"in `benchmarks/suites/cpu_baselines.py` on the same kernel; time / hf_hsap (CPU time / hf_hsap), median "
                f"of {cfg.get('reps', 5)} interleaved rounds.", "",
                rp.table(["dist", "kv heads", "hf_hsap ms", *names], body)]
    return out if len(out) > 1 else []


def memory_headline(res: dict[str, Any]) -> list[str]:
    """The levers side by side (memory_levers.json), the SFT recipe's resident memory (sft_memory.json) and the
    longest rows the memory model predicts.

    Args:
        res: the results dict (``memory_levers``, ``sft_memory``, ``memory_model``).

    Returns:
        The section's lines (none without either result).
    """
    out = ["## Memory and the longest row"]
    lev = res.get("memory_levers")
    if lev:
        rows, cfg = lev["levers"]["rows"], lev["levers"]["config"]
        lengths = list(dict.fromkeys(r["tokens_per_rank"] for r in rows))
        by = {(r["tokens_per_rank"], r["scheme"]): r for r in rows}
        body = [[s, *(f"{by[(t, s)]['peak_mib']:,.0f}" for t in lengths),
                 f"{by[(lengths[-1], s)]['cpu_s'] / by[(lengths[-1], 'full')]['cpu_s']:.2f}",
                 f"{max(by[(t, s)]['grad_err'] for t in lengths):.1e}"]
                for s in dict.fromkeys(r["scheme"] for r in rows)]
        out += ["", f"Command: `{MEMORY_CMD}` (`python -m benchmarks memory_levers`): SP {cfg['world']} on gloo, a "
                f"Llama shape (vocabulary {cfg['model']['vocab']:,}, {cfg['model']['layers']} layers), long-tail "
                "rows; the exact tensor peak of one forward + backward on the busier rank, and its CPU time against "
                "`full` (no lever); `all` = every hf_hsap lever that acts on CPU, `alst` = DeepSpeed's.", "",
                rp.table(["scheme", *(f"MiB at {t:,} tokens / rank" for t in lengths),
                          f"time × full at {lengths[-1]:,}", "worst grad err"], body)]
        growth = lev.get("recipe") or {}
        if growth:
            out += ["", "The pretraining recipe's peak resident set grows by " + "; ".join(
                f"{g['kb_per_token']:.1f} KB per token per rank with {name}" for name, g in growth.items()) + "."]
    sft = res.get("sft_memory")
    if sft:
        out += ["", sft_headline_line(sft)]
    mod = res.get("memory_model")
    if mod:
        err = mod.get("max_abs_error")
        out += ["", f"Command: `{mod['command']}` (in `{MEMORY_CMD}`). " + longest_rows_caption(mod)
                + (f" The model is within {err:.1%} of the exact tensor peak on {len(mod['validation'])} CPU "
                   "configurations." if err is not None else ""), "",
                rp.table(LONGEST_HEADER, best_row_table(mod, detail=False))]
    host = res.get("host_memory")
    if host:
        out += ["", f"Host memory (`python -m benchmarks host_memory`): the model's host memory is within "
                f"{host['max_abs_error']:.1%} of the measured peak resident set of {len(host['validation'])} CPU "
                "training runs (each process's footprint measured, every tensor in host memory; glibc told to give "
                "freed buffers back, " + " ".join(f"{k}={v}" for k, v in host["mmap_env"].items()) + "; with its "
                f"defaults, which keep freed heap pages resident, the model is up to "
                f"{host['default_max_abs_error']:.1%} short)."]
    return out if len(out) > 1 else []


def planning_headline(res: dict[str, Any]) -> list[str]:
    """The planning-time table.

    Args:
        res: the results dict (``planning``).

    Returns:
        The section's lines.
    """
    if not res.get("planning"):
        return []
    return ["## Planning time", "", f"Command: {run_cmd(res)}: `plan_sequence` on the host, T = 524,288 with "
            "2,000 documents; cold = median CPU time of the planning thread over 15 plans (and its minimum), cached "
            "= a warm `PlanCache` hit.", "", rp.planning_table(res["planning"])]


def _q(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs``."""
    return float(np.quantile(np.asarray(xs, dtype=np.float64), q))


def sweep_headline(res: dict[str, Any]) -> list[str]:
    """The placement sweep per link: est/LB, the share within the goal, losses to simpler placements, the oracle.

    Args:
        res: the results dict (``sweep``: :func:`benchmarks.suites.sweep.run_sweep`'s).

    Returns:
        The section's lines.
    """
    sw = res.get("sweep")
    if not sw:
        return []
    rows, cfg = sw["rows"], sw["config"]
    body = []
    for link, goal in GOALS.items():
        rs = [r for r in rows if r["link"] == link]
        if not rs:
            continue
        ratio = [r["est"]["auto"] / r["lb"] for r in rs]
        orc = [r["est"]["auto"] / r["oracle"] for r in rs if "oracle" in r]
        body.append([link, len(rs), f"{_q(ratio, .5):.3f}", f"{_q(ratio, .95):.3f}", f"{max(ratio):.3f}",
                     f"{np.mean(np.asarray(ratio) <= goal):.1%} (≤ {goal:.2f})",
                     " / ".join(str(sum(loses_to(r, o) for r in rs)) for o in OTHERS),
                     f"{max(orc):.3f}" if orc else "–",
                     f"{np.mean(np.asarray(orc) <= ORACLE_GOAL):.1%}" if orc else "–"])
    return ["## Placement sweep (no clock)", "", f"Command: {run_cmd(res)}; `python -m benchmarks sweep` prints it alone: "
            f"{len(rows)} layouts x groups, {len(cfg['distributions'])} length distributions, P {min(cfg['Ps'])}–"
            f"{max(cfg['Ps'])}, U {min(cfg['Us'])}–{max(cfg['Us'])}; est = the planner's cost model of the slowest "
            "part, LB = every part equally loaded without communication, oracle = a local search.", "",
            rp.table(["link", "layouts", "est/LB median", "p95", "worst", "share ≤ goal",
                      "losses to " + " / ".join(OTHERS), "est/oracle worst", f"share ≤ {ORACLE_GOAL:.2f}"], body)]


@cache
def _script(name: str) -> ModuleType:
    """A zoo script as a module (its ``family_status`` is the rule MODELS.md counts by).

    Args:
        name: ``model_zoo`` or ``vlm_zoo`` (``scripts/<name>.py``).

    Returns:
        The module.
    """
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _zoo_row(label: str, data: dict[str, Any], script: str) -> list[Any]:
    """A zoo's counts.

    Args:
        label: the zoo's name. data: its results JSON (``header``, ``families``). script: its script's name.

    Returns:
        The row: label with command, families, run, exact, refused, crash, WRONG, not run.
    """
    status = [_script(script).family_status(r) for r in data["families"] if r["status"] == "run"]
    return [f"{label} (`{data['header']['command']}`)", len(data["families"]), len(status),
            *(status.count(s) for s in ("exact", "refused", "crash", "WRONG")), len(data["families"]) - len(status)]


def coverage_headline(res: dict[str, Any], models_link: str) -> list[str]:
    """Model-zoo counts, the VLM and hybrid training steps side by side, and the soak.

    Args:
        res: the results dict (``model_zoo``, ``vlm_zoo``, ``vlm_step``, ``hybrid_step``, ``recurrent_split``,
            ``soak``).
        models_link: MODELS.md relative to the page.

    Returns:
        The section's lines.
    """
    out = ["## Model coverage"]
    zoos = [_zoo_row(label, res[key], key) for key, label in (("model_zoo", "causal LM"),
                                                              ("vlm_zoo", "vision-language")) if res.get(key)]
    if zoos:
        out += ["", "Command: `python scripts/model_zoo.py` and `python scripts/vlm_zoo.py`: every family of the "
                "installed Transformers as a tiny random model on a packed row at SP 1, 2 and 4 (Ulysses 1 and 2), "
                "against each document alone: exact in every mode, refused on purpose (with a message naming the "
                f"fix), crash or WRONG. Per family: [MODELS.md]({models_link}).", "",
                rp.table(["zoo", "families", "run", "exact", "refused", "crash", "WRONG", "not run"], zoos)]
    vlm = res.get("vlm_step")
    if vlm:
        body = [[r["sp"], f"{r['hf_hsap']['peak_mib']:,.0f} / {r['baseline']['peak_mib']:,.0f}",
                 rp.ratio(r["hf_hsap"]["peak_mib"], r["baseline"]["peak_mib"]),
                 rp.ratio(r["hf_hsap"]["cpu_s"], r["baseline"]["cpu_s"])] for r in vlm["rows"]]
        out += ["", f"Command: `{VLM_CMD}`: one training step of a small Qwen2.5-VL on a packed "
                f"image + text row of {vlm['row']['tokens']:,} tokens ({vlm['row']['images']} images), hf_hsap "
                "against every rank encoding every image; busiest rank.", "",
                rp.table(["SP", "peak MiB hf_hsap / baseline", "peak ratio", "step time ratio"], body)]
    hyb = res.get("hybrid_step")
    if hyb:
        body = [[r["sp"], f"{r['hybrid']['peak_mib']:,.0f} / {r['attention']['peak_mib']:,.0f}",
                 rp.ratio(r["hybrid"]["cpu_s"], r["attention"]["cpu_s"]),
                 f"{r['hybrid']['summaries']} → {r['hybrid_priced']['summaries']}",
                 "yes" if all(r[n]["states"]["equal"] for n in ("hybrid", "hybrid_priced")) else "**no**"]
                for r in hyb["rows"]]
        out += ["", f"Command: `{HYBRID_CMD}`: one training step of a Qwen3.5-like hybrid "
                "(linear attention beside full attention) and a pure-attention Qwen3 of the same size on a packed "
                f"row of {hyb['row']['tokens']:,} tokens; every rank runs its runs at once, and a split document's "
                "runs send their summaries (final state and transition) in one exchange per recurrent layer; "
                "summaries per layer on the group's default plan → on a plan priced for the recurrent layers.", "",
                rp.table(["SP", "peak MiB hybrid / attention", "step time hybrid / attention",
                          "summaries / layer default → priced", "summary bytes = formula"], body)]
    if res.get("recurrent_split"):
        out += split_headline(res["recurrent_split"])
    soak = res.get("soak")
    if soak:
        out += ["", f"Command: `{SOAK_CMD}`: {soak['steps']:,} training steps on {soak['world']} "
                f"ranks, a new layout every step: resident memory +{soak['rss_growth_mib']:.1f} MiB after the "
                f"warm-up, plan cache at most {soak['cache_max']} entries, throughput drift "
                f"{soak['drift'] * 100:+.1f}%."]
    return out if len(out) > 1 else []
