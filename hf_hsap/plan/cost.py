"""The cost that ``placement="auto"`` minimises: a part's step time (fwd + bwd of one layer) in attention pairs::

    t_r = token_cost * tokens_r + max(local_work_r, kv_token_cost * recv_r) + remote_work_r  [+ encoder_r]

Tokens pay the projections and MLP; pairs against the part's own keys run while the received KV (``recv_r`` tokens)
is in flight, pairs against received keys wait for it. :class:`CostModel` adds partial overlap, masked diagonal
blocks, Ulysses' all-to-all and recurrent layers. A vision-language batch adds each part's encoder work
``encoder_r = token_cost x patches x patch_work`` of the items it encodes (:func:`step_time`): ``patch_work`` is one
patch through the tower (fwd + bwd) in decoder tokens, the tower's parameters per patch over the decoder's (all its
layers) by the FLOP accounting of :meth:`CostModel.from_shapes` (``6 x params`` per token), so over the layers the
encoder weighs its share of the step (:func:`.items.encoder_patch_work`: stated from the shapes, not tuned). Defaults: Llama-3-8B on A100 nodes, KV over
InfiniBand; :meth:`CostModel.from_config` prices other models and GPUs from :mod:`hf_hsap.hardware` (assumptions:
``benchmarks/analytic/cost_model.py``). The planner never queries a device.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from ..hardware import cost_model_kinds, gpu_kind
from .chain import part_mixer_tokens, recurrent_layers
from .items import layer_params
from .layout import Layout
from .placement import Placement, _zigzag_chunks, rows_work
from .transfers import Transfers
from .windows import Window, local_work_per_part, work_per_part


# (peak FLOP/s, NVLink B/s, network B/s) per GPU of every hardware key that can price a plan; read-only.
HARDWARE_LINKS: Mapping[str, tuple[float, float, float]] = MappingProxyType({
    k: (gpu_kind(k).peak_bf16_flops, gpu_kind(k).nvlink_bytes_per_s, gpu_kind(k).network_bytes_per_s)
    for k in cost_model_kinds()})


# Config fields of a recurrent layer's state width (gated delta rule / KDA, Mamba2, Mamba), first found wins.
_STATE_FIELDS = ("linear_key_head_dim", "mamba_d_state", "ssm_state_size", "state_size")


@dataclass(frozen=True)
class CostModel:
    """Relative costs in units of one attention pair (fwd + bwd).

    Args:
        token_cost: one token through the non-attention parts of a layer.
        kv_token_cost: receiving one KV token (and returning its gradient).
        round_cost: latency of one communication round (fwd + bwd).
        a2a_token_cost: one token's q, k, v, output and gradients through Ulysses' all-to-all, which nothing
            overlaps; paid by plans with ``U > 1`` only (:meth:`for_ulysses`).
        diag_block: the kernel's key block: a causal piece of ``n`` rows also computes ``n * min(n, diag_block) / 2``
            masked pairs (:meth:`masked_pairs`), the kernel's price of splitting a document; 0: not priced.
        overlap: the share of the KV transfer the local work hides: 1 (GPU copy engines) gives ``max(local, kv)``,
            0 (CPU ranks sharing cores) ``local + kv``.
        qkv_share: the share of ``token_cost`` in the q, k, v projections, which :mod:`.simulation` places around
            the attention; not in the one-layer formula.
        mixer_token_cost: one token through all of a hybrid model's recurrent layers (0: none); a token of a run
            that continues a split document pays it twice (the summarising call, :func:`mixer_time`).
        handoff_cost: latency and summary bytes of the one summary exchange a split document adds to each
            recurrent layer (fwd + bwd), however many parts it spans.
        mixer_a2a_token_cost: one token's inputs and output of every recurrent layer through the heads all-to-all
            (fwd + bwd); 0: that mode is not offered (a group over several nodes: an all-to-all stays inside a node,
            as Ulysses does). :func:`mixer_time` prices the cheaper of the two modes, :func:`recurrent_mode` names it.
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
    mixer_a2a_token_cost: float = 0.0

    def __post_init__(self) -> None:
        for name, what in (("overlap", "the share of a transfer that local work can hide"),
                           ("qkv_share", "the share of a token's cost in its q, k, v projections")):
            v = getattr(self, name)
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or not 0 <= v <= 1:
                raise ValueError(f"CostModel.{name} must lie in [0, 1] ({what}), got {v!r}")
        for name in ("token_cost", "kv_token_cost", "round_cost", "a2a_token_cost", "diag_block", "mixer_token_cost",
                     "handoff_cost", "mixer_a2a_token_cost"):
            v = getattr(self, name)
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ValueError(f"CostModel.{name} must be a finite number >= 0 (a cost in attention pairs), "
                                 f"got {v!r}; build one with CostModel.from_config(model.config, link, hardware) or "
                                 "CostModel.from_shapes(...)")

    @staticmethod
    def from_shapes(q_heads: int, kv_heads: int, head_dim: int, params_per_layer: float, link_bytes_per_s: float,
                    peak_flops: float, *, attn_eff: float = 0.55, gemm_eff: float = 0.70, dtype_bytes: int = 2,
                    grad_bytes: int = 2, alpha_s: float = 20e-6, a2a_bytes_per_s: float | None = None,
                    hidden_size: int | None = None, recurrent_layers: int = 0, state_bytes: float = 0.0,
                    mixer_heads: bool = False) -> "CostModel":
        """Cost model for a model shape on a GPU and a link.

        Args:
            link_bytes_per_s: per GPU and direction, as reached. alpha_s: latency of one round (paid fwd and bwd).
            a2a_bytes_per_s: the all-to-all's link inside a node (default ``link_bytes_per_s``).
            hidden_size: sizes the q, k, v projections' share of ``params_per_layer`` (default ``q_heads *
                head_dim``). recurrent_layers, state_bytes: a hybrid model's recurrent layers and the summary bytes
                (final state and transition) each sends per split document. mixer_heads: whether the recurrent
                layers may run the heads all-to-all (the group inside one node), priced at the all-to-all's link as
                an attention layer's q, k, v and output.
        """
        pair_s = 4 * head_dim * q_heads * 3.5 / (peak_flops * attn_eff)
        token_s = 6 * params_per_layer / (peak_flops * gemm_eff)
        kv_s = 2 * kv_heads * head_dim * (dtype_bytes + grad_bytes) / link_bytes_per_s
        # forward q, k, v, out; backward dout, dq, dk, dv, in the activations' dtype (no kv-head replication)
        a2a_bw = link_bytes_per_s if a2a_bytes_per_s is None else a2a_bytes_per_s
        a2a_s = 2 * (2 * q_heads + 2 * kv_heads) * head_dim * dtype_bytes / a2a_bw
        qkv = (hidden_size or q_heads * head_dim) * head_dim * (q_heads + 2 * kv_heads)  # q, k, v projection weights
        # one exchange per layer and direction: summaries forward, their gradients backward
        handoff_s = 2 * recurrent_layers * (alpha_s + state_bytes / link_bytes_per_s)
        return CostModel(token_cost=token_s / pair_s, kv_token_cost=kv_s / pair_s,
                         round_cost=2 * alpha_s / pair_s, a2a_token_cost=a2a_s / pair_s,
                         qkv_share=min(1.0, qkv / params_per_layer) if params_per_layer > 0 else 0.0,
                         mixer_token_cost=recurrent_layers * token_s / pair_s, handoff_cost=handoff_s / pair_s,
                         mixer_a2a_token_cost=recurrent_layers * a2a_s / pair_s if mixer_heads else 0.0)

    @staticmethod
    def from_config(config: Any, link: str = "network", hardware: str = "A100") -> "CostModel":
        """Cost model for a Transformers model config on a GPU kind, with SAP's KV over a link: what the trainers
        use, so that ``auto`` weighs KV bytes against compute for the real model and GPU.

        Args:
            config: ``num_attention_heads``, ``hidden_size``, optional ``num_key_value_heads``,
                ``intermediate_size``, ``head_dim`` and ``layer_types``.
            link: ``"nvlink"`` or ``"network"`` (e.g. ``sp.sap_link``).
            hardware: a key of :data:`HARDWARE_LINKS`; this process's GPU is :func:`hf_hsap.devices.detect_hardware`.

        Raises:
            ValueError: an unknown hardware or link, or a config without positive head counts and hidden size.
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
        params = layer_params(hidden, hq, hkv, d, ffn)
        peak, nvl, net = HARDWARE_LINKS[hardware]
        bw, alpha = (nvl, 10e-6) if link == "nvlink" else (net, 20e-6)
        mixers = recurrent_layers(getattr(config, "layer_types", None))
        d_state = next((int(v) for v in (getattr(config, k, None) for k in _STATE_FIELDS) if v), d)
        # a recurrent layer's summary: about hidden_size x d_state float32 values (heads x d_k x d_v) of state, as
        # many again of transition (the delta rule's d_k x d_k per head; a decay for the scans), whatever the family
        return CostModel.from_shapes(hq, hkv, d, params, bw * 0.8, peak, alpha_s=alpha, a2a_bytes_per_s=nvl * 0.8,
                                     hidden_size=hidden, recurrent_layers=mixers, state_bytes=8.0 * hidden * d_state,
                                     mixer_heads=link == "nvlink")

    @staticmethod
    def default() -> "CostModel":
        """Llama-3-8B on A100, KV over InfiniBand."""
        return CostModel()

    @staticmethod
    def nvlink() -> "CostModel":
        """Llama-3-8B on A100, KV over NVLink (every SAP peer in one node)."""
        return CostModel(token_cost=17930.0, kv_token_cost=102.0, round_cost=60000.0)

    def time_of(self, tokens, work, local, recv):
        """The step time of a part: the module docstring's formula, the one place it is written.

        Args:
            tokens (float | np.ndarray): tokens held (a scalar or ``[n_parts]``, as every argument).
            work (float | np.ndarray): pairs of its queries.
            local (float | np.ndarray): pairs against its own keys.
            recv (float | np.ndarray): KV tokens received.

        Returns:
            time (float | np.ndarray): ``token_cost * tokens + max(local, kv) + (work - local)`` elementwise,
                ``kv = kv_token_cost * recv``; with ``overlap < 1`` the middle term is
                ``local + kv - overlap * min(local, kv)``.
        """
        kv = self.kv_token_cost * recv
        scalar = isinstance(kv, (int, float)) and isinstance(local, (int, float))  # Python's max: faster on scalars
        hi, lo = (max, min) if scalar else (np.maximum, np.minimum)
        if self.overlap == 1:
            exposed = hi(local, kv)
        else:
            exposed = local + kv - self.overlap * lo(local, kv)
        return self.token_cost * tokens + exposed + (work - local)

    def masked_pairs(self, rows):
        """Masked pairs a causal piece of ``rows`` rows computes on its diagonal blocks, elementwise."""
        return rows * np.minimum(rows, self.diag_block) / 2

    def for_ulysses(self, ulysses_size: int) -> "CostModel":
        """This model for Ulysses size ``U``: every token also pays ``a2a_token_cost * (U - 1) / U`` (a rank
        computes ``1 / U`` of its part's heads, so every term is its part's divided by ``U``)."""
        if ulysses_size <= 1:
            return self
        extra = self.a2a_token_cost * (ulysses_size - 1) / ulysses_size
        return dataclasses.replace(self, token_cost=self.token_cost + extra)

    @staticmethod
    def for_link(link: str) -> "CostModel":
        """The default model for the link that carries SAP's KV, ``"nvlink"`` or ``"network"`` (a shared frozen
        instance: a cached plan call builds none)."""
        if link not in _LINK_MODELS:
            raise ValueError(f"unknown link {link!r}; use 'nvlink' (one node) or 'network' (between nodes)")
        return _LINK_MODELS[link]


# CostModel.for_link's models, built once at import (read-only)
_LINK_MODELS: Mapping[str, CostModel] = MappingProxyType({"nvlink": CostModel.nvlink(), "network": CostModel.default()})


def part_times(layout: Layout, pl: Placement, tr: Transfers | None, cost: CostModel,
               window: Window = None) -> np.ndarray:
    """``[n_parts]`` estimated step time of every part for one layer of a mask kind.

    Args:
        layout, pl: the documents and placement. tr: the transfers of that kind; None on a full layer (the
            received KV is read from the segments, :func:`part_recv`). cost: the model. window: the kind.
    """
    work = work_per_part(layout, pl, window)
    local = local_work_per_part(layout, pl, window)
    if cost.diag_block:  # the masked pairs of every (part, document) causal piece run with the local work
        first, rows = pl.runs  # [pieces] own tokens of each
        masked = np.bincount(pl.part[first], weights=cost.masked_pairs(rows.astype(np.float64)), minlength=pl.n_parts)
        work, local = work + masked, local + masked
    if tr is None:
        if window is not None:
            raise ValueError("a windowed layer is priced from its transfers (window_transfers)")
        recv = part_recv(layout, pl)
    else:
        recv = np.bincount(tr.dst, weights=tr.lengths, minlength=pl.n_parts)
    return cost.time_of(pl.tokens_per_part().astype(np.float64), work, local, recv)


def part_recv(layout: Layout, pl: Placement) -> np.ndarray:
    """``[n_parts]`` KV tokens every part receives on a full-attention layer, without building transfers: in every
    document it holds, every key before the end of its last segment there but its own."""
    first, own = pl.runs  # [runs] first segment; tokens of the run's document the part holds
    last = np.concatenate([first[1:], [pl.doc.shape[0]]]) - 1
    recv = pl.end[last] - layout.cu_seqlens[pl.doc[first]] - own  # every key before its last one, but its own
    return np.bincount(pl.part[first], weights=recv, minlength=pl.n_parts)


def balance_bound(layout: Layout, n_parts: int, cost: CostModel) -> float:
    """A lower bound of the slowest part's time on one full-attention layer over every placement (``LB``): every
    part equally loaded, no communication, ``(token_cost * T + sum_d L_d (L_d + 1) / 2) / n_parts``."""
    lengths = layout.doc_lengths
    return float(cost.token_cost * layout.total_tokens + (lengths * (lengths + 1) // 2).sum()) / n_parts


def zigzag_time_bound(layout: Layout, n_parts: int, cost: CostModel) -> float:
    """A lower bound of :func:`zigzag_part_times`' maximum in O(documents), so ``auto`` can skip zigzag on rows of
    many documents: the parts' mean ``token_cost * tokens + kv_token_cost * recv``, part ``i`` receiving at least
    ``(2P - 2 - i) b - 1`` keys of a document of ``L`` tokens (chunks of at least ``b = L // 2P``)."""
    P = n_parts
    b = layout.doc_lengths // (2 * P)
    recv = np.maximum(0, b * (3 * P * P - 3 * P) // 2 - P).sum()  # sum over i of (2P - 2 - i) b - 1
    return float(cost.token_cost * layout.total_tokens + cost.kv_token_cost * recv) / P


def zigzag_part_times(layout: Layout, n_parts: int, cost: CostModel) -> np.ndarray:
    """``[n_parts]`` :func:`part_times` of ``zigzag(layout, n_parts)`` on one full layer without building it (its
    transfers grow as documents x parts squared). Part ``i`` holds chunks ``i`` and ``2P-1-i`` of every document."""
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
              layers: Mapping[Window, int], cost: CostModel, *, encoder: np.ndarray | None = None) -> float:
    """Estimated time of one step of a model's layers: per mask kind, its layers times the slowest part's time
    (each layer waits for its slowest part), plus :func:`mixer_time`. With ``encoder``, every layer's part time
    carries the part's vision encoder work per layer, so a part that encodes more should hold less decoder work
    (:mod:`.items`); on one mask kind that is the busiest part's ``encoder + decoder`` time.

    Args:
        layout, pl: the documents and placement. transfers: per kind (None for the full kind, read from the
            segments). layers: layers per kind. cost: the model.
        encoder: ``[n_parts]`` encoder time per decoder layer (pairs: ``token_cost`` x the decoder tokens' worth
            of the items each part encodes, :mod:`.items`), or None (none).
    """
    extra = 0.0 if encoder is None else encoder
    attention = sum(n * (part_times(layout, pl, transfers[w], cost, w) + extra).max() for w, n in layers.items())
    return float(attention + mixer_time(pl, cost))


def _summaries_time(pl: Placement, cost: CostModel) -> tuple[float, bool, float]:
    """``(time of the summaries mode, whether a document is split, the placement's tokens)``."""
    tokens, continued, remote = part_mixer_tokens(pl.doc, pl.start, pl.part, pl.end - pl.start, pl.n_parts)
    return (float(cost.mixer_token_cost * (tokens + continued).max() + cost.handoff_cost * remote), remote,
            float(tokens.sum()))


def _heads_time(cost: CostModel, tokens: float, parts: int) -> float:
    """Time of the heads mode: every part runs the whole row for its share of the heads, ``T / P`` tokens of mixer
    work, and sends every token's inputs and output through the all-to-all."""
    return (cost.mixer_token_cost + cost.mixer_a2a_token_cost) * tokens / parts


def mixer_time(pl: Placement, cost: CostModel) -> float:
    """Estimated time of one step of a hybrid model's recurrent layers, in the mode :func:`recurrent_mode` picks;
    0 without such layers.

    Summaries (:mod:`hf_hsap.mixers.handoff`): every part runs all its runs at once; the layers wait for the
    busiest part, whose tokens cost ``mixer_token_cost`` each and twice in runs that continue a split document
    (the summarising call and the run itself: the delta rule's call from the state ``I``, then its kernel from the
    true state; the scans' closed-form correction), and,
    when any document is split, for one summary exchange (``handoff_cost``), whatever the number of parts it spans.
    Heads (offered when ``mixer_a2a_token_cost > 0``): ``T / P`` tokens of mixer work and ``T / P`` tokens through
    the all-to-all per part.
    """
    if not (cost.mixer_token_cost or cost.handoff_cost):
        return 0.0
    summaries, remote, tokens = _summaries_time(pl, cost)
    if remote and cost.mixer_a2a_token_cost:
        return min(summaries, _heads_time(cost, tokens, pl.n_parts))
    return summaries


def recurrent_mode(pl: Placement, cost: CostModel) -> str:
    """How a hybrid's recurrent layers run a placement's split documents, the cheaper by :func:`mixer_time`:
    ``"heads"`` or ``"summaries"`` (also when no document is split: nothing crosses ranks, or when the heads mode is
    not offered)."""
    if not cost.mixer_token_cost or not cost.mixer_a2a_token_cost:
        return "summaries"
    summaries, remote, tokens = _summaries_time(pl, cost)
    return "heads" if remote and _heads_time(cost, tokens, pl.n_parts) < summaries else "summaries"
