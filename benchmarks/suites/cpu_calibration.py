"""The planner's cost model for the CPU benchmarks, measured on the ranks that run them (a collective).

On the 2-core machine four gloo ranks share two cores: moving a byte costs CPU time that attention would have
used, so the GPU defaults (KV over NVLink at 300 GB/s against 312 TFLOP/s) misprice it. This measures what
:meth:`hf_hsap.CostModel.from_shapes` needs, on the kernel and the groups the benchmark uses, while every rank
does the same (the same contention as a timed step):

* attention: forward + backward of one causal document of ``n`` rows through hf_hsap's CPU kernel
  (:class:`~hf_hsap.kernels.TorchCPUFlashKernel`), seconds per (query, key) pair;
* SAP's point-to-point: every rank sends ``n`` rows of K and V to the next and receives from the previous
  (``batch_isend_irecv``), bytes per second;
* the all-to-all: ``all_to_all_single`` of ``n`` rows of q, k, v, bytes per second;
* a round's latency: the same exchange of one row.

Each figure is the median of a few runs, averaged over the ranks (``all_reduce``), so every rank builds the same
model and plans the same; what the cost model then decides (which placement, which Ulysses degree per batch) is
what ``benchmarks/suites/peers.py`` measures.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

import hf_hsap
from hf_hsap.kernels import TorchCPUFlashKernel

DIAG_BLOCK = 256  # the CPU kernel's masked pairs on a causal piece's diagonal (benchmarks/suites/cpu_workers.py)


def _median_s(fn: Callable[[], None], runs: int) -> float:
    """Median wall seconds of ``runs`` calls of ``fn``, every rank starting together."""
    ts = []
    for _ in range(runs):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def measure_cpu_figures(hq: int, hkv: int, d: int, n: int = 2048, runs: int = 5) -> dict[str, float]:
    """Seconds per attention pair (fwd + bwd), point-to-point and all-to-all bytes per second, averaged over the
    ranks of the default group (collective).

    Args:
        hq, hkv, d: query heads, key/value heads, head dim. n: rows of the measured document and messages.
        runs: runs of each measurement (the median counts; one more warms up).

    Returns:
        ``{"pair_s", "p2p_bytes_per_s", "a2a_bytes_per_s", "latency_s"}`` (the last: one round of a one-row
        exchange).
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(n, h, d, generator=g) for h in (hq, hkv, hkv))
    kernel = TorchCPUFlashKernel()

    def attention() -> None:
        a, b, c = (x.detach().requires_grad_(True) for x in (q, k, v))
        hf_hsap.varlen_attention(a, b, c, [0, n], [0, n], True, softmax_scale=d ** -0.5, kernel=kernel).sum().backward()

    kv = torch.cat([k, v], dim=1).reshape(n, -1)  # [n, 2 * Hkv * D]: the rows SAP sends
    kv_in = torch.empty_like(kv)

    def p2p(rows: int = n) -> None:
        ops = [dist.P2POp(dist.isend, kv[:rows], (rank + 1) % world),
               dist.P2POp(dist.irecv, kv_in[:rows], (rank - 1) % world)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    qkv = torch.cat([q, k, v], dim=1).reshape(n, -1)  # [n, (Hq + 2 Hkv) * D]: what Ulysses exchanges
    qkv_in = torch.empty_like(qkv)

    def a2a() -> None:
        dist.all_to_all_single(qkv_in, qkv)

    figures = []
    for fn, units in ((attention, n * (n + 1) / 2), (p2p, kv.numel() * kv.element_size()),
                      (a2a, qkv.numel() * qkv.element_size() * (world - 1) / world), (lambda: p2p(1), 1)):
        fn()  # warm-up
        figures.append(_median_s(fn, runs) / units)
    t = torch.tensor(figures, dtype=torch.float64)
    dist.all_reduce(t)
    pair_s, p2p_s, a2a_s, latency_s = (float(x) / world for x in t)
    return {"pair_s": pair_s, "p2p_bytes_per_s": 1.0 / p2p_s, "a2a_bytes_per_s": 1.0 / a2a_s, "latency_s": latency_s}


def cpu_cost_model(hq: int, hkv: int, d: int, figures: dict[str, float] | None = None) -> hf_hsap.CostModel:
    """The cost model of one attention layer (no linear layers: ``token_cost`` 0) on these CPU ranks.

    Args:
        hq, hkv, d: the layer's shapes. figures: :func:`measure_cpu_figures`'s result (measured here if None:
            a collective).

    Returns:
        ``CostModel.from_shapes`` with the measured pair time as the "peak" (efficiency 1), float32 KV and
        gradients over the measured point-to-point rate, the all-to-all at its measured rate,
        :data:`DIAG_BLOCK`, and ``overlap=0``: four ranks on two cores have no idle processor to move KV
        while attention runs (gloo's copies take the cores the kernel needs).
    """
    f = figures or measure_cpu_figures(hq, hkv, d)
    flops_per_pair = 4 * d * hq * 3.5  # from_shapes' pair: forward 4 d hq flops, fwd + bwd 3.5x
    model = hf_hsap.CostModel.from_shapes(hq, hkv, d, 0.0, f["p2p_bytes_per_s"], flops_per_pair / f["pair_s"],
                                          attn_eff=1.0, gemm_eff=1.0, dtype_bytes=4, grad_bytes=4,
                                          alpha_s=f["latency_s"], a2a_bytes_per_s=f["a2a_bytes_per_s"])
    return dataclasses.replace(model, diag_block=DIAG_BLOCK, overlap=0.0)
