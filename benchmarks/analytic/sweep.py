"""The placement sweep: ``placement="auto"`` on layouts nobody tuned for, against every other placement,
the compute lower bound and the offline optimiser (no clock but planning time): its layouts, groups, goals and the
judgements of a row; :mod:`benchmarks.suites.sweep` runs it (``python -m benchmarks sweep [--quick]`` prints the
section's markdown; the core suite, :mod:`benchmarks.suites.core`, puts it in ``benchmarks/results/sweep.md``).

* Layouts (:data:`SWEEP_DISTRIBUTIONS`, :func:`sweep_lengths`, both :mod:`hf_hsap.data.lengths`'): log-normal
  lengths of four spreads, Pareto tails, a two-mode mixture, rows where one or two documents hold most of the pairs,
  many tiny documents, and the spec's ``sft``; seeds ``0..n-1``; ``T = tokens_per_rank * P`` (at most
  :attr:`SweepConfig.max_T`).
* Groups: ``P`` ∈ {2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64} ranks (not only powers of two), ``U`` ∈ {1, 2, 4,
  8} dividing ``P`` with at least two parts, priced for NVLink (every rank in one node) or for the
  network (``U`` ranks per node, SAP between nodes): ``CostModel.for_link(link)`` as the planner's default.
* Figures, one full-attention layer, by the planner's own cost model (:func:`hf_hsap.plan.cost.part_times`;
  a rank's time is its part's divided by ``U``): *est max* of the slowest part; ``LB = (token_cost' * T +
  sum_d L_d (L_d + 1) / 2) / parts`` (every part equally loaded, no communication; ``token_cost'`` is the
  plan's, with the all-to-all's share when ``U > 1``); *losses*: layouts where ``auto``'s est max exceeds
  another placement's (``contiguous``, ``zigzag``, ``balanced``, ``density``); *oracle*: the local search
  of :mod:`hf_hsap.plan.local_search` started from ``auto``'s placement and every simpler one, run where
  ``parts <= oracle_max_parts`` (and its placement's rounds simulated, ``oracle_sim``, beside auto's ``sim``),
  and at any size where auto misses the goal (:data:`GOALS`) that the bound below leaves within reach
  (``missed_oracle``, ``missed_oracle_sim``: does a placement the search finds meet it, and at what simulated cost);
  recv max / ring (ring attention receives every other part's ``T - T/parts`` KV tokens); *sim*: auto's slowest
  part with its rounds simulated forward and backward (:func:`hf_hsap.plan.simulation.simulated_time`); *bound*: the
  lower bound of :func:`benchmarks.analytic.relaxation.relaxed_bound` (at least :func:`benchmarks.analytic.bound.transfer_bound`,
  ``transfer_bound`` in the row), which also counts the transfers no placement within the token cap avoids and
  the tokens the other documents need (where it exceeds the goal, no placement meets it); tokens and work
  max/mean; planning time of ``auto`` (cold, no cache, wall clock); on NVLink with ``U = 1``, every
  Ulysses degree's estimate (:func:`hf_hsap.choose_ulysses_size`, Llama-3-8B's 32 query heads) against
  Ulysses itself (``U = P``); on groups of several 8-GPU nodes, the degree ``ulysses_size="per_batch"`` picks per
  layout against a rank's share of the bound (:func:`per_batch_rows`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hf_hsap.data.lengths import SWEEP_DISTRIBUTIONS, sweep_lengths
from hf_hsap.plan.cost import CostModel, balance_bound
from hf_hsap.plan.layout import make_layout
from hf_hsap.plan.planner import choose_ulysses_size

OTHERS = ("contiguous", "zigzag", "balanced", "density")
MODEL_Q_HEADS = 32  # Llama-3-8B: Ulysses (U = P) runs where P divides the query heads
MODEL_KV_HEADS = 8  # and its key/value heads: what the per-batch degree's memory cap weighs
NODE_GPUS = 8  # the per-batch degree rows: groups of 8-GPU nodes spanning several nodes
GOALS = {"nvlink": 1.05, "network": 1.10}  # the est/LB goal per link pricing
ORACLE_GOAL = 1.02  # ... and auto's est within this factor of the oracle's where the oracle runs


@dataclass(frozen=True)
class SweepConfig:
    """Sizes of the sweep (module docstring)."""

    Ps: Sequence[int] = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    Us: Sequence[int] = (1, 2, 4, 8)
    links: Sequence[str] = ("nvlink", "network")
    distributions: Sequence[str] = SWEEP_DISTRIBUTIONS
    seeds: int = 2
    tokens_per_rank: int = 2048
    max_T: int = 65536
    oracle_max_parts: int = 8
    oracle_moves: int = 150

    @staticmethod
    def quick() -> "SweepConfig":
        return SweepConfig(Ps=(3, 8, 16), Us=(1, 2), seeds=1, tokens_per_rank=2048, oracle_max_parts=8,
                           oracle_moves=100)


def sweep_groups(cfg: SweepConfig):
    """Every (P, U, link) of the sweep with at least two parts."""
    for P in cfg.Ps:
        for U in cfg.Us:
            if P % U or P // U < 2:
                continue
            for link in cfg.links:
                yield P, U, link


def per_batch_rows(cfg: SweepConfig) -> list[dict]:
    """What ``ulysses_size="per_batch"`` runs on groups of several :data:`NODE_GPUS`-GPU nodes: per layout, every
    degree dividing P and a node (Ulysses inside nodes, SAP between them over the network) priced by
    :func:`hf_hsap.choose_ulysses_size`; a rank's estimate against the rank's share of the compute lower bound
    ``(token_cost * T + pairs) / P`` (no communication, no all-to-all)."""
    out = []
    for P in cfg.Ps:
        if P % NODE_GPUS or P == NODE_GPUS:
            continue
        T = min(cfg.max_T, cfg.tokens_per_rank * P)
        network = CostModel.for_link("network")
        for dist in cfg.distributions:
            for seed in range(cfg.seeds):
                L = sweep_lengths(dist, T, seed)
                layout = make_layout(np.concatenate([[0], np.cumsum(L)]))
                best_u, by_u = choose_ulysses_size(layout, P, num_heads=MODEL_Q_HEADS, gpus_per_node=NODE_GPUS,
                                                   num_kv_heads=MODEL_KV_HEADS)
                lb = balance_bound(layout, P, network)  # a rank's share: no communication, no all-to-all
                out.append({"dist": dist, "seed": seed, "P": P, "best_u": best_u,
                            "by_u": {str(u): t / lb for u, t in by_u.items()}})
    return out


def loses_to(row: dict, other: str) -> bool:
    """Whether ``auto``'s est max on a sweep row exceeds ``other``'s (beyond float rounding): a loss."""
    return row["est"]["auto"] > row["est"][other] * (1 + 1e-9)


def missed_in_reach(row: dict) -> bool:
    """Whether auto misses its link's goal (:data:`GOALS`) on a sweep row where the bound leaves it within reach."""
    goal = GOALS[row["link"]] * row["lb"]
    return row["est"]["auto"] > goal >= row["bound"]


def searched(row: dict) -> tuple[float, float] | None:
    """The oracle's ``(est, sim)`` on a sweep row (the small groups' search, or the one run where auto missed a goal
    within reach), ``None`` where it did not run."""
    for key in ("oracle", "missed_oracle"):
        if f"{key}_sim" in row:
            return row[key], row[f"{key}_sim"]
    return None


def max_over_mean(x: np.ndarray) -> float:
    return float(np.max(x) / np.mean(x))
