"""Alpha-beta cost model: fwd + bwd time and tokens/s/GPU (TGS) of a full layer stack, per scheme.

It turns the exact counts of :mod:`benchmarks.analytic.schemes` into time on the spec's hardware. GPU peaks,
link bandwidths and model shapes (:data:`HARDWARE`, :data:`MODELS`) are read from the project's one
table, :mod:`hf_hsap.hardware`, which the planner's ``CostModel.from_config`` reads too. Assumptions
(module constants; every one can be overridden from ``benchmarks/calibration.json``):

| constant            | default | meaning                                                                 |
| ------------------- | ------- | ----------------------------------------------------------------------- |
| `ATTN_EFFICIENCY`   | 0.55    | fraction of dense bf16 peak reached by the varlen attention kernel      |
| `GEMM_EFFICIENCY`   | 0.70    | fraction of peak reached by the linear layers (projections, MLP)        |
| `LINK_EFFICIENCY`   | 0.80    | fraction of the nominal per-direction link bandwidth NCCL reaches       |
| `ALPHA_INTRA_S`     | 10 µs   | latency of one communication round inside a node (NVLink)               |
| `ALPHA_INTER_S`     | 20 µs   | latency of one communication round between nodes (InfiniBand)           |
| `ATTN_BWD_FACTOR`   | 2.5     | attention backward FLOPs / forward FLOPs (flash: 5 matmuls vs 2)        |

FLOPs: attention forward ``4 · pairs · head_dim · q_heads`` (QKᵀ and PV; ``pairs`` head-normalised as
in ``SchemeStats.work``), backward ``2.5×`` that; linear layers ``6 · layer_linear_params`` per token
for fwd + bwd, ``layer_linear_params = hidden · head_dim · (2 q_heads + 2 kv_heads) + 3 · hidden · intermediate``.
Norms, rotary, softmax, embeddings, LM head, optimizer and gradient sync are not modelled: the figure
is the decoder layer stack. No activation recomputation.

Time of one transfer on one GPU: ``max(bytes_intra / (bw_intra · eff), bytes_inter / (bw_inter · eff))
+ rounds · alpha`` (NVLink and IB run concurrently; alpha is the inter-node one if any byte crosses
nodes). Overlap rules:

* all-to-all, all-gather, reduce-scatter (``overlap="none"``): fully exposed.
* KV ring (``SchemeStats.ring``): simulated by dataflow over the steps: the KV for step ``s + 1`` is
  sent at the start of step ``s`` and overlaps its compute; backward, the dK/dV accumulator is sent
  after each step and must arrive before the next step ends, plus a final hop home; one link carries
  one transfer at a time. Fully masked blocks are skipped (zero compute); no buffer back-pressure.
* hf_hsap's SAP rounds (``SchemeStats.rounds``): the runtime's own steps (:mod:`hf_hsap.plan.pipeline`,
  the list the runtime executes and the planner simulates): without a receive budget every round is
  posted at once (the link serves them in order) while the local item runs, then per round wait for
  its KV and run its remote items; backward, per round the remote items and this round's dK/dV sent
  back (the local item's backward hides round 0's return), every return collected at the end (with a
  budget: double-buffered fetches, a refetch in the backward, one return in flight). One ``batched``
  round reduces to ``max(local, transfer) + remote``.
* GEMMs never hide attention communication (a pessimistic choice, equal for every scheme).

Ranks synchronise every layer: a layer lasts as long as its slowest GPU; a step is ``layers`` layers.
Physical bound: ``layers · (6 · params · T + 14 · head_dim · q_heads · useful_pairs) / (GPUs · peak)``.

Calibration file schema (JSON object, every key optional)::

    {"attn_efficiency": 0.5, "gemm_efficiency": 0.7, "link_efficiency": 0.8,
     "alpha_intra_s": 1e-5, "alpha_inter_s": 2e-5,
     "hardware": {"H100": {"attn_efficiency": 0.6}},   # per-hardware overrides, by HardwareSpec.name
     "source": "where and how the numbers were measured"}
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import numpy as np

from hf_hsap.hardware import cost_model_kinds, gpu_kind
from hf_hsap.model_shape import MODEL_SHAPES, ModelShape
from hf_hsap.plan.pipeline import backward_steps, forward_steps, pipeline_shape, simulate_steps

from .schemes import CommPhase, RingPipeline, SchemeStats

ATTN_EFFICIENCY = 0.55
GEMM_EFFICIENCY = 0.70
LINK_EFFICIENCY = 0.80
ALPHA_INTRA_S = 10e-6
ALPHA_INTER_S = 20e-6
ATTN_BWD_FACTOR = 2.5
DEFAULT_CALIBRATION = Path(__file__).resolve().parents[1] / "calibration.json"


@dataclass(frozen=True)
class HardwareSpec:
    """One node type. Bandwidths in bytes/s per GPU per direction; ``peak_flops`` dense bf16."""

    name: str
    peak_flops: float
    intra_bw: float
    inter_bw: float
    gpus_per_node: int = 8

    @staticmethod
    def from_table(key: str, gpus_per_node: int = 8) -> "HardwareSpec":
        """Nodes of ``gpus_per_node`` GPUs of a kind of :mod:`hf_hsap.hardware` (one with link figures).

        Args:
            key: a :attr:`hf_hsap.hardware.GPUKind.key` (``"A100"``, ``"H100"``, ...).
            gpus_per_node: GPUs of one node.

        Returns:
            The spec, named ``key``.

        Raises:
            ValueError: an unknown key, or a kind without NVLink and network figures.
        """
        kind = gpu_kind(key)
        if not kind.has_links:
            raise ValueError(f"hardware {key!r} has no link figures in hf_hsap.hardware; "
                             f"use one of {', '.join(cost_model_kinds())}")
        return HardwareSpec(kind.key, kind.peak_bf16_flops, kind.nvlink_bytes_per_s, kind.network_bytes_per_s,
                            gpus_per_node)


@dataclass(frozen=True)
class CostAssumptions:
    """The tunable assumptions (see the module table)."""

    attn_efficiency: float = ATTN_EFFICIENCY
    gemm_efficiency: float = GEMM_EFFICIENCY
    link_efficiency: float = LINK_EFFICIENCY
    alpha_intra_s: float = ALPHA_INTRA_S
    alpha_inter_s: float = ALPHA_INTER_S
    attn_bwd_factor: float = ATTN_BWD_FACTOR


SPEC_HARDWARE = ("A100", "H100")  # the benchmark spec's 8-GPU nodes
# Both tables are read from hf_hsap.hardware (the one table of GPU and model figures); read-only.
MODELS: Mapping[str, ModelShape] = MODEL_SHAPES  # the spec's models (hf_hsap.model_shape's table)
HARDWARE: Mapping[str, HardwareSpec] = MappingProxyType({k: HardwareSpec.from_table(k) for k in SPEC_HARDWARE})


def load_assumptions(hardware: str | None = None, path: str | Path | None = DEFAULT_CALIBRATION) -> CostAssumptions:
    """Defaults overridden by the calibration file, if it exists.

    Args:
        hardware: ``HardwareSpec.name`` whose ``hardware`` overrides apply (after the global ones).
        path: calibration JSON; ``None`` or a missing file → the defaults.

    Returns:
        The assumptions.

    Raises:
        ValueError: unknown key, or an efficiency outside ``(0, 1]``.
    """
    a = CostAssumptions()
    if path is None or not Path(path).exists():
        return a
    data = json.loads(Path(path).read_text())
    known = {f.name for f in dataclasses.fields(CostAssumptions)}
    layers = [{k: v for k, v in data.items() if k not in ("hardware", "source")}]
    layers.append(data.get("hardware", {}).get(hardware, {}) if hardware else {})
    for over in layers:
        bad = set(over) - known
        if bad:
            raise ValueError(f"unknown calibration keys {sorted(bad)}; known: {sorted(known)}")
        a = dataclasses.replace(a, **{k: float(v) for k, v in over.items()})
    for k in ("attn_efficiency", "gemm_efficiency", "link_efficiency"):
        if not 0 < getattr(a, k) <= 1:
            raise ValueError(f"{k} must lie in (0, 1], got {getattr(a, k)}")
    return a


def _transfer_time(b_intra: np.ndarray, b_inter: np.ndarray, rounds: int, hw: HardwareSpec,
                   a: CostAssumptions) -> np.ndarray:
    """``[P]`` seconds of one transfer pattern (see the module docstring)."""
    t = np.maximum(b_intra / (hw.intra_bw * a.link_efficiency), b_inter / (hw.inter_bw * a.link_efficiency))
    alpha = np.where(b_inter > 0, a.alpha_inter_s, np.where(b_intra > 0, a.alpha_intra_s, 0.0))
    return t + rounds * alpha


def _ring_time(c: np.ndarray, ring: RingPipeline, backward: bool, hw: HardwareSpec, a: CostAssumptions) -> np.ndarray:
    """``[P]`` finish time of each GPU in a KV ring, by dataflow (no lock step).

    GPU ``g`` starts step ``s`` when it finished step ``s - 1`` and the KV of step ``s`` arrived. The KV
    used at step ``s`` is posted to the successor at the start of step ``s`` (once the successor has
    reached step ``s`` too); backward, the dK/dV accumulator is posted when step ``s`` finishes and is
    needed to finish step ``s + 1``. Transfers on one link run one after another.

    Args:
        c: ``[P, S]`` compute seconds per step.
        ring: the pipeline (bytes, predecessor, link kind).
        backward: include the dK/dV hops (and their final return to the owner).
    """
    P, S = c.shape
    prev = ring.prev
    bw = np.where(ring.inter, hw.inter_bw, hw.intra_bw) * a.link_efficiency
    alpha = np.where(ring.inter, a.alpha_inter_s, a.alpha_intra_s)
    tx = lambda b: np.where(b > 0, b / bw + alpha, 0.0)  # noqa: E731  [P] seconds of one hop
    start, finish, free = np.zeros(P), np.zeros(P), np.zeros(P)
    kv_arr, dkv_arr = np.zeros(P), np.zeros(P)
    for s in range(S):
        if s > 0:
            start = np.maximum(finish, kv_arr)
        kv_arr = np.maximum(np.maximum(start[prev], start), free) + tx(ring.kv_bytes[:, s])
        free = np.where(ring.kv_bytes[:, s] > 0, kv_arr, free)
        finish = start + c[:, s]
        if backward:
            if s > 0:
                finish = np.maximum(finish, dkv_arr)
            dkv_arr = np.maximum(np.maximum(finish[prev], finish), free) + tx(ring.dkv_bytes[:, s])
            free = np.where(ring.dkv_bytes[:, s] > 0, dkv_arr, free)
    return np.maximum(finish, dkv_arr) if backward else finish


def _rounds_time(s: SchemeStats, pair_s: float, hw: HardwareSpec, a: CostAssumptions) -> tuple[np.ndarray, np.ndarray]:
    """``[P]`` forward and backward attention time of hf_hsap's rounds: the runtime's own steps
    (:func:`hf_hsap.plan.pipeline.pipeline_shape`, ``forward_steps`` / ``backward_steps``) timed by
    :func:`~hf_hsap.plan.pipeline.simulate_steps`, as the planner does (``rs.refetch``: a receive budget)."""
    rs = s.rounds
    gp = rs.gpu_part
    first = np.unique(gp, return_index=True)[1]  # one GPU per part (the U GPUs of a part are alike)
    local = (s.hideable_work if s.hideable_work is not None else np.zeros(s.P))[first] * pair_s
    remote_work = (s.work[first] * pair_s - local)
    n = rs.work.shape[1]
    if n == 0:
        return (s.work * pair_s), a.attn_bwd_factor * s.work * pair_s
    xfer = np.where(rs.recv_intra + rs.recv_inter > 0, _transfer_time(rs.recv_intra, rs.recv_inter, 1, hw, a), 0.0)
    ret = np.where(rs.ret_intra + rs.ret_inter > 0, _transfer_time(rs.ret_intra, rs.ret_inter, 1, hw, a), 0.0)
    work = rs.work * pair_s
    # the round tables carry exactly the remote work: keep the two views consistent
    assert np.allclose(work.sum(1), remote_work, rtol=1e-6, atol=1e-12), "round work != work - local work"
    bwd = a.attn_bwd_factor
    shape = pipeline_shape(n, bounded=rs.refetch)
    fwd_t = simulate_steps(forward_steps(shape), local, xfer, work, rs.peers)
    bwd_t = simulate_steps(backward_steps(shape), bwd * local, xfer, bwd * work, rs.peers, ret)
    return fwd_t[gp], bwd_t[gp]


def _phase_time(phases: list[CommPhase], backward: bool, overlap: str, P: int, hw: HardwareSpec,
                a: CostAssumptions) -> np.ndarray:
    """``[P]`` summed seconds of the phases of one pass and one overlap kind."""
    out = np.zeros(P)
    for p in phases:
        if p.backward == backward and p.overlap == overlap:
            out += _transfer_time(p.bytes_intra, p.bytes_inter, p.rounds, hw, a)
    return out


def _resolve(model: ModelShape | str, hardware: HardwareSpec | str) -> tuple[ModelShape, HardwareSpec]:
    """Look names up in :data:`MODELS` / :data:`HARDWARE`."""
    return (MODELS[model] if isinstance(model, str) else model,
            HARDWARE[hardware] if isinstance(hardware, str) else hardware)


def bound(T: int, useful: int, model: ModelShape | str, hardware: HardwareSpec | str, gpus: int,
          attn_bwd_factor: float = ATTN_BWD_FACTOR) -> dict:
    """Physical bound: all FLOPs at peak on every GPU, communication fully hidden.

    Args:
        T: real tokens of the packed row (no padding).
        useful: document-masked causal pairs of the layout.
        model, hardware: specs or their keys in :data:`MODELS` / :data:`HARDWARE`.
        gpus: GPUs sharing the row.
        attn_bwd_factor: attention backward / forward FLOPs (as the assumptions in use).

    Returns:
        ``{"flops", "time_s", "tgs"}`` for fwd + bwd of the layer stack.
    """
    m, hw = _resolve(model, hardware)
    attn_per_pair = 2 * 2 * m.head_dim * m.q_heads * (1 + attn_bwd_factor)
    flops = m.layers * (6.0 * m.layer_linear_params * T + attn_per_pair * useful)
    time_s = flops / (gpus * hw.peak_flops)
    return {"flops": flops, "time_s": time_s, "tgs": T / (gpus * time_s)}


def predict(scheme_stats: SchemeStats, model: ModelShape | str, hardware: HardwareSpec | str, nodes: int,
            assumptions: CostAssumptions | None = None) -> dict:
    """Predicted fwd + bwd time of the layer stack and TGS of one scheme, beside the bound.

    Args:
        scheme_stats: counts built with ``P = nodes · gpus_per_node`` and this model's head shape.
        model, hardware: specs or their keys in :data:`MODELS` / :data:`HARDWARE`.
        nodes: number of nodes.
        assumptions: default :func:`load_assumptions` for this hardware.

    Returns:
        ``scheme, feasible, correct, P, time_s, tgs, bound_time_s, bound_tgs, fraction_of_bound``
        and ``layer`` (seconds of the slowest GPU: ``gemm, attn_fwd, attn_bwd, exposed_comm``).
        An infeasible scheme gets ``time_s = inf``, ``tgs = 0`` (``time_s_if_feasible`` keeps the number).

    Raises:
        ValueError: ``P`` or the head shape do not match.
    """
    m, hw = _resolve(model, hardware)
    a = assumptions if assumptions is not None else load_assumptions(hw.name)
    s = scheme_stats
    P = nodes * hw.gpus_per_node
    if s.P != P:
        raise ValueError(f"{s.name}: stats for P={s.P}, but {nodes} node(s) × {hw.gpus_per_node} = {P}")
    if s.gpus_per_node != hw.gpus_per_node:
        raise ValueError(f"{s.name}: stats for {s.gpus_per_node} GPUs per node, hardware has {hw.gpus_per_node}")
    if s.shape is not None and s.shape != m:
        raise ValueError(f"{s.name}: stats built for {s.shape}, model is {m}")
    pair_s = 4.0 * m.head_dim * m.q_heads / (hw.peak_flops * a.attn_efficiency)
    gemm = s.tokens * 6.0 * m.layer_linear_params / (hw.peak_flops * a.gemm_efficiency)
    c_fwd = s.work * pair_s
    bwd = a.attn_bwd_factor
    if s.ring is not None:
        c_steps = s.ring.step_work * pair_s
        attn_fwd = _ring_time(c_steps, s.ring, False, hw, a)
        attn_bwd = _ring_time(bwd * c_steps, s.ring, True, hw, a)
    elif s.rounds is not None:
        attn_fwd, attn_bwd = _rounds_time(s, pair_s, hw, a)
    else:
        hide = (s.hideable_work if s.hideable_work is not None else np.zeros(P)) * pair_s
        t_f = _phase_time(s.phases, False, "local", P, hw, a)
        t_b = _phase_time(s.phases, True, "local", P, hw, a)
        attn_fwd = np.maximum(hide, t_f) + (c_fwd - hide)
        attn_bwd = np.maximum(bwd * hide, t_b) + bwd * (c_fwd - hide)
    exposed = _phase_time(s.phases, False, "none", P, hw, a) + _phase_time(s.phases, True, "none", P, hw, a)
    per_gpu = gemm + attn_fwd + attn_bwd + exposed
    slow = int(np.argmax(per_gpu))
    time_s = m.layers * float(per_gpu[slow])
    b = bound(s.T, s.useful_pairs, m, hw, P, a.attn_bwd_factor)
    tgs = s.T / (P * time_s)
    return {
        "scheme": s.name, "feasible": s.feasible, "correct": s.correct, "P": P, "nodes": nodes,
        "model": m.name, "hardware": hw.name,
        "time_s": time_s if s.feasible else float("inf"), "tgs": tgs if s.feasible else 0.0,
        "time_s_if_feasible": time_s, "bound_time_s": b["time_s"], "bound_tgs": b["tgs"],
        "fraction_of_bound": (b["time_s"] / time_s) if s.feasible else 0.0,
        "layer": {"gemm": float(gemm[slow]), "attn_fwd": float(attn_fwd[slow]),
                  "attn_bwd": float(attn_bwd[slow]), "exposed_comm": float(exposed[slow])},
    }


def predict_all(stats: dict[str, SchemeStats], model: ModelShape | str, hardware: HardwareSpec | str, nodes: int,
                assumptions: CostAssumptions | None = None) -> list[dict]:
    """:func:`predict` for every scheme, side by side, plus a ``bound`` row.

    Args:
        stats: ``{name: SchemeStats}`` (e.g. from :func:`benchmarks.analytic.schemes.all_schemes`), all of one layout.
        model, hardware, nodes, assumptions: as :func:`predict`.

    Returns:
        One dict per scheme, then ``{"scheme": "bound", "time_s", "tgs", ...}``.
    """
    m, hw = _resolve(model, hardware)
    a = assumptions if assumptions is not None else load_assumptions(hw.name)
    rows = [predict(s, m, hw, nodes, a) for s in stats.values()]
    first = next(iter(stats.values()))
    b = bound(first.T, first.useful_pairs, m, hw, nodes * hw.gpus_per_node, a.attn_bwd_factor)
    rows.append({"scheme": "bound", "feasible": True, "correct": True, "P": first.P, "nodes": nodes,
                 "model": m.name, "hardware": hw.name, "time_s": b["time_s"], "tgs": b["tgs"],
                 "bound_time_s": b["time_s"], "bound_tgs": b["tgs"], "fraction_of_bound": 1.0})
    return rows
