"""The peers' detail file (``benchmarks/results/peers.md``) from their results JSON
(:func:`benchmarks.suites.peers.run_peers`'s)."""
from __future__ import annotations

from ..analytic.peers import CONFIDENCE, DEEPSPEED_SCHEMES
from . import format as rp
from .sources import PEERS_CMD

__all__ = ["peers_section"]

PEERS_SUITE = "python -m benchmarks peers"  # what the suite's recorded command starts with


def _ratio(v: dict) -> str:
    if "ratio" not in v:
        return "–"
    return f"{v['ratio']:.2f} ({v['ratio_q1']:.2f}–{v['ratio_q3']:.2f})"


def _err(v: dict) -> str:
    return f"{max(v['error'].values()):.1e}"


def peers_section(results: dict) -> str:
    """The Markdown of :func:`run_peers`'s results (the detail file ``benchmarks/results/peers.md``).

    Args:
        results: what :func:`run_peers` returns (or ``benchmarks/results/peers.json``).

    Returns:
        Markdown: how it was measured, one table row per (row, kv heads, scheme) with time, noise, ratio to
        hf_hsap with the quartiles of the per-round ratios, CPU-time ratio, error against float64 and peak memory.
    """
    cfg, m, me = results["config"], results["machine"], results.get("machine_end", results["machine"])
    probe = results.get("probe", {})
    ds = results.get("deepspeed")
    busy = max(m["load"][0], me["load"][0]) > (m["cores"] or 1)
    missing = [f"`{n}`: {probe[n]}" for n in DEEPSPEED_SCHEMES if n in cfg["schemes"] and probe.get(n, "ok") != "ok"]
    lines = [
        "## hf_hsap beside DeepSpeed's sequence parallelism (CPU)",
        "",
        f"- **Command**: `{results['command']}` (equivalently `{PEERS_CMD}"
        f"{results['command'][len(PEERS_SUITE):]}`), "
        f"{results['seconds']:.0f} s; raw numbers in `{results.get('out', 'benchmarks/results/peers.json')}`.",
        f"- **Software**: DeepSpeed {ds or 'not installed'}, torch {m['torch']}, Python {m['python']}.",
        f"- **Machine**: {m['cores']} cores; load average (1 min) {m['load'][0]:.1f} at the start, {me['load'][0]:.1f} "
        "at the end" + (" — **other jobs shared the machine: wall times are noisy**" if busy else "") + ".",
        f"- **Work**: world {cfg['world']} (spawned processes, gloo, one thread each), T = {cfg['T']}, "
        f"{cfg['hq']} query heads, key/value heads {' and '.join(str(h) for h in cfg['kv_heads'])}, head dim "
        f"{cfg['d']}, float32, forward + backward of one attention layer, seed {cfg['seed']}.",
        "",
        "Every scheme runs hf_hsap's CPU kernel (`TorchCPUFlashKernel`, varlen over the row's documents), so a ratio "
        "shows the schedule, not the kernel: **hsap** (`hsap_attn_func`, `ulysses_size=\"per_batch\"`: the row runs at "
        "the Ulysses degree, 1 to the world size, whose plan the cost model prices fastest among those whose modelled "
        "activation memory is at most the world size's (`hf_hsap.plan.degree`); placement auto; the U column), "
        "**hsap_flat** (the same at U = 1, flat SAP), **hsap_ulysses** "
        "(hf_hsap's own Ulysses baseline of the CPU measurements, [cpu.md](cpu.md)), **deepspeed_ulysses** (DeepSpeed's "
        "`deepspeed.sequence.layer.DistributedAttention` around a local module that runs the kernel over the whole "
        "row with the document mask; it asserts key/value heads ≥ world size, so 2 key/value heads are repeated to "
        "4 before the call, as hsap_ulysses does), **alst** (DeepSpeed's Arctic Long Sequence Training attention "
        "`UlyssesSPAttentionHF`, called as Transformers calls an attention function, with `position_ids`; it "
        "replicates key/value heads itself and the wrapped function reads the documents from the gathered position "
        "ids). Each scheme is first checked against a float64 reference of the whole row without sequence "
        f"parallelism (out, dq, dk, dv; max abs error / max abs reference, tolerance {cfg['tol']:g}; a scheme "
        f"outside it is not timed); that run is the warm-up. Then {cfg['reps']} interleaved rounds, each timing "
        "every scheme once in a rotated order, `dist.barrier()` before and after. Time = median over rounds of the "
        "slowest rank; noise = IQR / median. Ratio = median over rounds of scheme / hsap in the same round (> 1: hsap "
        "faster), with the quartiles of the per-round ratios in brackets. CPU = `time.process_time` summed over "
        "ranks, the median over rounds of scheme / hsap in the same round, with the distribution-free interval of "
        f"that median in brackets (order statistics; it holds the true median with ≥ {CONFIDENCE:.0%} confidence): "
        "an interval wholly below 1 is a scheme measurably faster than hsap, wholly above 1 measurably slower, one "
        "holding 1 a tie within the noise. Peak = the "
        "largest rank's resident-set growth during one step (VmHWM reset before it; glibc returns freed blocks at "
        "once), inputs and shards excluded; per rank the median over three interleaved rounds after one unmeasured "
        "warm-up step per scheme (one step alone moves by a few MiB with the heap's history). Tensors = the largest "
        "rank's exact peak of the tensors one step allocates (`benchmarks/tensor_memory.py`: every storage an aten "
        "operator creates, forward and backward, collective buffers included, until it is freed; inputs and shards "
        "excluded; what a GPU's `torch.cuda.max_memory_allocated` reports), deterministic and free of the heap's "
        "noise: the figure the memory goal is judged by.",
    ]
    cal = results.get("calibration")
    if cal:
        lines += ["", "hf_hsap's cost model was measured on the ranks before the rows (`benchmarks/suites/cpu_calibration.py`, "
                      "every rank at once, averaged over ranks): " + "; ".join(
                          f"{h} kv heads: {f['pair_s'] * 1e9:.0f} ns per attention pair (fwd + bwd), point-to-point "
                          f"{f['p2p_bytes_per_s'] / 1e6:.0f} MB/s, all-to-all {f['a2a_bytes_per_s'] / 1e6:.0f} MB/s, "
                          f"round latency {f['latency_s'] * 1e3:.2f} ms" for h, f in cal.items())
                  + "; nothing of a transfer is hidden behind attention (`overlap=0`: four ranks share two cores)."]
    if missing:
        lines += ["", "Not run: " + "; ".join(missing) + "."]
    if not results.get("all_exact", True):
        lines += ["", "**Some schemes were not exact and were not timed (error column).**"]
    body = []
    for c in results["configs"]:
        for n, v in c["results"].items():
            us = sorted({i.get("ulysses") for i in v.get("info", []) if isinstance(i, dict) and i.get("ulysses")})
            body.append([c["label"], c["n_docs"], c["hkv"], n, ", ".join(map(str, us)) or "–",
                         f"{v['ms']:.0f}" if "ms" in v else "not timed",
                         f"{v['noise']:.2f}" if "noise" in v else "–", "1 (base)" if n == "hsap" else _ratio(v),
                         rp.cpu_cell(v),
                         _err(v) + ("" if v["exact"] else " **not exact**"),
                         f"{v['peak_mib']:.0f}" if "peak_mib" in v else "–",
                         f"{v['tensor_mib']:.1f}" if "tensor_mib" in v else "–"])
    lines += ["", rp.table(["row", "docs", "kv heads", "scheme", "U", "ms", "noise", "scheme / hsap", "CPU scheme / hsap",
                            "max rel. error", "peak MiB / rank", "tensors MiB / rank"], body)]
    peers = [v for c in results["configs"] for n, v in c["results"].items() if n in DEEPSPEED_SCHEMES and "ratio" in v]
    if peers:
        r = [v["ratio"] for v in peers]
        slower = sum(v["cpu_hi"] < 1 for v in peers if "cpu_hi" in v)
        lines += ["", f"DeepSpeed's schemes / hsap over every row: {rp.span(r)} (wall), "
                      f"{rp.span([v['cpu_ratio'] for v in peers])} (CPU); hsap faster in {sum(x > 1 for x in r)}/{len(r)} "
                      f"by wall time, measurably slower by CPU time in {slower}/{len(peers)}."]
    return "\n".join(lines)
