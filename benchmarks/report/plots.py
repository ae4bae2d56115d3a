"""PNG plots of the core suite's results (matplotlib, Agg backend, imported when a plot is drawn), and the plan
pictures of two layouts (:func:`hf_hsap.inspect.write_png`)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hf_hsap import plan_sequence
from hf_hsap.inspect import write_png

from ..analytic.distributions import cu_seqlens, doc_lengths

__all__ = ["draw_plots", "plot_measured", "plot_paths", "plot_tgs", "plot_traffic"]

TRAFFIC_SCHEMES = ("ring", "zigzag_ring", "allgather_kv", "ulysses", "te_p2p", "hsap_contiguous", "hsap_balanced",
                   "hsap_U1", "hsap")
TGS_SCHEMES = ("ring", "zigzag_ring", "allgather_kv", "ulysses", "usp_best", "te_p2p", "te_a2a_p2p_best", "hsap_U1", "hsap",
               "hsap_bestU")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_traffic(rows: list[dict], path: Path, T: int) -> None:
    """Received KV (max over ranks, relative to ring) and work max/mean per scheme, per distribution.

    Args:
        rows: :func:`benchmarks.analytic.traffic.summarize_traffic` rows; path: PNG; T: the row length shown.
    """
    plt = _plt()
    dists = list(dict.fromkeys(r["dist"] for r in rows))
    Ps = sorted({r["P"] for r in rows})
    fig, axes = plt.subplots(2, len(dists), figsize=(4.2 * len(dists), 7), squeeze=False)
    x = np.arange(len(TRAFFIC_SCHEMES))
    w = 0.8 / max(1, len(Ps))
    for j, dist in enumerate(dists):
        for i, P in enumerate(Ps):
            sel = {r["scheme"]: r for r in rows if r["dist"] == dist and r["T"] == T and r["P"] == P}
            recv = [sel[s]["recv_max"] if s in sel else np.nan for s in TRAFFIC_SCHEMES]
            work = [sel[s]["work_max_mean"] if s in sel else np.nan for s in TRAFFIC_SCHEMES]
            axes[0, j].bar(x + i * w, recv, w, label=f"P={P}")
            axes[1, j].bar(x + i * w, work, w, label=f"P={P}")
        axes[0, j].set_title(f"{dist}, T={T // 1024}K")
        axes[0, j].set_ylabel("recv KV max / ring's")
        axes[1, j].set_ylabel("work max / mean")
        axes[1, j].axhline(1.05, color="k", lw=0.7, ls="--")
        for a in axes[:, j]:
            a.set_xticks(x + 0.4 - w / 2, TRAFFIC_SCHEMES, rotation=60, ha="right", fontsize=7)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_tgs(rows: list[dict], path: Path, model: str, hw: str) -> None:
    """Predicted TGS relative to the physical bound, per scheme, for every node count and T.

    Args:
        rows: :func:`benchmarks.analytic.predictions.run_predictions` rows; path: PNG; model: model name; hw: hardware.
    """
    plt = _plt()
    sel = [r for r in rows if r["model"] == model and r["hw"] == hw]
    configs = list(dict.fromkeys((r["nodes"], r["T"]) for r in sel))
    dists = list(dict.fromkeys(r["dist"] for r in sel))
    fig, axes = plt.subplots(len(configs), 1, figsize=(12, 2.6 * len(configs)), squeeze=False)
    x = np.arange(len(TGS_SCHEMES))
    w = 0.8 / max(1, len(dists))
    for i, (nodes, T) in enumerate(configs):
        a = axes[i, 0]
        for j, dist in enumerate(dists):
            r = next((r for r in sel if (r["nodes"], r["T"], r["dist"]) == (nodes, T, dist)), None)
            if r is None:
                continue
            vals = [r["tgs"].get(s, np.nan) / r["bound_tgs"] if r["correct"].get(s, True) else np.nan
                    for s in TGS_SCHEMES]
            a.bar(x + j * w, vals, w, label=dist)
        a.set_ylabel("TGS / bound")
        a.set_title(f"{model} on {hw}, {nodes}×8 GPUs, T={T // 1024}K", fontsize=9)
        a.set_xticks(x + 0.4 - w / 2, TGS_SCHEMES, fontsize=8)
        a.set_ylim(0, 1)
    axes[0, 0].legend(fontsize=7, ncol=len(dists))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_measured(measured: dict, path: Path) -> None:
    """Measured fwd + bwd wall time (median) and summed CPU time per schedule and configuration.

    Args:
        measured: :func:`benchmarks.suites.measured.run_measured` result; path: PNG.
    """
    plt = _plt()
    configs = measured["configs"]
    names = list(configs[0]["results"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    x = np.arange(len(configs))
    w = 0.8 / len(names)
    for i, n in enumerate(names):
        axes[0].bar(x + i * w, [c["results"][n]["ms"] for c in configs], w, label=n)
        axes[1].bar(x + i * w, [c["results"][n]["cpu_sum_ms"] for c in configs], w, label=n)
    labels = [f"{c['dist']}\nhkv={c['hkv']}" for c in configs]
    for a, t in zip(axes, ("wall ms, slowest rank (median)", "CPU ms, all ranks (median)")):
        a.set_xticks(x + 0.4 - w / 2, labels)
        a.set_title(t)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"CPU, world {measured.get('world', 4)}, T={configs[0]['T']}: fwd + bwd of one attention layer")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plots(results: dict[str, Any], folder: Path) -> list[tuple[Path, Callable[[Path], None]]]:
    """Every plot of the core suite's results: its file in ``folder`` and what draws it there."""
    traffic, cost = results["traffic_rows"], results["cost_rows"]
    out: list[tuple[Path, Callable[[Path], None]]] = [
        (folder / f"traffic_T{T // 1024}K.png", lambda p, T=T: plot_traffic(traffic, p, T))
        for T in sorted({r["T"] for r in traffic})]
    out += [(folder / f"tgs_{hw}_{model}.png", lambda p, hw=hw, model=model: plot_tgs(cost, p, model, hw))
            for hw in sorted({r["hw"] for r in cost}) for model in sorted({r["model"] for r in cost})]
    if results.get("measured"):
        out.append((folder / "cpu_measured.png", lambda p: plot_measured(results["measured"], p)))
    T, P = min(r["T"] for r in traffic), min(r["P"] for r in traffic)
    out += [(folder / f"plan_{dist}_T{T // 1024}K_P{P}.png",
             lambda p, dist=dist: write_png(plan_sequence(cu_seqlens(doc_lengths(dist, T, 0)), P, "auto"), str(p),
                                            f"hf_hsap plan (auto): {dist}, seed 0, T={T}, P={P}"))
            for dist in ("longtail", "mixed")]
    return out


def plot_paths(results: dict[str, Any], folder: Path) -> list[Path]:
    """The PNGs of the core suite's results (what :func:`draw_plots` writes), in the plots page's order.

    Args:
        results: the core suite's results dict (``traffic_rows``, ``cost_rows``, ``measured``).
        folder: the plots' folder (``benchmarks/plots/``).

    Returns:
        Their paths.
    """
    return [p for p, _ in _plots(results, folder)]


def draw_plots(results: dict[str, Any], folder: Path) -> list[Path]:
    """Draw the PNGs of :func:`plot_paths`.

    Args:
        results: the core suite's results dict. folder: where they go (made if missing).

    Returns:
        Their paths.
    """
    folder.mkdir(parents=True, exist_ok=True)
    plots = _plots(results, folder)
    for path, draw in plots:
        draw(path)
    return [p for p, _ in plots]
