"""Exact traffic and balance of hf_hsap's plans beside every scheme of :mod:`benchmarks.analytic.schemes` (no clock).

For every layout of the spec (distribution × ``T`` × ``P`` × seed) :mod:`benchmarks.suites.traffic` plans the row with
hf_hsap (``ulysses_size="auto"``, placement ``auto``, rounds ``auto``; the same with one
batched round; flat ``U = 1`` with placement ``auto``, ``balanced`` and ``contiguous``; and ``U`` ∈
{2, 4, 8} with placement ``auto``), as on nodes of 8 GPUs, turns each plan into a :class:`~benchmarks.analytic.schemes.SchemeStats` and puts it beside
the baselines of :func:`benchmarks.analytic.schemes.all_schemes`, for both model shapes of the spec. The same
``SchemeStats`` feed the cost model (:mod:`benchmarks.analytic.predictions`).

Units of the summary rows (medians over seeds):

* ``recv_max`` / ``recv_mean``: KV tokens received per layer, forward (full-KV units, Llama-3-8B shape),
  divided by ring attention's ``(P - 1) / P · T``.
* ``work_max_mean`` / ``tok_max_mean``: max over ranks / mean over ranks (1.00 is perfect balance).
* ``mb_intra_*`` / ``mb_inter_*``: MB (1e6 bytes) received per GPU per layer, forward + backward, by the
  busiest GPU, over NVLink / InfiniBand, 8 GPUs per node, bf16.
"""
from __future__ import annotations

from types import SimpleNamespace
from dataclasses import dataclass, field

import numpy as np

import hf_hsap
from hf_hsap.model_shape import ModelShape
from hf_hsap.plan.placement import DEFAULT_TOKEN_SLACK

from .cost_model import MODELS
from .distributions import DISTRIBUTIONS
from .hsap_scheme import hsap_stats_from_plan
from .schemes import LLAMA2_7B_SHAPE, LLAMA3_8B_SHAPE, SchemeStats

SHAPES: dict[str, ModelShape] = {"llama2-7b": LLAMA2_7B_SHAPE, "llama3-8b": LLAMA3_8B_SHAPE}
RECV_SHAPE = "llama3-8b"  # recv_kv is reported in full-KV units of this shape (matters only for Ulysses)


@dataclass(frozen=True)
class HsapVariant:
    """One way of running hf_hsap: a placement, a Ulysses degree ``U`` (``R = P / U`` SAP parts;
    ``0``: ``ulysses_size="auto"``) and the round order. Every variant plans as it would
    on nodes of ``gpus_per_node`` GPUs: the cost model ``auto`` minimises follows the SAP link
    (NVLink when the group fits in one node, else the network)."""

    name: str
    placement: str
    ulysses_size: int
    rounds: str = "auto"


HSAP_VARIANTS: tuple[HsapVariant, ...] = (
    HsapVariant("hsap", "auto", 0),
    HsapVariant("hsap_batched", "auto", 0, "batched"),
    HsapVariant("hsap_U1", "auto", 1),
    HsapVariant("hsap_balanced", "balanced", 1),
    HsapVariant("hsap_contiguous", "contiguous", 1),
    HsapVariant("hsap_U2", "auto", 2),
    HsapVariant("hsap_U4", "auto", 4),
    HsapVariant("hsap_U8", "auto", 8),
)
MODEL_Q_HEADS = 32  # both spec models: what ulysses_size="auto" divides


def planner_cost(shape_key: str, link: str, hardware: str = "A100") -> hf_hsap.CostModel:
    """The planner's cost model for a spec model on ``hardware`` (``CostModel.from_config``, as the
    trainers derive it from the model config and the GPU) with SAP's KV over ``link``."""
    m = MODELS[shape_key]
    config = SimpleNamespace(num_attention_heads=m.q_heads, num_key_value_heads=m.kv_heads, hidden_size=m.hidden,
                             head_dim=m.head_dim, intermediate_size=m.intermediate)
    return hf_hsap.CostModel.from_config(config, link, hardware)


@dataclass(frozen=True)
class TrafficConfig:
    """The grid of layouts (defaults: the spec's)."""

    dists: tuple[str, ...] = DISTRIBUTIONS
    Ts: tuple[int, ...] = (131072, 524288)
    Ps: tuple[int, ...] = (8, 32, 64)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    gpus_per_node: int = 8
    u_values: tuple[int, ...] = (2, 4, 8)
    planner_hardware: tuple[str, ...] = ("A100", "H100")  # the first one's plans fill the traffic tables


@dataclass
class LayoutResult:
    """Every scheme on one layout.

    Attributes:
        schemes: ``{shape key: {scheme name: SchemeStats}}``.
        plan_ms: cold planning time of each hf_hsap variant (ms, no cache).
        placement: the placement / round order each hf_hsap variant resolved to (``auto`` → its choice).
        hsap_by_hw: ``{(shape key, hardware): {hf_hsap variant: SchemeStats}}`` planned for the other
            hardware of ``TrafficConfig.planner_hardware`` (``schemes`` holds the first one's).
        recv_floor: lower bound of ``recv_max`` (ring-relative) of any placement within the 1.10 token
            cap that sends only KV: the holder of the last token of the longest document needs the rest.
    """

    dist: str
    T: int
    P: int
    seed: int
    n_docs: int
    max_doc: int
    recv_floor: float
    schemes: dict[str, dict[str, SchemeStats]] = field(default_factory=dict)
    plan_ms: dict[str, float] = field(default_factory=dict)
    placement: dict[str, str] = field(default_factory=dict)
    hsap_by_hw: dict[tuple[str, str], dict[str, SchemeStats]] = field(default_factory=dict)


def hsap_scheme(plan: hf_hsap.Plan, lengths: np.ndarray, shape: ModelShape, gpus_per_node: int,
                name: str) -> SchemeStats:
    """A plan as :class:`SchemeStats` (dK/dV counted in the model dtype, like every other scheme).

    Args:
        plan: offline plan (``plan_sequence(cu, P, ..., ulysses_size=U)``).
        lengths: ``[n_docs]`` the layout.
        shape: head shape for bytes; gpus_per_node: GPUs per node.
        name: scheme name.

    Returns:
        Counts over the plan's ``P`` GPUs.
    """
    return hsap_stats_from_plan(plan.stats(), shape, gpus_per_node, U=plan.ulysses_size, lengths=lengths, name=name)


def recv_floor(lengths: np.ndarray, P: int, token_slack: float = DEFAULT_TOKEN_SLACK) -> float:
    """Least ``recv_max`` (relative to ring) of any placement holding at most ``ceil(T/P)(1+slack)`` tokens
    per rank and moving only KV: the rank with the last token of the longest document needs all of the
    document's earlier tokens it does not hold.

    Args:
        lengths: ``[n_docs]`` document lengths; P: SP size; token_slack: the token cap's slack.

    Returns:
        The floor, a fraction of ``(P - 1) / P · T``.
    """
    T = int(np.sum(lengths))
    cap = np.ceil(T / P) * (1.0 + token_slack)
    return max(0.0, float(np.max(lengths)) - cap) / ((P - 1) / P * T) if P > 1 else 0.0


def _scheme_metrics(res: LayoutResult, name: str) -> dict[str, float] | None:
    """Metrics of one scheme on one layout (``None`` when the scheme does not exist at this ``P``)."""
    if name not in res.schemes[RECV_SHAPE]:
        return None
    s = res.schemes[RECV_SHAPE][name]
    ring_ref = (res.P - 1) / res.P * res.T
    tok, work, recv = (np.asarray(x, dtype=np.float64) for x in (s.tokens, s.work, s.recv_kv))
    m = {
        "recv_max": recv.max() / ring_ref, "recv_mean": recv.mean() / ring_ref,
        "work_max_mean": work.max() / work.mean(), "tok_max_mean": tok.max() / tok.mean(),
        "feasible": float(s.feasible), "correct": float(s.correct),
    }
    for key, sh in res.schemes.items():
        m[f"mb_intra_{key}"] = float(np.max(sh[name].bytes_intra)) / 1e6
        m[f"mb_inter_{key}"] = float(np.max(sh[name].bytes_inter)) / 1e6
    return m


def summarize_traffic(results: list[LayoutResult]) -> list[dict]:
    """Median over seeds of every metric, per (distribution, T, P, scheme).

    Args:
        results: from :func:`run_traffic`.

    Returns:
        Rows with ``dist, T, P, scheme, seeds, feasible_seeds, correct`` and the metrics of the module
        docstring; hf_hsap rows also carry ``placement`` (the choices, e.g. ``balanced×5``) and ``plan_ms``.
    """
    groups: dict[tuple, list[LayoutResult]] = {}
    for r in results:
        groups.setdefault((r.dist, r.T, r.P), []).append(r)
    rows = []
    for (dist, T, P), rs in groups.items():
        names = list(rs[0].schemes[RECV_SHAPE])
        for name in names:
            ms = [m for m in (_scheme_metrics(r, name) for r in rs) if m is not None]
            row = {"dist": dist, "T": T, "P": P, "scheme": name, "seeds": len(ms),
                   "feasible_seeds": int(sum(m["feasible"] for m in ms)), "correct": all(m["correct"] for m in ms)}
            for k in ms[0]:
                if k not in ("feasible", "correct"):
                    row[k] = float(np.median([m[k] for m in ms]))
            row["recv_max_worst"] = float(max(m["recv_max"] for m in ms))
            row["work_max_mean_worst"] = float(max(m["work_max_mean"] for m in ms))
            row["tok_max_mean_worst"] = float(max(m["tok_max_mean"] for m in ms))
            if name in rs[0].placement:
                picks = [r.placement[name] for r in rs]
                row["placement"] = ", ".join(f"{p}×{picks.count(p)}" for p in sorted(set(picks)))
                row["plan_ms"] = float(np.median([r.plan_ms[name] for r in rs]))
            row["recv_floor"] = float(np.median([r.recv_floor for r in rs]))
            rows.append(row)
    return rows


RECV_GOAL = {"longtail": 0.35, "mixed": 0.35, "sft": 0.05}


def traffic_goals(rows: list[dict], scheme: str = "hsap") -> list[dict]:
    """The balance / traffic goals for the default placement at ``T = 131072``, ``P`` ∈ {8, 32}.

    Goal: work max/mean ≤ 1.05, tokens max/mean ≤ 1.10, recv_max ≤ 0.35 (``longtail``, ``mixed``) or
    ≤ 0.05 (``sft``) of ring's. Judged on the median over seeds; the worst seed is reported beside it.

    Args:
        rows: from :func:`summarize_traffic`; scheme: which hf_hsap row to judge.

    Returns:
        One row per (distribution, P) with the values, the limits and ``met`` flags.
    """
    out = []
    for r in rows:
        if r["scheme"] != scheme or r["T"] != 131072 or r["P"] not in (8, 32) or r["dist"] not in RECV_GOAL:
            continue
        g = {"dist": r["dist"], "P": r["P"], "work": r["work_max_mean"], "work_worst": r["work_max_mean_worst"],
             "tok": r["tok_max_mean"], "tok_worst": r["tok_max_mean_worst"], "recv": r["recv_max"],
             "recv_worst": r["recv_max_worst"], "recv_goal": RECV_GOAL[r["dist"]], "recv_floor": r["recv_floor"]}
        g["work_met"] = g["work"] <= 1.05
        g["tok_met"] = g["tok"] <= 1.10
        g["recv_met"] = g["recv"] <= g["recv_goal"]
        g["met"] = g["work_met"] and g["tok_met"] and g["recv_met"]
        out.append(g)
    return out
