"""The cost estimate that ``placement="auto"`` minimises.

Time of a part, in units of one (query, key) pair of attention work::

    t_r = max(local_work_r, kv_token_cost * recv_r) + remote_work_r

local work (queries against the part's own keys) runs while the needed KV is in flight; remote
work waits for it. ``auto`` picks the placement with the smallest ``max_r t_r``.

``kv_token_cost`` = time to receive one KV token / time of one pair. Default: A100 between nodes
(InfiniBand 25 GB/s per GPU, a bf16 K+V token of ``4*Hkv*D`` bytes) against the attention kernel at
50% of 312 TFLOP/s (``4*Hq*D`` FLOPs per pair forward): ``6240 * Hkv / Hq``, with MHA assumed.
The benchmarks' cost model (``benchmarks/cost_model.py``) derives the same figure per model and
hardware; pass a :class:`CostModel` to plan for other links.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .layout import Layout
from .placement import Placement
from .transfers import Transfers


@dataclass(frozen=True)
class CostModel:
    """Args: kv_token_cost: pair-equivalents per received KV token (see module docstring)."""

    kv_token_cost: float = 6240.0

    @staticmethod
    def for_link(link_bytes_per_s: float, kernel_flops_per_s: float, q_heads: int, kv_heads: int,
                 dtype_bytes: int = 2) -> "CostModel":
        """Cost model of a link and a kernel speed (per GPU), for a head configuration."""
        kv_token_s = 2 * kv_heads * dtype_bytes / link_bytes_per_s  # per head_dim unit
        pair_s = 4 * q_heads / kernel_flops_per_s
        return CostModel(kv_token_cost=kv_token_s / pair_s)


def part_times(layout: Layout, pl: Placement, tr: Transfers, cost: CostModel) -> np.ndarray:
    """``[n_parts]`` estimated time of every part (module docstring)."""
    work = pl.work_per_part(layout).astype(np.float64)
    # local work: per (part, doc), causal over the part's own tokens of that doc
    key = pl.part * (layout.n_docs + 1) + pl.doc
    uniq, inv = np.unique(key, return_inverse=True)
    n = np.bincount(inv, weights=pl.end - pl.start)
    local = np.bincount(uniq // (layout.n_docs + 1), weights=n * (n + 1) / 2, minlength=pl.n_parts)
    recv = np.bincount(tr.dst, weights=tr.lengths, minlength=pl.n_parts)
    return np.maximum(local, cost.kv_token_cost * recv) + (work - local)


def choose_placement(layout: Layout, candidates: Sequence[Placement], transfers: Sequence[Transfers],
                     cost: CostModel | None = None) -> int:
    """Index of the candidate with the smallest estimated step time (first wins ties)."""
    cost = cost or CostModel()
    times = [float(part_times(layout, c, t, cost).max()) for c, t in zip(candidates, transfers)]
    return int(np.argmin(times))
