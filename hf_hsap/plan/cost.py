"""The cost estimate that ``placement="auto"`` minimises.

Step time of a part (forward + backward of one layer), in units of one (query, key) pair of
attention work::

    t_r = token_cost * tokens_r + max(local_work_r, kv_token_cost * recv_r) + remote_work_r

* ``tokens_r``: tokens held; every other layer of the block (projections, MLP) costs per token.
* ``local_work_r``: pairs of queries against the part's own keys: run while the needed KV is in
  flight. ``remote_work_r``: pairs against received keys: wait for them.
* ``recv_r``: KV tokens received (forward KV, backward dK/dV travel back).

Defaults (:meth:`CostModel.default`): Llama-3-8B shapes (32 q heads, 8 kv heads, head dim 128,
218 M parameters per layer) on A100 nodes with InfiniBand (25 GB/s per GPU, 80% reached) between
them; kernels at 55% (attention) and 70% (GEMM) of 312 TFLOP/s; fwd + bwd attention = 3.5x forward
FLOPs; K, V sent and dK, dV returned in bf16 (the runtime's default ``grad_comm_dtype``).
:meth:`CostModel.nvlink` is the same over NVLink (300 GB/s): what a plan uses when every SAP peer is
in one node (:func:`CostModel.for_link`). ``benchmarks/cost_model.py`` documents the same figures;
:meth:`CostModel.from_shapes` builds one for other models and links.
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
    """Relative costs in units of one attention pair (fwd + bwd).

    Args:
        token_cost: cost of one token through the non-attention parts of a layer.
        kv_token_cost: cost of receiving one KV token (and returning its gradient).
    """

    token_cost: float = 17930.0
    kv_token_cost: float = 1226.0

    @staticmethod
    def from_shapes(q_heads: int, kv_heads: int, head_dim: int, params_per_layer: float, link_bytes_per_s: float,
                    peak_flops: float, attn_eff: float = 0.55, gemm_eff: float = 0.70,
                    dtype_bytes: int = 2, grad_bytes: int = 2) -> "CostModel":
        """Cost model for a model shape, a link (per GPU, per direction) and a GPU peak."""
        pair_s = 4 * head_dim * q_heads * 3.5 / (peak_flops * attn_eff)
        token_s = 6 * params_per_layer / (peak_flops * gemm_eff)
        kv_s = 2 * kv_heads * head_dim * (dtype_bytes + grad_bytes) / link_bytes_per_s
        return CostModel(token_cost=token_s / pair_s, kv_token_cost=kv_s / pair_s)

    @staticmethod
    def default() -> "CostModel":
        """Llama-3-8B on A100, KV over InfiniBand (the module docstring)."""
        return CostModel()

    @staticmethod
    def nvlink() -> "CostModel":
        """Llama-3-8B on A100, KV over NVLink (300 GB/s per GPU, 80% reached)."""
        return CostModel(token_cost=17930.0, kv_token_cost=102.0)

    @staticmethod
    def for_link(link: str) -> "CostModel":
        """The default cost model for the link that carries SAP's KV: ``"nvlink"`` or ``"network"``."""
        if link == "nvlink":
            return CostModel.nvlink()
        if link == "network":
            return CostModel.default()
        raise ValueError(f"unknown link {link!r}; use 'nvlink' (one node) or 'network' (between nodes)")


def local_work_per_part(layout: Layout, pl: Placement) -> np.ndarray:
    """``[n_parts]`` pairs of each part's queries against its own keys (per (part, document): causal
    over the part's ``n`` tokens of it, ``n (n + 1) / 2``): the work that overlaps the KV transfers."""
    key = pl.part * (layout.n_docs + 1) + pl.doc
    uniq, inv = np.unique(key, return_inverse=True)
    n = np.bincount(inv, weights=pl.end - pl.start)
    return np.bincount(uniq // (layout.n_docs + 1), weights=n * (n + 1) / 2, minlength=pl.n_parts)


def part_times(layout: Layout, pl: Placement, tr: Transfers, cost: CostModel) -> np.ndarray:
    """``[n_parts]`` estimated step time of every part (module docstring)."""
    work = pl.work_per_part(layout).astype(np.float64)
    local = local_work_per_part(layout, pl)
    recv = np.bincount(tr.dst, weights=tr.lengths, minlength=pl.n_parts)
    tokens = pl.tokens_per_part().astype(np.float64)
    return cost.token_cost * tokens + np.maximum(local, cost.kv_token_cost * recv) + (work - local)


def choose_placement(layout: Layout, candidates: Sequence[Placement], transfers: Sequence[Transfers],
                     cost: CostModel | None = None) -> int:
    """Index of the candidate with the smallest estimated step time (first wins ties)."""
    cost = cost or CostModel.default()
    times = [float(part_times(layout, c, t, cost).max()) for c, t in zip(candidates, transfers)]
    return int(np.argmin(times))
