"""Recurrent layers under SP in markdown: the split-document section of ``benchmarks/results/hybrid.md`` and its
headline in ``BENCHMARKS.md``, from :func:`benchmarks.suites.recurrent_split.run_recurrent_split`'s results."""
from __future__ import annotations

from typing import Any

from . import format as rp
from .sources import HYBRID_CMD

__all__ = ["GOAL", "split_headline", "split_section"]

GOAL = {"ratio": 1.2, "sp": 2, "models": ("gated_delta_rule", "mamba2")}  # A / B of the busiest rank's CPU time
LABELS = {"gated_delta_rule": "gated delta rule", "mamba2": "Mamba2", "kda": "KDA"}
MODE_LABELS = {"summary_exchange": "summary exchange", "heads_all_to_all": "heads all-to-all"}
FAMILIES = {"gated_delta_rule": "`Qwen3_5TextConfig`, every `layer_types` entry `linear_attention`",
            "mamba2": "`Mamba2Config` (`Mamba2ForCausalLM`)",
            "kda": "`KimiLinearConfig`, every `layer_types` entry `linear_attention` (KDA), dense MLPs: no attention "
                   "layer"}


def _kib(x: float) -> str:
    return f"{x / 1024:,.0f}" if x >= 10 * 1024 or not x else f"{x / 1024:.1f}"


def _secs(xs: list[float | None]) -> str:
    return ", ".join(rp.secs(x) for x in xs)


def _goal(res: dict[str, Any]) -> tuple[bool | None, list[str]]:
    """Whether A / B at the goal's SP size is at most the goal's ratio for the goal's models (``None``: untimed), and
    the figures it is judged on."""
    rows = res["modes"]["summary_exchange"]["rows"]
    figs, ok = [], True
    for r in rows:
        if r["sp"] != GOAL["sp"]:
            continue
        for name in GOAL["models"]:
            m = r["models"].get(name)
            if m is None or m["cpu_ratio"] is None:
                return None, []
            figs.append(f"{LABELS[name]} {m['cpu_ratio']:.2f}")
            ok &= m["cpu_ratio"] <= GOAL["ratio"]
    return (ok if figs else None), figs


def _model_lines(res: dict[str, Any]) -> list[str]:
    """The models, their sizes and their summary rows."""
    cfg = res["config"]
    body = []
    for name, m in res["models"].items():
        f = m["formula"]
        own = ", ".join(f"{k} {v}" for k, v in m["config"].items())
        body.append([LABELS[name], FAMILIES[name], own, f"{m['params'] / 1e6:.2f} M", f["channels"],
                     f"{f['conv']:,}", f"{f['recurrent']:,}", f"{f['per_summary']:,}"])
    return ["", f"Models: {cfg['sizes']['layers']} layers, hidden {cfg['sizes']['hidden']}, vocabulary "
            f"{cfg['vocab']:,}, float32, `attn_implementation=\"hsap\"`, `hf_hsap.prepare_model(model, sp_size=P)`. "
            "Summary row `[B | A]` of each layer's two recurrent mixers: the short convolution's (B: its last k - 1 "
            "inputs over C channels, A: a (k - 1) x (k - 1) shift; (C (k - 1) + (k - 1)²) x 4 B) and the "
            "recurrence's (delta rule: B H_v x D_k x D_v, A H_v x D_k x D_k; Mamba2: B H x P x N, A H; x 4 B).", "",
            rp.table(["model", "config", "fields", "parameters", "conv channels C", "conv row B", "recurrent row B",
                      "bytes per summary"], body)]


def split_section(res: dict[str, Any]) -> str:
    """The markdown of the split-document section (module docstring)."""
    cfg, t = res["config"], res["config"]["tokens"]
    ok, figs = _goal(res)
    goal = ("not judged (untimed)" if ok is None else ("**met**" if ok else "**not met**") + f" ({', '.join(figs)})")
    lines = ["## Recurrent layers under SP: one document split over the group", "",
             f"`{HYBRID_CMD}`, its second step (`python -m benchmarks recurrent_split` alone; {res['seconds']:.0f} s): "
             "one forward + backward (the model's loss) of recurrent-only models on one row of "
             f"{t:,} tokens, laid out two ways. Row A: one document of {t:,} tokens split over the SP group "
             "(`hf_hsap.shard_batch(batch, sp, config=HSAPConfig(sp_size=P, placement="
             f"\"{cfg['placement']}\"))`): rank r holds its r-th run. Row B: the same {t:,} tokens as P documents "
             f"of {t:,} / P, each held whole by one rank (checked), with the same placement, like for like. Every "
             "rank runs all its runs at once from the zero state; in row A each run that a later run continues "
             "sends its summary to every later holder of the document, in one exchange per recurrent mixer and "
             "layer, and each continued run folds the summaries before it into its initial state and corrects its "
             "output; the backward makes one exchange back. Row B exchanges nothing. SP = world size on spawned gloo "
             f"ranks, one thread each (CPU, {res['cpus']} cores, load average {res['load'][0]:.1f} at the start and "
             f"{res['load'][1]:.1f} at the end: ranks beyond the cores share them, and other jobs shared the "
             "machine). Per rank and row: CPU time and wall time of one step, median of "
             f"{cfg['reps']} rounds after a warm-up (A and B interleaved in the same ranks); wait: the wall time "
             "the rank spends inside the summary exchanges (`StateExchange.exchange`), i.e. waiting for the other "
             "ranks. A / B: of the busiest rank (the largest median over ranks). Each row's loss at SP P equals the "
             f"same model's loss at SP 1 on the same row within {res['loss_err']:.1e} (relative). Goal: A / B at "
             f"most {GOAL['ratio']} at SP {GOAL['sp']} for the gated delta rule and Mamba2: {goal}."]
    lines += _model_lines(res)
    for mode, data in res["modes"].items():
        label = MODE_LABELS.get(mode, mode)
        if data["status"] != "measured":
            lines += ["", f"### Mode: {label}", "", f"Not measured: the mode is {data['status']} yet (its slot in the "
                      "results JSON is kept empty until it is)."]
            continue
        body = []
        for r in data["rows"]:
            for name, m in r["models"].items():
                a, b = m["A"], m["B"]
                body.append([LABELS[name], r["sp"], rp.ratio(a["cpu_s"], b["cpu_s"]),
                             rp.ratio(a["wall_s"], b["wall_s"]),
                             rp.secs(a["cpu_s"]), rp.secs(b["cpu_s"]), rp.secs(a["wall_s"]), rp.secs(b["wall_s"]),
                             _secs(a["cpu_s_ranks"]), _secs(a["wait_s_ranks"]), _secs(b["wait_s_ranks"]),
                             ", ".join(str(c) for c in a["continued"]), a["summaries"],
                             _kib(a["bytes"]["total"]["forward"]), _kib(a["bytes"]["total"]["backward"]),
                             _kib(a["bytes"]["total"]["formula"]),
                             "yes" if a["equal"] and b["equal"] else "**no**",
                             f"{max(a['loss_rel_err'], b['loss_rel_err']):.1e}"])
            if mode == "heads_all_to_all":
                body[-1].insert(-2, _kib(a["a2a_bytes_per_layer"]))
        heads = mode == "heads_all_to_all"
        lines += ["", f"### Mode: {label}", "",
                  ("Every kernel whose heads divide the group runs whole documents for its share of the heads "
                   "(`HSAPConfig(recurrent_mode=\"heads\")`); a2a KiB / layer: what the all-to-alls sent, forward "
                   "and backward, summed over ranks (the group's CommStats); no summary is exchanged. " if heads
                   else "") +
                  "Summary KiB / layer: measured at the exchange (the SP group's CommStats, summed over ranks; "
                  "forward summaries and backward gradient rows) against the formula, summaries (`Chain.summaries`) "
                  "x bytes per summary; = formula: both directions, both mixers, one exchange per mixer, layer and "
                  "direction in A and none in B.", "",
                  rp.table(["model", "SP", "A / B CPU (busiest)", "A / B wall", "CPU s A", "B", "wall s A", "B",
                            "CPU s A per rank", "wait s A per rank", "wait s B per rank", "continued runs per rank",
                            "summaries / layer", "summary KiB / layer fwd", "bwd", "formula",
                            *(["a2a KiB / layer"] if heads else []), "= formula", "loss vs SP 1 (rel.)"], body)]
    return "\n".join(lines) + "\n"


def split_headline(res: dict[str, Any]) -> list[str]:
    """The headline lines of ``BENCHMARKS.md``: A / B per model and SP size in each measured mode."""
    measured = {m: d for m, d in res["modes"].items() if d["status"] == "measured"}
    sps = [r["sp"] for r in res["modes"]["summary_exchange"]["rows"]]
    body = []
    for name in res["models"]:
        cells, equal = [], True
        for data in measured.values():
            ms = [r["models"][name] for r in data["rows"]]
            cells += [rp.ratio(m["A"]["cpu_s"], m["B"]["cpu_s"]) for m in ms]
            equal &= all(m["A"]["equal"] and m["B"]["equal"] for m in ms)
        body.append([LABELS[name], *cells, "yes" if equal else "**no**"])
    missing = [MODE_LABELS.get(m, m) for m, d in res["modes"].items() if d["status"] != "measured"]
    ok, figs = _goal(res)
    goal = "" if ok is None else (f" Goal A / B ≤ {GOAL['ratio']} at SP {GOAL['sp']} (gated delta rule, Mamba2, "
                                  "summary exchange): " + ("**met**" if ok else "**not met**") + f" ({', '.join(figs)}).")
    heads = [f"A / B SP {p} {MODE_LABELS.get(m, m)}" for m in measured for p in sps]
    return ["", f"Command: `{HYBRID_CMD}` (second step): recurrent-only models ({res['config']['sizes']['layers']} "
            f"layers, hidden {res['config']['sizes']['hidden']}); step time (busiest rank's CPU time) of one "
            f"document of {res['config']['tokens']:,} tokens split over the SP group (A) / P whole documents, one "
            "per rank (B), in each mode." + goal
            + (f" Not measured yet: {', '.join(missing)}." if missing else ""), "",
            rp.table(["model", *heads, "exchanged bytes = formula"], body)]
