"""Worker side of :mod:`benchmarks.suites.hybrid_step`: one training step (forward + backward, the model's own loss) of a
hybrid model (Qwen3.5's text model: gated-delta-rule layers beside full attention) and of a pure-attention model of
the same width, depth and heads (Qwen3), on one packed text row under HSAP SP (spawned gloo ranks):
``model(**shard_batch(batch, sp))`` for both, the same row and plan (the group's default cost model, which prices
attention only); and the same hybrid module once more on a plan priced for it (:data:`VARIANTS`,
:func:`plan_config`: ``shard_batch(batch, sp, config=HSAPConfig(sp_size=P, cost_model=CostModel.from_config(...)))``).

What a split document costs the hybrid is measured at the exchange: every rank runs all its runs at once and, when
any document is split, each recurrent token mixer (the short convolution and the delta rule are two) makes one
summary exchange per layer forward and one backward. :class:`StateMeter` wraps
:meth:`hf_hsap.mixers.handoff.StateExchange.exchange` and records, per call, the row size (which mixer's summaries),
the rows this rank sent, the bytes the SP group's :class:`~hf_hsap.comm.p2p.CommStats` counted as sent by it and the
seconds spent in it (forward: the summaries ``[B | A]``; backward: one gradient row per summary received).
:func:`state_formula` is what one summary row should be, from the config alone.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist

import hf_hsap
from hf_hsap.mixers import handoff
from hf_hsap.model_state import MIXERS, state_of
from hf_hsap.plan.cost import CostModel

from ..tensor_memory import TensorPeak

KINDS = ("hybrid", "attention")  # the models built
# variant -> (model kind, plan): "default" = the SP group's config (its cost model prices attention only), "priced" =
# plan_config's (the hybrid's recurrent layers priced too); "hybrid_priced" runs the very module of "hybrid"
VARIANTS = {"hybrid": ("hybrid", "default"), "attention": ("attention", "default"),
            "hybrid_priced": ("hybrid", "priced")}
LINK, HARDWARE = "network", "H100"  # what the priced plan's cost model assumes (explicit: no device is queried)
PHASES = ("forward", "backward")
_GROUPS: dict[int, Any] = {}


def model_config(kind: str, sizes: dict[str, Any], vocab: int) -> Any:
    """The Transformers config of one of :data:`KINDS` (no hub).

    Args:
        kind: ``"hybrid"`` (``Qwen3_5TextConfig``: ``layer_types`` from ``sizes["layer_types"]``) or
            ``"attention"`` (``Qwen3Config``: every layer full attention, the same hidden size, layers, heads, head
            dim and MLP).
        sizes: ``hidden_size``, ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``,
            ``head_dim``, ``layer_types`` and the ``linear_*`` fields of the hybrid's recurrent layers.
        vocab: the vocabulary.

    Returns:
        The config (float32, no cache, untied embeddings).
    """
    from transformers import Qwen3_5TextConfig, Qwen3Config

    shared = {k: sizes[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                    "num_key_value_heads", "head_dim")}
    layers = list(sizes["layer_types"])
    common = dict(vocab_size=vocab, num_hidden_layers=len(layers), max_position_embeddings=8192, use_cache=False,
                  tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2, **shared)
    if kind == "hybrid":
        linear = {k: v for k, v in sizes.items() if k.startswith("linear_")}
        return Qwen3_5TextConfig(layer_types=layers, **linear, **common)
    if kind == "attention":
        return Qwen3Config(layer_types=["full_attention"] * len(layers), **common)
    raise ValueError(f"unknown model kind {kind!r}; expected one of {KINDS}")


def priced_cost(config: Any) -> CostModel:
    """The cost model of the priced plan: ``CostModel.from_config(config, LINK, HARDWARE)`` (its recurrent layers,
    read from ``config.layer_types``, set ``mixer_token_cost`` and ``handoff_cost``)."""
    return CostModel.from_config(config, LINK, HARDWARE)


def plan_config(config: Any, sp_size: int, default: Any = None) -> hf_hsap.HSAPConfig:
    """The :class:`hf_hsap.HSAPConfig` of the priced plan: the SP size and :func:`priced_cost`, every other field
    at its default.

    Args:
        config: the hybrid's Transformers config; sp_size: P; default: the SP group's config (``sp.config``), which
            must plan alike but for the cost model (checked; None: :class:`hf_hsap.HSAPConfig`'s defaults).

    Raises:
        AssertionError: the group's config plans with another placement or other options.
    """
    priced = hf_hsap.HSAPConfig(sp_size=sp_size, cost_model=priced_cost(config))
    default = default or hf_hsap.HSAPConfig(sp_size=sp_size)
    assert (priced.placement, priced.plan_options()) == (default.placement, default.plan_options()), \
        f"the group plans with {default.placement!r} {default.plan_options()}"
    return priced


def state_formula(config: Any) -> dict[str, int]:
    """The bytes of one summary row of one recurrent layer, from the config (float32 activations and states).

    A row is a run's final state from zero ``B`` and its transition ``A``, flattened ``[B | A]`` (``A`` zero for a
    run that starts its document). Convolution: ``B`` the last ``k - 1`` inputs of the short convolution over
    ``C = 2 * H_k * D_k + H_v * D_v`` channels (``[1, C, k - 1]``), ``A`` a ``(k - 1) x (k - 1)`` shift matrix:
    ``(C * (k - 1) + (k - 1) ** 2) * 4`` bytes. Delta rule: ``B`` the ``[1, H_v, D_k, D_v]`` state (keys repeated to
    the value heads), ``A`` the ``[1, H_v, D_k, D_k]`` transition: ``(H_v * D_k * D_v + H_v * D_k * D_k) * 4`` bytes.

    Args:
        config: the hybrid's ``Qwen3_5TextConfig``.

    Returns:
        ``{"conv", "recurrent", "per_summary", "mixer_layers"}`` (bytes of a row of each, their sum, linear-attention
        layers).
    """
    c = config
    channels = 2 * c.linear_num_key_heads * c.linear_key_head_dim + c.linear_num_value_heads * c.linear_value_head_dim
    m = c.linear_conv_kernel_dim - 1
    conv = (channels * m + m * m) * 4
    h, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    rec = (h * dk * dv + h * dk * dk) * 4
    return {"conv": conv, "recurrent": rec, "per_summary": conv + rec,
            "mixer_layers": sum(t == "linear_attention" for t in c.layer_types)}


def build(config: Any, seed: int) -> torch.nn.Module:
    """The causal LM (``attn_implementation="hsap"``, float32, train mode; the same weights for the same seed)."""
    from transformers import AutoModelForCausalLM

    from hf_hsap.integrations import register

    register()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="hsap", dtype=torch.float32)
    return model.train()


def packed_row(lengths: list[int], vocab: int, seed: int, pad_to: int) -> dict[str, Any]:
    """Documents of random tokens with the given lengths in one packed row (:class:`hf_hsap.PackingCollator`).

    Args:
        lengths: tokens per document; vocab: the vocabulary (ids from 3: 0-2 are special); seed: the tokens;
        pad_to: the row length is rounded up to a multiple of this.

    Returns:
        The collator's global batch: ``input_ids``, ``labels``, ``position_ids`` ``[1, L]`` (positions restart at
        every document), ``cu_seq_lens_q`` ``[D + 1]``, ...
    """
    g = torch.Generator().manual_seed(seed)
    docs = [{"input_ids": torch.randint(3, vocab, (n,), generator=g)} for n in lengths]
    return hf_hsap.PackingCollator(sum(lengths), pad_to_multiple_of=pad_to)(docs)


class StateMeter:
    """Records every summary exchange of the recurrent layers while active (a wrapper of ``StateExchange.exchange``).

    Args:
        kinds: ``{row bytes: kind}``: which mixer a row of that size belongs to (e.g. ``{conv row: "conv",
            delta-rule row: "recurrent"}`` from :func:`state_formula`); a row of another size is ``"other"``.

    Attributes:
        phase: set by the caller to ``"forward"`` or ``"backward"`` (what the next exchanges belong to).
        calls: ``[{"phase", "kind", "row_bytes", "rows", "bytes", "seconds"}]``: per exchange, the row's kind and
            bytes, the rows this rank sent, the bytes its :class:`~hf_hsap.comm.p2p.CommStats` counted as sent during
            the call and the wall seconds spent in it (waiting for the other ranks included).
    """

    def __init__(self, kinds: dict[int, str]) -> None:
        self.kinds = dict(kinds)
        self.phase = "forward"
        self.calls: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def active(self) -> Iterator["StateMeter"]:
        """Wrap the exchange for the duration of the block (restored after)."""
        orig = handoff.StateExchange.exchange
        meter = self

        def exchange(ex: handoff.StateExchange, sends: list, recvs: list, like: torch.Tensor) -> dict:
            before, t0 = ex.executor.stats.bytes_sent, time.perf_counter()
            got = orig(ex, sends, recvs, like)
            seconds = time.perf_counter() - t0
            row = like.numel() * like.element_size()
            meter.calls.append({"phase": meter.phase, "kind": meter.kinds.get(row, "other"), "row_bytes": row,
                                "rows": len(sends), "bytes": ex.executor.stats.bytes_sent - before,
                                "seconds": seconds})
            return got

        handoff.StateExchange.exchange = exchange  # type: ignore[method-assign]
        try:
            yield self
        finally:
            handoff.StateExchange.exchange = orig  # type: ignore[method-assign]

    def summary(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{phase: {kind: {"rows", "bytes", "exchanges", "seconds"}}}`` over the recorded calls, for every kind of
        ``kinds`` (and ``"other"`` when a row matched none)."""
        kinds = [*dict.fromkeys(self.kinds.values())]
        kinds += ["other"] if any(c["kind"] == "other" for c in self.calls) else []
        out = {p: {k: {"rows": 0, "bytes": 0, "exchanges": 0, "seconds": 0.0} for k in kinds} for p in PHASES}
        for c in self.calls:
            s = out[c["phase"]][c["kind"]]
            s["rows"] += c["rows"]
            s["bytes"] += c["bytes"]
            s["exchanges"] += 1
            s["seconds"] += c["seconds"]
        return out

    def seconds(self) -> float:
        """Wall seconds spent in every recorded exchange."""
        return sum(c["seconds"] for c in self.calls)


def step(model: torch.nn.Module, local: dict[str, Any], sp: Any, meter: StateMeter | None = None) -> torch.Tensor:
    """Forward + backward of this rank's tokens; returns the global loss (summed over the SP group).

    Args:
        model: the model; local: ``shard_batch(batch, sp)``; sp: the SP group or ``1``; meter: told the phase.

    Returns:
        The loss (0-dim).
    """
    if meter is not None:
        meter.phase = "forward"
    loss = model(**local).loss  # this rank's summed CE / the global target count
    if meter is not None:
        meter.phase = "backward"
    loss.backward()
    total = loss.detach().clone()
    if getattr(sp, "size", 1) > 1:
        dist.all_reduce(total, group=sp.group)
    return total


def _comm_bytes(sp: Any) -> int:
    """Bytes the SP group's executors counted as sent from this rank (point-to-point and all-to-all)."""
    stats = getattr(sp, "comm_stats", None)
    return 0 if stats is None else int(stats.bytes_sent + stats.a2a_bytes_sent)


def chain_facts(model: torch.nn.Module) -> dict[str, Any]:
    """The summary exchange of the model's last forward (``None`` fields for a model without recurrent layers).

    Returns:
        ``{"summaries": summaries sent over the group per recurrent layer (``Chain.summaries``), "remote": whether
        any run continues one held by another rank (then each recurrent mixer exchanges once per layer and
        direction), "segments": this rank's runs, "continued": those of them that continue an earlier run}``.
    """
    ctx = state_of(model, MIXERS)
    chain = getattr(ctx, "chain", None)
    if chain is None:
        return {"summaries": None, "remote": None, "segments": None, "continued": None}
    return {"summaries": chain.summaries, "remote": chain.remote, "segments": len(chain.segments),
            "continued": sum(s.continued for s in chain.segments)}


def doc_placement(plan: Any, sp_size: int) -> dict[str, Any]:
    """Where the plan puts the row's documents.

    Returns:
        ``{"split_docs": documents whose tokens lie on more than one rank, "runs": [[(start, end), ...] per rank]
        (maximal runs of consecutive global tokens, over document boundaries too), "doc_ranks": {doc: [rank of
        each of its runs, in token order]} of the split documents}``.
    """
    cu = np.asarray(plan.layout.cu_seqlens, dtype=np.int64)
    pieces: list[tuple[int, int, int]] = []  # (global start, doc, rank) of every run of one document on one rank
    runs = []
    for r in range(sp_size):
        idx = plan.local_token_indices(r).numpy()
        parts = np.split(idx, np.flatnonzero(np.diff(idx) != 1) + 1) if idx.size else []
        runs.append([(int(x[0]), int(x[-1]) + 1) for x in parts])
        doc = np.searchsorted(cu, idx, side="right") - 1
        cut = np.flatnonzero(np.r_[True, (np.diff(idx) != 1) | (np.diff(doc) != 0)]) if idx.size else []
        pieces += [(int(idx[i]), int(doc[i]), r) for i in cut]
    doc_ranks: dict[int, list[int]] = {}
    for _, d, r in sorted(pieces):
        doc_ranks.setdefault(d, []).append(r)
    split = {d: rs for d, rs in doc_ranks.items() if len(set(rs)) > 1}
    return {"split_docs": len(split), "runs": runs, "doc_ranks": split}


def run_sp(cfg: dict[str, Any], sp_size: int, reps: int) -> dict[str, dict[str, Any]]:
    """Every variant of :data:`VARIANTS` at one SP size on this rank (collective over the SP group).

    First one step of each (the warm-up) with the state exchanges metered and the SP group's sent bytes counted;
    then the tensor peak of one step per variant (:class:`benchmarks.tensor_memory.TensorPeak`, untimed); then
    ``reps`` interleaved timed rounds of one step per variant (``reps = 0``: no timing). Each step shards the row
    anew (``shard_batch``, untimed).

    Args:
        cfg: :class:`benchmarks.suites.hybrid_step.HybridStepConfig` as a dict (``sizes``, ``layer_types``, ``vocab``,
            ``lengths``, ``pad_to``, ``seed``); sp_size: the SP size (the world); reps: timed rounds.

    Returns:
        ``{variant: {"loss", "tokens", "params", "peak_bytes", "at_peak", "comm_bytes", "states", "summaries",
        "remote", "segments", "continued", "split_docs", "runs", "doc_ranks", "formula", "cpu_s": [...],
        "wall_s": [...]}}`` (``states``: the :meth:`StateMeter.summary` of this rank).
    """
    torch.set_num_threads(1)
    if sp_size > 1 and sp_size not in _GROUPS:
        _GROUPS[sp_size] = hf_hsap.init_sequence_parallel(sp_size)
    sp = _GROUPS.get(sp_size, 1)
    batch = packed_row(list(cfg["lengths"]), cfg["vocab"], cfg["seed"], cfg["pad_to"])
    configs = {kind: model_config(kind, cfg["sizes"], cfg["vocab"]) for kind in KINDS}
    built = {kind: build(configs[kind], cfg["seed"]) for kind in KINDS}
    for model in built.values():
        hf_hsap.prepare_model(model, sp_size=sp_size)
    models, plans, out = {}, {}, {}
    for name, (kind, plan) in VARIANTS.items():
        models[name] = built[kind]  # the priced variant: the hybrid's own module (same weights, same loss)
        plans[name] = None if plan == "default" else plan_config(configs[kind], sp_size, getattr(sp, "config", None))
        out[name] = {"params": sum(p.numel() for p in models[name].parameters()),
                     "formula": state_formula(configs[kind]) if kind == "hybrid" else None}

    def shard(name: str) -> dict[str, Any]:
        return hf_hsap.shard_batch(batch, sp, config=plans[name])  # None: the group's config

    for name, model in models.items():
        f = out[name]["formula"]
        assert f is None or f["conv"] != f["recurrent"], "the two mixers' rows must differ in size to be told apart"
        meter = StateMeter({} if f is None else {f["conv"]: "conv", f["recurrent"]: "recurrent"})
        local = shard(name)
        before = _comm_bytes(sp)
        with meter.active():
            loss = float(step(model, local, sp, meter))
        model.zero_grad(set_to_none=True)
        assert math.isfinite(loss), f"{name}: loss {loss}"
        out[name].update(loss=loss, tokens=int(local["input_ids"].shape[1]), comm_bytes=_comm_bytes(sp) - before,
                         states=meter.summary(), **doc_placement(local["hsap_plan"], sp_size),
                         **chain_facts(model))
    for name, model in models.items():
        local = shard(name)
        with TensorPeak() as peak:
            step(model, local, sp)
        model.zero_grad(set_to_none=True)
        out[name]["peak_bytes"] = peak.peak_bytes
        out[name]["at_peak"] = [(n, op) for n, op in peak.at_peak[:4]]
        out[name].update(cpu_s=[], wall_s=[])
    for _ in range(reps):
        for name, model in models.items():
            local = shard(name)
            if sp_size > 1:
                dist.barrier()
            c0, w0 = time.process_time(), time.perf_counter()
            step(model, local, sp)
            out[name]["cpu_s"].append(time.process_time() - c0)
            out[name]["wall_s"].append(time.perf_counter() - w0)
            model.zero_grad(set_to_none=True)
    return out
