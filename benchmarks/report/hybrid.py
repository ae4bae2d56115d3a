"""The hybrid model's training step in markdown: the detail file ``benchmarks/results/hybrid.md`` from its results JSON
(:func:`benchmarks.suites.hybrid_step.run_hybrid_step`'s)."""
from __future__ import annotations

from typing import Any

from .format import mib, ratio, secs

__all__ = ["hybrid_section"]


def hybrid_section(res: dict[str, Any]) -> str:
    """The markdown of the detail file ``benchmarks/results/hybrid.md`` from :func:`benchmarks.suites.hybrid_step.run_hybrid_step`'s results."""
    cfg, m, f, rows = res["config"], res["model"], res["model"]["formula"], res["rows"]
    one = rows[0]
    kinds = ", ".join(f"{m['layer_types'].count(t)} {t}" for t in dict.fromkeys(m["layer_types"]))
    lines = ["## Hybrid model training step (linear attention under SP)", "",
             f"`bash scripts/bench_hybrid.sh` ({res['seconds']:.0f} s): one forward + backward (the model's loss) of "
             f"a random Qwen3.5-like hybrid (`Qwen3_5TextConfig`: {kinds} layers) beside a pure-attention Qwen3 "
             f"(`Qwen3Config`: {m['layers']} full-attention layers) of the same hidden {m['hidden']}, {m['heads']} / "
             f"{m['kv_heads']} heads of {m['head_dim']}, MLP {m['mlp']}, vocabulary {m['vocab']:,} "
             f"({one['hybrid']['params'] / 1e6:.2f} M and {one['attention']['params'] / 1e6:.2f} M parameters); "
             f"linear attention {m['linear_k_heads']} key / {m['linear_v_heads']} value heads of "
             f"{m['linear_dk']} / {m['linear_dv']}, convolution kernel {m['conv_kernel']}; float32, `hsap` "
             f"attention. One packed row of {res['row']['tokens']:,} tokens, {res['row']['documents']} documents "
             f"({', '.join(str(n) for n in cfg['lengths'])}). SP = world size on spawned gloo ranks (CPU, "
             f"{res['cpus']} cores, load average {res['load'][0]:.1f} at the start and {res['load'][1]:.1f} at the "
             "end: ranks beyond the cores share them); both models side by side in the same ranks, on the same row "
             "and plan (the SP group's default, `init_sequence_parallel(P)`: its cost model prices attention only; "
             "the hybrid on a plan priced for it: the last table). "
             "Peak: the exact tensor peak of one step (TensorPeak); time: CPU time of one step, median of "
             f"{cfg['reps']} interleaved rounds after a warm-up; busiest rank of each. Each model's loss at SP 2 / 4 "
             f"equals its SP 1 loss within {max(res['loss_err'].values()):.1e}.", "",
             "| SP | peak MiB hybrid | attention | hybrid / attention | step s hybrid | attention | "
             "hybrid / attention | SP n / SP 1 peak hybrid | attention | SP n / SP 1 time hybrid | attention |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        a, b = r["hybrid"], r["attention"]
        lines.append(f"| {r['sp']} | {mib(a['peak_mib'])} | {mib(b['peak_mib'])} | "
                     f"{ratio(a['peak_mib'], b['peak_mib'])} | {secs(a['cpu_s'])} | {secs(b['cpu_s'])} | "
                     f"{ratio(a['cpu_s'], b['cpu_s'])} | {ratio(a['peak_mib'], one['hybrid']['peak_mib'])} | "
                     f"{ratio(b['peak_mib'], one['attention']['peak_mib'])} | "
                     f"{ratio(a['cpu_s'], one['hybrid']['cpu_s'])} | "
                     f"{ratio(b['cpu_s'], one['attention']['cpu_s'])} |")
    equal = all(r["hybrid"]["states"]["equal"] for r in rows)
    m1 = m["conv_kernel"] - 1
    channels = (f["conv"] // 4 - m1 * m1) // m1
    lines += ["", "Split documents: every rank runs all its runs at once from the zero state; each run that a later "
              "run continues sends one summary (its final state B and transition A, flattened `[B | A]`) to every "
              "other rank holding a later run of its document, all in one exchange per recurrent mixer and layer; "
              "each continued run folds the summaries of the runs before it into its true initial state and "
              "corrects its output. The backward makes one exchange back: one gradient row per summary received. "
              f"Bytes of one summary row, in each of the {f['mixer_layers']} linear-attention layer(s): the "
              "convolution's "
              f"(B: the last {m1} inputs of C = {channels} channels, A: a {m1} x {m1} shift; "
              f"({channels} x {m1} + {m1 * m1}) x 4 B = {f['conv']:,} B) and the delta rule's (B: "
              f"{m['linear_v_heads']} x {m['linear_dk']} x {m['linear_dv']}, A: {m['linear_v_heads']} x "
              f"{m['linear_dk']} x {m['linear_dk']}; x 4 B = {f['recurrent']:,} B), {f['per_summary']:,} B "
              "together. Measured: the bytes the SP group's CommStats count as sent by the summary exchanges "
              "(`StateExchange.exchange`, a row's kind told by its size), summed over ranks; formula: summaries "
              "(`Chain.summaries`) x the row bytes, forward and backward alike. "
              + ("Measured = formula at every SP size, per kind and direction, and every rank makes one exchange "
                 "per mixer, layer and direction when a document is split (none otherwise)." if equal else
                 "**Measured differs from the formula** (see the JSON).") +
              " Exchanges / layer: per rank, recurrent mixer and direction (forward / backward). p2p KiB: "
              "everything the step's point-to-point and all-to-all exchanges sent (the attention layers' key / "
              "value rows included), summed over ranks.", "",
              "| SP | split docs | continued runs per rank | summaries / layer | exchanges / layer (fwd / bwd) | "
              "summary KiB / layer measured | formula | summary KiB / step (fwd + bwd) measured | formula | "
              "p2p KiB / step hybrid | attention | summary share | ranks of the split documents' runs |",
              "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        a, s = r["hybrid"], r["hybrid"]["states"]
        share = ratio(s["step"]["measured"], a["comm_bytes"]) if a["comm_bytes"] else "–"
        lines.append(f"| {r['sp']} | {a['split_docs']} | {_list(a['continued'])} | {a['summaries']} | "
                     f"{_exchanges(s)} | {_kib(s['layer']['total']['measured'])} | "
                     f"{_kib(s['layer']['total']['formula'])} | {_kib(s['step']['measured'])} | "
                     f"{_kib(s['step']['formula'])} | {_kib(a['comm_bytes'])} | {_kib(r['attention']['comm_bytes'])} | "
                     f"{share} | {_doc_ranks(a['doc_ranks'])} |")
    return "\n".join(lines + [""] + _priced_lines(res)) + "\n"


def _kib(x: float) -> str:
    return f"{x / 1024:,.0f}" if x >= 10 * 1024 or not x else f"{x / 1024:.1f}"


def _list(xs: list[int] | None) -> str:
    return "–" if xs is None else ", ".join(str(x) for x in xs)


def _exchanges(states: dict[str, Any]) -> str:
    """``fwd / bwd`` exchanges per layer of one mixer (both mixers alike, else each by kind)."""
    ex = states["exchanges"]
    per = {k: f"{v['forward']:g} / {v['backward']:g}" for k, v in ex.items()}
    return next(iter(per.values())) if len(set(per.values())) == 1 else "; ".join(f"{k} {v}" for k, v in per.items())


def _doc_ranks(doc_ranks: dict[str, list[int]]) -> str:
    """``doc 0: 0→1→0; ...``: the ranks holding each split document's runs, in token order."""
    return "; ".join(f"doc {d}: " + "→".join(str(r) for r in rs) for d, rs in doc_ranks.items()) or "–"


def _priced_lines(res: dict[str, Any]) -> list[str]:
    """The section's part on the hybrid planned for it (``hybrid_priced``) beside the hybrid on the default plan."""
    c, rows = res["model"]["cost"], res["rows"]
    equal = all(r["hybrid_priced"]["states"]["equal"] for r in rows)
    lines = ["### The hybrid, planned for it (a plan priced for its recurrent layers)", "",
             "The same hybrid (the same module) on the same row, sharded with `shard_batch(batch, sp, "
             "config=HSAPConfig(sp_size=P, cost_model=CostModel.from_config(hybrid_config, "
             f"\"{c['link']}\", \"{c['hardware']}\")))`, every other option at its default, as the group's "
             "(checked): the cost model reads the recurrent layers from `layer_types` "
             f"(mixer_token_cost {c['mixer_token_cost']:,.0f}, handoff_cost {c['handoff_cost']:,.0f} pair units, "
             f"beside token_cost {c['token_cost']:,.0f}), and `placement=\"auto\"` weighs them: every part runs its "
             "runs at once, so the recurrent layers wait for the busiest part's mixer tokens (twice for a run that "
             "continues a split document) and, when any document is split, for one summary exchange. Default: the "
             "hybrid above, on the group's plan (attention priced only). Its loss equals the default plan's within "
             f"{res['priced_err']:.1e} (relative). Peak, time, summaries and summary bytes as above; "
             + ("measured summary bytes = formula at every SP size." if equal else
                "**measured summary bytes differ from the formula** (see the JSON)."), "",
             "| SP | peak MiB default | priced | step s default | priced | priced / default time | "
             "summaries / layer default | priced | continued runs per rank default | priced | "
             "summary KiB / step priced measured | formula | split docs default | priced | "
             "ranks of the split documents' runs default | priced |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        a, b = r["hybrid"], r["hybrid_priced"]
        lines.append(f"| {r['sp']} | {mib(a['peak_mib'])} | {mib(b['peak_mib'])} | {secs(a['cpu_s'])} | "
                     f"{secs(b['cpu_s'])} | {ratio(b['cpu_s'], a['cpu_s'])} | {a['summaries']} | {b['summaries']} | "
                     f"{_list(a['continued'])} | {_list(b['continued'])} | "
                     f"{_kib(b['states']['step']['measured'])} | {_kib(b['states']['step']['formula'])} | "
                     f"{a['split_docs']} | {b['split_docs']} | {_doc_ranks(a['doc_ranks'])} | "
                     f"{_doc_ranks(b['doc_ranks'])} |")
    return lines
