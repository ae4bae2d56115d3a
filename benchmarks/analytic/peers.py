"""The peers' figures from their ranks' timings (no processes, no clock): DeepSpeed's schemes hf_hsap is held against,
the quartiles and the interval of a per-round ratio's median, and the summary of one configuration; shared by the
peers suite (:mod:`benchmarks.suites.peers`), which measures, and its pages (:mod:`benchmarks.report.peers`)."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["CONFIDENCE", "DEEPSPEED_SCHEMES", "median_interval", "quartiles", "summarize"]

DEEPSPEED_SCHEMES = ("deepspeed_ulysses", "alst")  # DeepSpeed's schemes hf_hsap is held against


def quartiles(x: np.ndarray) -> tuple[float, float, float]:
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    return float(q1), float(med), float(q3)


CONFIDENCE = 0.95  # of the interval a per-round ratio's median is judged by


def median_interval(x: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """``(lo, median, hi)``: the distribution-free interval of the median of ``x`` (order statistics
    ``x_(k)`` and ``x_(n+1-k)``, ``k`` the largest with ``P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2``),
    so it holds the true median with at least ``confidence`` for any distribution of independent rounds; too
    few rounds give the whole range. 15 rounds: ``x_(4)`` to ``x_(12)`` (96.5 %).

    Args:
        x: ``[n]`` per-round values, n ≥ 1.

    Returns:
        the interval's bounds and the median.
    """
    v = np.sort(np.asarray(x, dtype=np.float64))
    n = len(v)
    tail, k = 0.0, 0
    while k < n // 2 and tail + math.comb(n, k) / 2.0 ** n <= (1 - confidence) / 2:
        tail += math.comb(n, k) / 2.0 ** n
        k += 1
    k = max(k, 1)  # x_(1)..x_(n) at least: the whole range
    return float(v[k - 1]), float(np.median(v)), float(v[n - k])


def summarize(per_rank: list[dict], memory: list[dict] | None = None) -> dict:
    """Per scheme: times over rounds (slowest rank per round), ratios to hf_hsap, errors, peak memory.

    Args:
        per_rank: :func:`benchmarks.suites.peer_workers.peers_task` results, one per rank.
        memory: :func:`benchmarks.suites.peer_workers.peers_memory_task` results, one per rank (optional).

    Returns:
        ``{name: {"exact", "error": {tensor: err}, "info"} + (timed schemes) {"ms", "runs_ms", "noise", "ratio",
        "ratio_q1", "ratio_q3", "ratio_noise", "ratio_of_medians", "cpu_ms", "cpu_ratio", "cpu_lo", "cpu_hi"} + (with
        memory)
        {"peak_mib", "tensor_mib"}}``. ``ms``: median over rounds of the slowest rank; ``noise``: its IQR / median; ``ratio``:
        the median over rounds of this scheme's time / hf_hsap's in the same round (> 1: hf_hsap faster; the
        rounds are interleaved, so the two saw about the same load), ``ratio_q1`` / ``ratio_q3`` the quartiles of
        those per-round ratios and ``ratio_noise`` their IQR / median; ``ratio_of_medians``: ``ms`` / hf_hsap's;
        ``cpu_ms``: median over rounds of the CPU time summed over ranks; ``cpu_ratio``: the median over rounds of
        this scheme's summed CPU time / hf_hsap's in the same round, ``cpu_lo`` / ``cpu_hi`` the
        :func:`median_interval` of those per-round ratios (``cpu_hi`` < 1: measurably slower than hf_hsap,
        ``cpu_lo`` > 1: measurably faster); ``peak_mib``: the largest rank's peak resident-set growth, MiB; ``tensor_mib``: the largest
        rank's exact peak of the tensors the step allocates (:class:`~benchmarks.tensor_memory.TensorPeak`), MiB.
    """
    r0 = per_rank[0]
    out: dict[str, dict] = {}
    for n in r0["errors"]:
        out[n] = {"exact": bool(r0["exact"][n]), "error": r0["errors"][n], "info": [r["info"][n] for r in per_rank]}
    base = np.max(np.array([r["times"]["hsap"] for r in per_rank]), axis=0) if "hsap" in r0["times"] else None
    base_cpu = np.sum(np.array([r["cpu"]["hsap"] for r in per_rank]), axis=0) if base is not None else None
    for n in r0["times"]:
        runs = np.max(np.array([r["times"][n] for r in per_rank]), axis=0)  # [reps]
        cpu = np.sum(np.array([r["cpu"][n] for r in per_rank]), axis=0)  # [reps]
        q1, med, q3 = quartiles(runs)
        s = {"ms": med * 1e3, "runs_ms": (runs * 1e3).round(1).tolist(), "noise": (q3 - q1) / med,
             "cpu_ms": float(np.median(cpu)) * 1e3}
        if base is not None:
            paired = runs / base
            p1, pm, p3 = quartiles(paired)
            c_lo, c_med, c_hi = median_interval(cpu / base_cpu)
            s.update(ratio=pm, ratio_q1=p1, ratio_q3=p3, ratio_noise=(p3 - p1) / pm,
                     ratio_of_medians=med / float(np.median(base)), cpu_ratio=c_med, cpu_lo=c_lo, cpu_hi=c_hi)
        out[n].update(s)
    for m in ([] if memory is None else [memory]):
        for n in out:
            if n in m[0]["peak_delta_bytes"]:
                out[n]["peak_mib"] = max(r["peak_delta_bytes"][n] for r in m) / 2**20
            if n in m[0].get("tensor_peak_bytes", {}):
                out[n]["tensor_mib"] = max(r["tensor_peak_bytes"][n] for r in m) / 2**20
    return out
