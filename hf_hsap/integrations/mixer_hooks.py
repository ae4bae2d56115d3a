"""Hybrid models: their linear-attention, state-space and short-convolution layers exact on packed rows and under SP.

Transformers runs these layers' recurrent kernels through its kernel hooks: each layer instance holds a private
wrapper of every kernel function it calls (``use_kernelized_func``, from the ``kernels`` package), whose
``forward`` ``kernelize`` replaces per instance. :func:`prepare_mixers` (called by ``prepare_model``) replaces it
the same way with :mod:`hf_hsap.mixers.ops`' document-cut versions, bound to a :class:`MixerContext` of the model: a
forward pre-hook on the model records the batch's layout (``shard_batch``'s plan, else ``position_ids`` /
``cu_seq_lens_q``) as a :class:`~hf_hsap.plan.chain.Chain` that every layer of that forward (and its
recomputation under gradient checkpointing) runs by, and, when the batch splits a document over ranks, how: the
summary exchange (:mod:`hf_hsap.mixers.handoff`) or the heads all-to-all (:mod:`hf_hsap.mixers.heads`, for the
kernels whose heads divide the group), as the SP group's ``HSAPConfig.recurrent_mode`` says (``"auto"``: the plan's
cost model, :func:`hf_hsap.plan.cost.recurrent_mode`). A batch of one document per row, without SP, runs the
kernels unchanged (generation, plain batches). A layer with no kernel hook (MiniMax's lightning attention,
:data:`~hf_hsap.mixers.ops.LAYER_OPS`) gets its own ``forward`` replaced per instance, as ``kernelize`` does for
decorated layers, each segment running the layer's original forward. No model source is edited and no class is
patched.

:data:`~.mixer_families.MIXER_FAMILIES` lists the families whose every recurrent layer goes through these hooks, each
checked against its documents run alone (``python scripts/model_zoo.py``, ``tests/model/test_zoo.py``).
"""
from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from ..log import get_logger
from ..mixers.handoff import StateExchange
from ..mixers.heads import HeadsRoute, heads_fit, heads_route, run_heads
from ..mixers.heads_specs import HEADS_SPECS
from ..mixers.layers import mixer_layers
from ..mixers.ops import LAYER_OPS, OPS
from ..mixers.ple import METHOD_OPS
from ..model_state import MIXERS, MIXERS_READY, ModelChanges, state_of
from ..plan.chain import Chain, document_chain, state_chain
from ..plan.cost import recurrent_mode
from ..data.positions import document_starts
from .plan_use import PLAN_USE_KEY, plan_use_of
from .sharding import text_positions

logger = get_logger(__name__)

__all__ = ["MixerContext", "layout_chain", "prepare_mixers"]


class MixerContext:
    """What the prepared layers of one model read in the forward in flight.

    Attributes:
        chain: the batch's segments (``None``: one document per row and no SP; the kernels run unchanged).
        exchange: the SP group's summary exchange (``None`` at SP 1).
        heads: the route of the heads all-to-all mode when the batch runs its split documents that way
            (``HSAPConfig.recurrent_mode``), else ``None``.
        use: the batch's plan-use record (``hsap_plan_use``), which every prepared layer fills.
        layers: the prepared layers.
    """

    def __init__(self, layers: list[torch.nn.Module], config: Any) -> None:
        self.chain: Chain | None = None
        self.exchange: StateExchange | None = None
        self.heads: HeadsRoute | None = None
        self.use: Any = None
        self.layers = layers
        self.config = config
        self.inside = False  # a whole-layer op running the layer's own forward on one segment
        self.outer = False  # the model's forward is in flight (its base model's hook then leaves the layout alone)

    def capture(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        """Forward pre-hook of the model: the batch's layout, kept until the next forward (recomputation)."""
        self.chain, self.exchange, self.heads, self.use = layout_chain(args, kwargs)
        self.outer = True

    def done(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        """Forward hook of the model (also when it raised)."""
        self.outer = False

    def capture_inner(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        """Forward pre-hook of the base model: the layout of a call that skips the model's own forward."""
        if not self.outer:
            self.chain, self.exchange, self.heads, self.use = layout_chain(args, kwargs)

    def record(self, layer: torch.nn.Module) -> None:
        """A prepared layer ran on the batch's plan."""
        if self.use is not None:
            self.use.record_mixer(layer, self.config)


def layout_chain(args: tuple, kwargs: dict[str, Any]
                 ) -> tuple[Chain | None, StateExchange | None, HeadsRoute | None, Any]:
    """The segments of a model call's tokens.

    Args:
        args, kwargs: the model's call (``input_ids`` first, or ``inputs_embeds``; ``hsap_plan`` from
            ``shard_batch``; else ``cu_seq_lens_q`` or ``position_ids`` ``[B, L]`` / ``[4, B, L]``).

    Returns:
        ``(chain, exchange, heads route, plan use)``; ``chain`` is ``None`` for one document per row without SP;
        the route is the heads mode's (``None``: summaries) when the batch splits a document.
    """
    plan = kwargs.get("hsap_plan")
    if plan is not None:
        if plan.size == 1:
            return document_chain(plan.layout.cu_seqlens), None, None, None
        sp = getattr(plan, "sp", None)
        if sp is None:
            raise ValueError("hf_hsap: a hybrid model's recurrent layers need the plan bound to its SP group: pass "
                             "shard_batch's output (a plan made offline has no process group)")
        tokens = [plan.local_token_indices(r).numpy() for r in range(plan.size)]
        chain = state_chain(plan.layout.cu_seqlens, tokens, plan.rank)
        exchange = StateExchange(sp.group, sp.global_ranks, sp.comm_stats, sp.timeout_s)
        mode = getattr(getattr(sp, "config", None), "recurrent_mode", "auto")
        if mode == "auto":
            mode = recurrent_mode(plan.placement, plan.cost)
        heads = heads_route(plan, sp) if mode == "heads" and chain.remote else None
        logger.debug("recurrent layers: split documents by %s", "heads all-to-all" if heads else "summaries")
        return chain, exchange, heads, plan_use_of(plan, kwargs.get(PLAN_USE_KEY))
    ids = kwargs.get("input_ids", args[0] if args and torch.is_tensor(args[0]) else None)
    embeds = kwargs.get("inputs_embeds")
    shape = ids.shape if ids is not None else (embeds.shape[:2] if embeds is not None else None)
    if shape is None or len(shape) != 2:
        return None, None, None, None
    rows, length = int(shape[0]), int(shape[1])
    starts = torch.zeros(rows, length, dtype=torch.bool)
    starts[:, 0] = True
    cu = kwargs.get("cu_seq_lens_q")
    pos = kwargs.get("position_ids")
    if cu is not None:
        flat = starts.reshape(-1)
        flat[torch.as_tensor(cu)[:-1].long().cpu()] = True
    elif pos is not None and length > 1:
        starts |= document_starts(text_positions(torch.as_tensor(pos), torch.Size((rows, length))).cpu())
    flat = starts.reshape(-1)
    if int(flat.sum()) == rows:
        return None, None, None, None  # one document per row: the kernels as they are
    cu_all = torch.cat([torch.nonzero(flat).flatten(), torch.tensor([rows * length])]).numpy()
    return document_chain(cu_all), None, None, None


def _replacement(name: str, op: Callable, ctx: MixerContext, layer: torch.nn.Module) -> Callable:
    """The ``forward`` of a layer's private kernel wrapper (kernel ``name``): the document-cut op when the batch has
    a layout, through the heads all-to-all when the batch runs that way and the kernel's heads divide the group."""

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        orig = types.MethodType(type(self).forward, self)  # the hook's own dispatch: torch / fla / mamba-ssm
        if ctx.chain is None:
            return orig(*args, **kwargs)
        ctx.record(layer)
        if ctx.heads is not None and name in HEADS_SPECS and heads_fit(name, args, kwargs, ctx.heads.size):
            return run_heads(name, op, orig, args, kwargs, route=ctx.heads)
        return op(orig, args, kwargs, ctx.chain, ctx.exchange)

    return forward


def _layer_replacement(op: Callable, ctx: MixerContext) -> Callable:
    """The ``forward`` of a layer with no kernel hook (:data:`~hf_hsap.mixers.ops.LAYER_OPS`): the document-cut op
    when the batch has a layout, whose segments call the layer's own forward."""

    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if ctx.chain is None or ctx.inside:
            return type(self).forward(self, *args, **kwargs)
        ctx.record(self)
        ctx.inside = True
        try:
            return op(self, types.MethodType(type(self).forward, self), args, kwargs, ctx.chain, ctx.exchange)
        finally:
            ctx.inside = False

    return forward


def _method_replacement(name: str, op: Callable, ctx: MixerContext) -> Callable:
    """Method ``name`` of a layer in :data:`~hf_hsap.mixers.ple.METHOD_OPS`: the document-cut op when the batch has a
    layout, which gets the class's own method bound to the layer."""

    def method(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        orig = types.MethodType(getattr(type(self), name), self)
        if ctx.chain is None:
            return orig(*args, **kwargs)
        ctx.record(self)
        return op(self, orig, args, kwargs, ctx.chain, ctx.exchange)

    return method


def prepare_mixers(model: torch.nn.Module, changes: ModelChanges) -> MixerContext | None:
    """Make a hybrid model's recurrent layers document-exact on packed rows and under SP.

    Called by :func:`~.prepare.prepare_model` (the one place that changes a model); every change goes through
    ``changes``, so ``PreparedModel.undo()`` takes it away.

    Args:
        model: a Transformers model (the one whose forward is called: the layout is read from its arguments).
        changes: the preparation's journal.

    Returns:
        The model's :class:`MixerContext`, or ``None`` when it has no such layer.
    """
    ctx = state_of(model, MIXERS)
    if ctx is not None:
        return ctx
    layers = mixer_layers(model)
    if not layers:
        return None
    ctx = MixerContext(layers, getattr(model, "config", None))
    for layer in layers:
        if type(layer).__name__ in LAYER_OPS:  # no kernel hook: the layer's forward, per instance, as kernelize does
            changes.set(layer, "forward",
                        types.MethodType(_layer_replacement(LAYER_OPS[type(layer).__name__], ctx), layer))
            continue
        if type(layer).__name__ in METHOD_OPS:  # token-mixing methods with no kernel hook, per instance
            for name, op in METHOD_OPS[type(layer).__name__].items():
                changes.set(layer, name, types.MethodType(_method_replacement(name, op, ctx), layer))
            continue
        for name, fn in layer.__dict__["_kernel_funcs"].items():
            if name in OPS:
                if "forward" in fn.__dict__:
                    logger.info("prepare_mixers: %s.%s had a kernelized forward; hf_hsap's document-cut version "
                                "replaces it (it calls the hook's default dispatch)", type(layer).__name__, name)
                changes.set(fn, "forward", types.MethodType(_replacement(name, OPS[name], ctx, layer), fn))
    changes.hook(model.register_forward_pre_hook(ctx.capture, with_kwargs=True))
    changes.hook(model.register_forward_hook(ctx.done, with_kwargs=True, always_call=True))
    base = getattr(model, "base_model", model)
    if base is not model:  # model.model(...) called directly also records its layout
        changes.hook(base.register_forward_pre_hook(ctx.capture_inner, with_kwargs=True))
    changes.put(model, MIXERS, ctx)
    for m in model.modules():  # what the "hsap" attention checks: this model's recurrent layers see the layout
        changes.put(m, MIXERS_READY, True)
    logger.info("prepare_mixers: %s: %d recurrent layers run document by document (%s)", type(model).__name__,
                len(layers), ", ".join(sorted({type(m).__name__ for m in layers})))
    return ctx
