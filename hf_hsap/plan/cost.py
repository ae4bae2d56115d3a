"""The cost estimate that ``placement="auto"`` minimises.

Step time of a part (forward + backward of one layer), in units of one (query, key) pair of
attention work::

    t_r = token_cost * tokens_r + max(local_work_r, kv_token_cost * recv_r) + remote_work_r

* ``tokens_r``: tokens held; every other layer of the block (projections, MLP) costs per token.
* ``local_work_r``: pairs of queries against the part's own keys: run while the needed KV is in
  flight. ``remote_work_r``: pairs against received keys: wait for them.
* ``recv_r``: KV tokens received (forward KV, backward dK/dV travel back).
* ``overlap`` (1 by default): the share of the transfer the local work hides; below 1 the middle term
  becomes ``local + kv - overlap * min(local, kv)`` (CPU ranks sharing cores: 0, nothing hidden).
* ``diag_block`` (optional, 0 by default): a causal piece of ``n`` rows also computes ``n * min(n, b) / 2``
  masked pairs on its diagonal blocks; added to ``local_work_r`` and the work, it prices what splitting a
  document costs in the kernel (more, shorter causal pieces).
* With Ulysses inside the SP group (``U > 1``) every token's q, k, v and output (and their gradients)
  also cross the intra all-to-all, which nothing overlaps: :meth:`CostModel.for_ulysses` adds
  ``a2a_token_cost * (U - 1) / U`` to ``token_cost`` (a rank computes ``1 / U`` of its part's heads,
  so every term of a rank's time is its part's divided by ``U``).

Defaults (:meth:`CostModel.default`): Llama-3-8B shapes (32 q heads, 8 kv heads, head dim 128,
218 M parameters per layer) on A100 nodes with InfiniBand (25 GB/s per GPU, 80% reached) between
them; kernels at 55% (attention) and 70% (GEMM) of 312 TFLOP/s; fwd + bwd attention = 3.5x forward
FLOPs; K, V sent and dK, dV returned in bf16 (the runtime's default ``grad_comm_dtype``).
:meth:`CostModel.nvlink` is the same over NVLink (300 GB/s): what a plan uses when every SAP peer is
in one node (:func:`CostModel.for_link`). ``benchmarks/cost_model.py`` documents the same figures;
:meth:`CostModel.from_shapes` builds one for other models and links. GPU figures (peak, NVLink and
network bytes/s per GPU) come from the one table of :mod:`hf_hsap.hardware` (:data:`HARDWARE_LINKS`);
this package never queries a device: the process's GPU is :func:`hf_hsap.devices.detect_hardware`.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import numpy as np

from ..hardware import cost_model_kinds, gpu_kind
from .chain import part_steps, recurrent_layers
from .layout import Layout
from .placement import Placement, _zigzag_chunks, rows_work
from .transfers import Transfers
from .windows import Window, local_work_per_part, work_per_part


# (peak FLOP/s, NVLink B/s, network B/s) per GPU of every hardware key that can price a plan, read
# from the one table (hf_hsap.hardware.GPU_KINDS); read-only.
HARDWARE_LINKS: Mapping[str, tuple[float, float, float]] = MappingProxyType({
    k: (gpu_kind(k).peak_bf16_flops, gpu_kind(k).nvlink_bytes_per_s, gpu_kind(k).network_bytes_per_s)
    for k in cost_model_kinds()})


# Config fields of a recurrent layer's state width (gated delta rule / KDA, Mamba2, Mamba), first found wins.
_STATE_FIELDS = ("linear_key_head_dim", "mamba_d_state", "ssm_state_size", "state_size")


@dataclass(frozen=True)
class CostModel:
    """Relative costs in units of one attention pair (fwd + bwd).

    Args:
        token_cost: cost of one token through the non-attention parts of a layer.
        kv_token_cost: cost of receiving one KV token (and returning its gradient).
        round_cost: latency of one communication round (fwd + bwd), in pairs.
        a2a_token_cost: cost of one token's q, k, v and output and their gradients through a whole
            all-to-all (fwd + bwd, over NVLink); only plans with ``U > 1`` pay it (:meth:`for_ulysses`).
        diag_block: the kernel's key block on a causal piece: a part's causal piece of ``n`` rows of one
            document (its own tokens of it, one kernel call) also computes about ``n * min(n, diag_block) / 2``
            masked pairs on its diagonal blocks (:meth:`masked_pairs`); what splitting a document costs in
            the kernel. 0 (default): not priced. PyTorch's CPU flash attention walks keys in blocks of 512
            (``benchmarks/measured.run_kernel_shapes`` measures it: one call on a 512-row causal square reaches
            about half the throughput of a 4096-row one).
        overlap: the share of the KV transfer that the part's local work hides (1, default: a GPU's copy engines
            and links move KV while its SMs compute, ``max(local, kv)``; 0: every transferred byte costs the
            same processors the attention needs, ``local + kv``, as with gloo ranks sharing CPU cores).
        qkv_share: the share of ``token_cost`` in the query, key and value projections (Llama-3-8B: 0.115): their
            forward runs before the attention, their backward after it (where :func:`.simulation.simulated_time` puts a
            part's work between its attentions). Not in the one-layer formula.
        mixer_token_cost: cost of one token through all of a hybrid model's recurrent layers (linear attention,
            SSM, short convolutions); 0 (default): no such layers. A document split over parts runs its runs one
            hand-off step after the other (:mod:`.chain`), so these layers cost
            ``mixer_token_cost * sum over steps of the busiest part's tokens`` (:func:`mixer_time`).
        handoff_cost: latency and state bytes of one hand-off step's exchanges, summed over the recurrent layers
            (fwd + bwd); paid once per step after the first.
    """

    token_cost: float = 17930.0
    kv_token_cost: float = 1226.0
    round_cost: float = 120000.0
    a2a_token_cost: float = 511.0
    diag_block: float = 0.0
    overlap: float = 1.0
    qkv_share: float = 0.115
    mixer_token_cost: float = 0.0
    handoff_cost: float = 0.0

    def __post_init__(self) -> None:
        for name, what in (("overlap", "the share of a transfer that local work can hide"),
                           ("qkv_share", "the share of a token's cost in its q, k, v projections")):
            v = getattr(self, name)
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or not 0 <= v <= 1:
                raise ValueError(f"CostModel.{name} must lie in [0, 1] ({what}), got {v!r}")
        for name in ("token_cost", "kv_token_cost", "round_cost", "a2a_token_cost", "diag_block", "mixer_token_cost",
                     "handoff_cost"):
            v = getattr(self, name)
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"CostModel.{name} must be a finite number >= 0 (a cost in attention pairs), "
                                 f"got {v!r}; build one with CostModel.from_config(model.config, link, hardware) or "
                                 "CostModel.from_shapes(...)")

    @staticmethod
    def from_shapes(q_heads: int, kv_heads: int, head_dim: int, params_per_layer: float, link_bytes_per_s: float,
                    peak_flops: float, attn_eff: float = 0.55, gemm_eff: float = 0.70,
                    dtype_bytes: int = 2, grad_bytes: int = 2, alpha_s: float = 20e-6,
                    a2a_bytes_per_s: float | None = None, hidden_size: int | None = None, recurrent_layers: int = 0,
                    state_bytes: float = 0.0) -> "CostModel":
        """Cost model for a model shape, a link (per GPU, per direction, as reached), its latency per
        round ``alpha_s`` (paid in forward and backward), a GPU peak and the all-to-all's link inside a
        node (``a2a_bytes_per_s``, default ``link_bytes_per_s``); ``hidden_size`` (default ``q_heads * head_dim``)
        sizes the q, k, v projections' share of ``params_per_layer`` (``qkv_share``). A hybrid model's
        ``recurrent_layers`` (each a token's work like an attention layer's non-attention part) hand ``state_bytes``
        per split document and layer (``mixer_token_cost``, ``handoff_cost``)."""
        pair_s = 4 * head_dim * q_heads * 3.5 / (peak_flops * attn_eff)
        token_s = 6 * params_per_layer / (peak_flops * gemm_eff)
        kv_s = 2 * kv_heads * head_dim * (dtype_bytes + grad_bytes) / link_bytes_per_s
        # forward q, k, v, out; backward dout, dq, dk, dv, all in the activations' dtype (kv heads as given:
        # replication for a U that does not divide them is not counted)
        a2a_bw = link_bytes_per_s if a2a_bytes_per_s is None else a2a_bytes_per_s
        a2a_s = 2 * (2 * q_heads + 2 * kv_heads) * head_dim * dtype_bytes / a2a_bw
        qkv = (hidden_size or q_heads * head_dim) * head_dim * (q_heads + 2 * kv_heads)  # q, k, v projection weights
        handoff_s = 2 * recurrent_layers * (alpha_s + state_bytes / link_bytes_per_s)  # fwd states, bwd gradients
        return CostModel(token_cost=token_s / pair_s, kv_token_cost=kv_s / pair_s,
                         round_cost=2 * alpha_s / pair_s, a2a_token_cost=a2a_s / pair_s,
                         qkv_share=min(1.0, qkv / params_per_layer) if params_per_layer > 0 else 0.0,
                         mixer_token_cost=recurrent_layers * token_s / pair_s, handoff_cost=handoff_s / pair_s)

    @staticmethod
    def from_config(config: Any, link: str = "network", hardware: str = "A100") -> "CostModel":
        """Cost model for a Transformers model config on a GPU kind, with SAP's KV over a link.

        What the trainers use, so that ``auto`` weighs KV bytes against compute for the real model
        (Llama-2-7B moves 4x the KV bytes per pair of Llama-3-8B) and GPU (an H100 computes 3.2x
        faster than an A100 but its links are only 1.5-2x faster).

        Args:
            config: ``num_attention_heads``, ``hidden_size``, optional ``num_key_value_heads``,
                ``intermediate_size`` and ``head_dim``.
            link: ``"nvlink"`` or ``"network"`` (e.g. ``sp.sap_link``).
            hardware: a key of :data:`HARDWARE_LINKS` (``"A100"``, ``"H100"``, ...: peak, NVLink and
                per-GPU network bandwidth from :mod:`hf_hsap.hardware`); for this process's GPU pass
                :func:`hf_hsap.devices.detect_hardware` (the planner queries no device).

        Returns:
            The cost model.

        Raises:
            ValueError: an unknown hardware or link, or a config without positive head counts and
                hidden size.
        """
        if hardware not in HARDWARE_LINKS:
            raise ValueError(f"unknown hardware {hardware!r}; choose one of {', '.join(HARDWARE_LINKS)}")
        if link not in ("nvlink", "network"):
            raise ValueError(f"unknown link {link!r}; use 'nvlink' (one node) or 'network' (between nodes)")
        hq = int(config.num_attention_heads)
        hkv = int(getattr(config, "num_key_value_heads", None) or hq)
        hidden = int(config.hidden_size)
        if hq < 1 or hkv < 1 or hidden < 1:
            raise ValueError(f"the model config needs positive num_attention_heads, num_key_value_heads and "
                             f"hidden_size, got {hq}, {hkv}, {hidden}")
        d = int(getattr(config, "head_dim", None) or hidden // hq)
        ffn = int(getattr(config, "intermediate_size", None) or 4 * hidden)
        params = hidden * d * (2 * hq + 2 * hkv) + 3 * hidden * ffn
        peak, nvl, net = HARDWARE_LINKS[hardware]
        bw, alpha = (nvl, 10e-6) if link == "nvlink" else (net, 20e-6)
        mixers = recurrent_layers(getattr(config, "layer_types", None))
        d_state = next((int(v) for v in (getattr(config, k, None) for k in _STATE_FIELDS) if v), d)
        # a recurrent layer's state: about hidden_size x d_state float32 values (heads x d_k x d_v), whatever the family
        return CostModel.from_shapes(hq, hkv, d, params, bw * 0.8, peak, alpha_s=alpha, a2a_bytes_per_s=nvl * 0.8,
                                     hidden_size=hidden, recurrent_layers=mixers, state_bytes=4.0 * hidden * d_state)

    @staticmethod
    def default() -> "CostModel":
        """Llama-3-8B on A100, KV over InfiniBand (the module docstring)."""
        return CostModel()

    @staticmethod
    def nvlink() -> "CostModel":
        """Llama-3-8B on A100, KV over NVLink (300 GB/s per GPU, 80% reached)."""
        return CostModel(token_cost=17930.0, kv_token_cost=102.0, round_cost=60000.0)

    def time_of(self, tokens, work, local, recv):
        """The step time of a part (the module docstring's formula; the one place it is written).

        Args:
            tokens: tokens held. work: pairs of its queries. local: pairs against its own keys (they run
                while the KV is in flight). recv: KV tokens received. Scalars or ``[n_parts]`` arrays.

        Returns:
            ``token_cost * tokens + max(local, kv_token_cost * recv) + (work - local)``, elementwise; with
            ``overlap < 1`` the middle term is ``local + kv - overlap * min(local, kv)`` (``kv = kv_token_cost *
            recv``; at ``overlap = 1`` that is the max).
        """
        kv = self.kv_token_cost * recv
        scalar = isinstance(kv, (int, float)) and isinstance(local, (int, float))  # Python's max: 20x numpy's here
        hi, lo = (max, min) if scalar else (np.maximum, np.minimum)
        if self.overlap == 1:
            exposed = hi(local, kv)
        else:
            exposed = local + kv - self.overlap * lo(local, kv)
        return self.token_cost * tokens + exposed + (work - local)

    def masked_pairs(self, rows):
        """Masked pairs a causal piece of ``rows`` rows computes on its diagonal blocks (see ``diag_block``):
        ``rows * min(rows, diag_block) / 2``, elementwise (scalars or arrays)."""
        return rows * np.minimum(rows, self.diag_block) / 2

    def for_ulysses(self, ulysses_size: int) -> "CostModel":
        """This model for plans with Ulysses size ``U``: every token also pays its share of the all-to-all,
        ``token_cost + a2a_token_cost * (U - 1) / U`` (the model itself for ``U == 1``)."""
        if ulysses_size <= 1:
            return self
        extra = self.a2a_token_cost * (ulysses_size - 1) / ulysses_size
        return dataclasses.replace(self, token_cost=self.token_cost + extra)

    @staticmethod
    def for_link(link: str) -> "CostModel":
        """The default cost model for the link that carries SAP's KV: ``"nvlink"`` or ``"network"`` (one shared,
        frozen instance per link: a cached plan call builds none)."""
        if link not in _LINK_MODELS:
            raise ValueError(f"unknown link {link!r}; use 'nvlink' (one node) or 'network' (between nodes)")
        return _LINK_MODELS[link]


# CostModel.for_link's models, built once at import (read-only)
_LINK_MODELS: Mapping[str, CostModel] = MappingProxyType({"nvlink": CostModel.nvlink(), "network": CostModel.default()})


def part_times(layout: Layout, pl: Placement, tr: Transfers | None, cost: CostModel,
               window: Window = None) -> np.ndarray:
    """``[n_parts]`` estimated step time of every part for one layer of a mask kind (module docstring; a
    window counts only the pairs it keeps). ``tr``: the transfers of that kind; None on a full layer: the
    received KV read from the segments (:func:`part_recv`, the same figures without building transfers)."""
    work = work_per_part(layout, pl, window)
    local = local_work_per_part(layout, pl, window)
    if cost.diag_block:  # the masked pairs of every (part, document) causal piece run with the local work
        first, rows = pl.runs  # [pieces] own tokens of each
        masked = np.bincount(pl.part[first], weights=cost.masked_pairs(rows.astype(np.float64)),
                             minlength=pl.n_parts)
        work, local = work + masked, local + masked
    if tr is None:
        if window is not None:
            raise ValueError("a windowed layer is priced from its transfers (window_transfers)")
        recv = part_recv(layout, pl)
    else:
        recv = np.bincount(tr.dst, weights=tr.lengths, minlength=pl.n_parts)
    return cost.time_of(pl.tokens_per_part().astype(np.float64), work, local, recv)


def part_recv(layout: Layout, pl: Placement) -> np.ndarray:
    """``[n_parts]`` KV tokens every part receives on a full-attention layer, from the segments alone: in every
    document it holds, every key before the end of its last segment there but its own (:mod:`.transfers`'
    rule; equal to the received lengths of :func:`.transfers.compute_transfers`, as float64 sums of integers)."""
    first, own = pl.runs  # [runs] first segment; tokens of the run's document the part holds
    last = np.concatenate([first[1:], [pl.doc.shape[0]]]) - 1
    recv = pl.end[last] - layout.cu_seqlens[pl.doc[first]] - own  # every key before its last one, but its own
    return np.bincount(pl.part[first], weights=recv, minlength=pl.n_parts)


def balance_bound(layout: Layout, n_parts: int, cost: CostModel) -> float:
    """The compute lower bound of :func:`part_times`' slowest part on one *full-attention* layer over every
    placement: ``(token_cost * T + sum_d L_d (L_d + 1) / 2) / n_parts``, every part equally loaded and no
    communication (a part's time is at least ``token_cost * tokens + work``, and the slowest at least the mean;
    ``diag_block``'s masked pairs and ``overlap`` below 1 only add); what the placement sweep calls ``LB``. Not a
    bound of a windowed layer, which computes fewer pairs."""
    lengths = layout.doc_lengths
    return float(cost.token_cost * layout.total_tokens + (lengths * (lengths + 1) // 2).sum()) / n_parts


def contiguous_time_bound(layout: Layout, n_parts: int, cost: CostModel) -> float:
    """A lower bound of ``part_times(layout, contiguous(layout, n_parts), None, cost).max()`` without building it:
    the largest ``token_cost * tokens + work`` of a part (its time is at least that: the transfer term is at
    least the local work). Part ``p`` holds ``[p T // P, (p + 1) T // P)``; its pairs are the difference of the
    pairs of every row before its two ends (exact integers, as :meth:`.placement.Placement.work_per_part`)."""
    cu = layout.cu_seqlens
    ends = np.arange(n_parts + 1, dtype=np.int64) * layout.total_tokens // n_parts
    d = np.minimum(np.searchsorted(cu, ends, side="right") - 1, layout.n_docs - 1)  # the document of each end
    lengths = np.diff(cu)
    before = np.concatenate([[0], np.cumsum(lengths * (lengths + 1) // 2)])  # pairs of the documents before d
    x = ends - cu[d]  # rows of document d before the end (its length at T)
    pairs = before[d] + x * (x + 1) // 2
    return float((cost.token_cost * np.diff(ends) + np.diff(pairs)).max())


def zigzag_time_bound(layout: Layout, n_parts: int, cost: CostModel) -> float:
    """A lower bound of ``zigzag_part_times(layout, n_parts, cost).max()`` in O(documents): the mean over
    parts of ``token_cost * tokens + kv_token_cost * recv`` (a part's time is at least that), with every
    chunk of a document of length ``L`` between ``b = L // 2P`` and ``b + 1`` tokens, so part ``i``
    receives at least ``(2P - 2 - i) b - 1`` of its keys. What lets ``auto`` skip building zigzag's figures
    on rows of many documents, where its traffic is hopeless."""
    P = n_parts
    b = layout.doc_lengths // (2 * P)
    recv = np.maximum(0, b * (3 * P * P - 3 * P) // 2 - P).sum()  # sum over i of (2P - 2 - i) b - 1
    return float(cost.token_cost * layout.total_tokens + cost.kv_token_cost * recv) / P


def zigzag_part_times(layout: Layout, n_parts: int, cost: CostModel) -> np.ndarray:
    """``[n_parts]`` :func:`part_times` of ``zigzag(layout, n_parts)`` for one full-attention layer, without
    building it (its transfers grow as documents x parts squared: too many for a candidate that usually
    loses). Part ``i`` holds chunks ``i`` and ``j = 2P-1-i`` of every document and receives every key
    before the end of its last non-empty chunk but its own."""
    sizes, _ = _zigzag_chunks(layout.doc_lengths, n_parts)  # [n_docs, 2P]
    P = n_parts
    ends = np.cumsum(sizes, axis=1)  # [n_docs, 2P]
    starts = ends - sizes
    i, j = np.arange(P), 2 * P - 1 - np.arange(P)
    si, sj = sizes[:, i], sizes[:, j]  # [n_docs, P]
    work = (rows_work(starts[:, i], ends[:, i]) + rows_work(starts[:, j], ends[:, j])).sum(0)
    local = (si * (si + 1) // 2 + sj * (sj + 1) // 2 + si * sj).sum(0).astype(np.float64)
    masked = cost.masked_pairs((si + sj).astype(np.float64)).sum(0) if cost.diag_block else 0.0
    recv = np.where(sj > 0, starts[:, j] - si, np.where(si > 0, starts[:, i], 0)).sum(0)
    return cost.time_of((si + sj).sum(0).astype(np.float64), work.astype(np.float64) + masked, local + masked,
                        recv.astype(np.float64))


def step_time(layout: Layout, pl: Placement, transfers: Mapping[Window, Transfers | None],
              layers: Mapping[Window, int], cost: CostModel) -> float:
    """Estimated time of one step of a model's attention layers: for every mask kind, its layers times the
    slowest part's time of one such layer (each layer waits for its slowest part).

    Args:
        layout, pl: the documents and placement. transfers: the placement's transfers of every kind (None for
            the full kind: read from the segments, :func:`part_times`). layers: layers per kind. cost: the
            cost model.
    """
    attention = sum(n * part_times(layout, pl, transfers[w], cost, w).max() for w, n in layers.items())
    return float(attention + mixer_time(pl, cost))


def mixer_time(pl: Placement, cost: CostModel) -> float:
    """Estimated time of one step of a hybrid model's recurrent layers on a placement: each hand-off step waits for
    its busiest part (``cost.mixer_token_cost`` per token), and every step after the first for one exchange
    (``cost.handoff_cost``). 0 for a model without such layers."""
    if not (cost.mixer_token_cost or cost.handoff_cost):
        return 0.0
    steps = part_steps(pl.doc, pl.start, pl.part, pl.end - pl.start, pl.n_parts)  # [parts, steps]
    return float(cost.mixer_token_cost * steps.max(axis=0).sum() + cost.handoff_cost * (steps.shape[1] - 1))


def choose_placement(layout: Layout, candidates: Sequence[Placement],
                     transfers: Sequence[Transfers | Mapping[Window, Transfers]], cost: CostModel | None = None,
                     layers: Mapping[Window, int] | None = None) -> int:
    """Index of the candidate with the smallest estimated step time (first wins ties).

    Args:
        candidates: the placements. transfers: each one's transfers (of the full kind, or a mapping kind ->
            transfers). cost: the cost model. layers: layers per mask kind (default: one full layer).
    """
    cost = cost or CostModel.default()
    layers = layers or {None: 1}
    times = [step_time(layout, c, t if isinstance(t, Mapping) else {None: t}, layers, cost)
             for c, t in zip(candidates, transfers)]
    return int(np.argmin(times))
