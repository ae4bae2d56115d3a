"""The CPU measurements of the core suite (``python -m benchmarks core``, ``bash scripts/bench.sh``) in markdown: the schedules side
by side, hf_hsap's compute path on one rank, the CPU kernel by segment shape and the peak memory per rank (the detail
file ``benchmarks/results/cpu.md``; every number is read from the results dict)."""
from __future__ import annotations

from . import format as rp

__all__ = ["cpu_detail", "measured_section"]


def cpu_detail(res: dict) -> str:
    """The CPU detail file's body: :func:`measured_section`, or a line saying the run skipped it.

    Args:
        res: the results dict of :mod:`benchmarks.suites.core`.

    Returns:
        Markdown.
    """
    if not res.get("measured"):
        return "## Measured on CPU\n\nSkipped in this run (`--skip-cpu`)."
    return measured_section(res)


def measured_section(res: dict) -> str:
    """The "Measured on CPU" section: the schedules side by side, hf_hsap's compute path on one rank, the CPU kernel
    by segment shape and the peak memory per rank.

    Args:
        res: the results dict of :mod:`benchmarks.suites.core` (``measured``, ``measure_config``, ``kernel_paths``,
            ``kernel_shapes``, ``memory``, ``meta``).

    Returns:
        Markdown.
    """
    m, cfg = res["measured"], res.get("measure_config", {})
    probe = m["torch_cp"]
    cp = ("runs on CPU / gloo but is not timed: it applies one causal mask to the whole row (no document "
          "mask), so it is wrong on the measured layouts" if probe == "ok" else
          f"**does not run on CPU / gloo** (torch {res['meta']['torch']}): `{probe}`. Its ring dispatches only the "
          "CUDA SDPA kernels (flash, efficient, cudnn); on CPU SDPA calls `_scaled_dot_product_flash_attention_for_cpu`, "
          "which has no DTensor sharding rule, and the math fallback mixes DTensors with plain tensors. It would also "
          "apply one causal mask to the whole row (no document mask).")
    lines = [
        "## Measured on CPU",
        "",
        f"World {cfg.get('world', 4)} (spawned processes, gloo, one thread each) on the {res['meta']['cores']}-core "
        f"machine of this run ({res['meta']['cpu']}); T = {m['configs'][0]['T']}, float32, forward + backward of one attention layer; seed "
        f"{cfg.get('seed', 0)}; the first run of each schedule is checked against hf_hsap's output and input "
        f"gradients (assert, max relative error in the table) and serves as warm-up; then {cfg.get('reps', 5)} "
        "rounds time every schedule once each (interleaved), `dist.barrier()` before and after, `time.perf_counter`. "
        "Time = median over rounds of the slowest rank. CPU = `time.process_time` of each rank (all its threads, "
        "gloo's included): less disturbed by other load, and it shows the total work of a schedule.",
        "",
        "All schedules call the same kernel (`TorchCPUFlashKernel`, per-segment PyTorch CPU flash attention): "
        "**ring** (contiguous shards, every KV block travels P − 1 steps with batched isend/irecv, next block in "
        "flight during compute, masked pairs only, LSE merge; backward passes K/V and the dK/dV accumulator around the "
        "ring), **allgather_kv** (Llama 3: row zigzag shards, all-gather K/V once and keep it, one varlen call per "
        "rank, dK/dV reduce-scattered by all-to-all), **ulysses** (DeepSpeed: all-to-all q, k, v over heads, "
        "the whole row's varlen attention, all-to-all back; kv heads repeated to 4 when there are 2), and hf_hsap "
        "(`hsap_attn_func`, placement auto with the attention-only cost model; `hsap_U2`: U = 2 × R = 2). Ratios are schedule / hsap (> 1: hsap faster). "
        "Bytes: received from other ranks per fwd + bwd (hf_hsap: P2P received + all-to-all sent).",
        "",
        f"PyTorch `context_parallel`: {cp}",
        "",
        rp.measured_tables(m),
    ]
    if res.get("kernel_paths"):
        body = [[k["dist"], k["hkv"], k["part"], k["items"], f"{k['pairs']:.3g}",
                 f"{(k['plan_fwd_s'] + k['plan_bwd_s']) * 1e3:.0f}", f"{(k['single_fwd_s'] + k['single_bwd_s']) * 1e3:.0f}",
                 f"{k['plan_tflops'] * 1e3:.1f}", f"{k['single_tflops'] * 1e3:.1f}", rp._f(k["plan_tflops"] / k["single_tflops"])]
                for k in res["kernel_paths"]]
        lines += ["", "#### hf_hsap's compute path on one rank (one process, no communication)", "",
                  "The busiest rank's `sap_forward` + `sap_backward` (local item, remote items on ready receive "
                  "buffers, gathers, LSE merges) against one causal varlen call with the same number of pairs; "
                  "GFLOP/s count 4 · pairs · d · Hq · 3.5 (fwd + bwd); best of 5 after a warm-up.", "",
                  rp.table(["dist", "kv heads", "rank", "work items", "pairs", "plan ms", "one call ms",
                            "plan GFLOP/s", "one call GFLOP/s", "plan / one call"], body)]
    if res.get("kernel_shapes"):
        ks = [k for k in res["kernel_shapes"] if "whole_fwd_ms" in k]
        body = [[k["kind"], k["nq"], k["nk"], k["heads"], f"{k['whole_fwd_ms']:.1f} / {k['halved_fwd_ms']:.1f}",
                 f"{k['whole_bwd_ms']:.1f} / {k['halved_bwd_ms']:.1f}", f"{k['whole_mpairs_per_s']:.0f}",
                 f"{k['default_mpairs_per_s']:.0f}", f"{k['default_mpairs_per_s'] / k['whole_mpairs_per_s']:.2f}"]
                for k in ks]
        lines += ["", "#### The CPU kernel by segment shape", "",
                  "`TorchCPUFlashKernel`, float32, one thread, best of 3; forward and backward timed apart, each "
                  "shape as one op call and halved (causal squares cut down to 128 rows when a call has at least "
                  "4 query heads, 256 rows below); throughput in million useful (query, key) pairs per head per "
                  "second, fwd + bwd. PyTorch's CPU flash attention walks keys in blocks of 512, so one call on a "
                  "causal square also computes about 256 masked keys per query row on its diagonal; halving "
                  "leaves masked keys only on small diagonal squares. That pays in the backward; in the forward "
                  "the LSE merges of the pieces cost more than the skipped keys, so the kernel halves the "
                  "backward only (`default`).", "",
                  rp.table(["kind", "queries", "keys", "heads", "fwd ms one call / halved",
                            "bwd ms one call / halved", "one call M pairs·head / s", "default M pairs·head / s",
                            "default / one call"], body)]
    if res.get("memory"):
        mem = res["memory"][0]
        lines += [
            "", "## Peak memory per rank (CPU)", "",
            f"One hf_hsap attention forward + backward, T = {mem['T']}, world {cfg.get('world', 4)}, {mem['hq']} q heads, "
            f"{mem['hkv']} kv heads, head dim {mem['d']}, float32, placement auto, each case in fresh processes (glibc "
            "returns freed memory at once). Peak Δ = peak resident set (VmHWM, reset just before the call) minus the "
            "resident set before it; q, k, v and dout exist before. Model = the planner's own "
            "(`hf_hsap.plan.memory`, what a `per_batch` group weighs its degrees with): own-token tensors (output "
            "and dQ per query head; dK|dV accumulators and the K|V send rows per kv head) + the receive side — "
            "without a budget every round's buffer is kept for the backward with its gradient; with one the rounds "
            "are double-buffered (two buffers and one gradient of the largest round) — + the gradients returning "
            "for the rows this rank sent.",
            "", rp.memory_table(res["memory"]),
        ]
    return "\n".join(lines)
