"""Decoder layers checkpointed in blocks, and the last layers' saved tensors kept on the device under offloading.

* ``checkpoint_layers`` (``b``): Transformers checkpoints each decoder layer (``GradientCheckpointingLayer``). With
  blocks, the first layer of every ``b`` consecutive layers runs the whole block under the same checkpoint function
  (``_gradient_checkpointing_func``, non-reentrant as :func:`hf_hsap.prepare_model` sets it) and the block's other
  layers hand the block's output through: a block keeps only its input, and its backward recomputes its ``b``
  layers first (``ceil(L / b)`` checkpoints instead of ``L``; the recompute holds ``b`` layers' saved tensors).
  The SAP attention recomputes its transfers inside the block as it does inside one layer (every rank recomputes
  the same layers in the same order). A last block may be shorter (``L % b`` layers).
* ``layers_kept_on_device`` (``k``): the offloading context moves every saved tensor to the host; the last ``k``
  decoder layers run inside TRL's ``NoOpManager`` (as TRL does for the LM head), so what they save (with
  checkpointing: their checkpoints) stays on the device. The last ones, because the backward starts with them: their
  tensors would be copied back first, with no earlier computation to hide the copy behind, and the forward's last
  copies to the host would be in flight when the backward begins; they are also freed first, so the device holds
  them only from their forward to the start of the backward (the first layers' would stay through all of it).

Why by hand: Transformers checkpoints per layer only, and TRL keeps only the head on the device. Both changes are
instance attributes and hooks recorded in ``prepare_model``'s journal (``undo()`` removes them): the classes, the
module tree and the state dict are unchanged.

Refused (before the first step): blocks over layers of different attention types (their masks differ), hybrid
models' recurrent layers, decoder layers that are not ``GradientCheckpointingLayer`` or already have a forward of
their own; at the first training forward, FSDP2-sharded layers (each layer gathers its weights in its own call, so
the block's first call cannot run the others), recorded hidden states (``output_hidden_states``) and a block whose
layers get different arguments.
"""
from __future__ import annotations

import types
from typing import Any, Callable

import torch
from torch import nn

from ..log import get_logger
from ..model_shape import text_config
from ..model_state import MIXERS, ModelChanges, state_of

__all__ = ["block_starts", "checkpoints_kept", "decoder_layers", "enable_checkpoint_blocks", "keep_layers_on_device"]

logger = get_logger(__name__)


def block_starts(layers: int, per_block: int) -> list[int]:
    """The first layer of every checkpointed block (``ceil(layers / per_block)`` of them; the last may be short)."""
    return list(range(0, layers, per_block))


def checkpoints_kept(layers: int, per_block: int, kept: int) -> int:
    """How many of the ``ceil(layers / per_block)`` checkpoints stay on the device when the last ``kept`` layers'
    saved tensors do: a block's checkpoint is made in its first layer's call, so the blocks that start there."""
    return sum(1 for s in block_starts(layers, per_block) if s >= layers - min(kept, layers))


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers the model's forward runs, in order (``get_decoder().layers``, the first
    ``num_hidden_layers``).

    Raises:
        ValueError: no such list (the fix named).
    """
    decoder = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ValueError(f"{type(model).__name__}: no decoder layer list (get_decoder().layers) to checkpoint in "
                         "blocks or keep on the device; use checkpoint_layers=1 and layers_kept_on_device=0")
    n = getattr(text_config(model.config), "num_hidden_layers", None) or len(layers)
    return list(layers)[:n]


def _plain_forward(layer: nn.Module) -> Callable[..., Any]:
    """The layer class's forward without Transformers' per-layer checkpointing wrapper (``functools.wraps`` keeps
    the wrapped function in ``__wrapped__``)."""
    fn = type(layer).forward
    while getattr(fn, "__code__", None) is not None and fn.__code__.co_name == "forward_with_checkpointing":
        fn = fn.__wrapped__
    return fn


def _same_tensor(x: Any, y: Any) -> bool:
    """The same tensor, or a view of the same memory as it (the identity functions that module hooks wrap a
    module's inputs and outputs in: DeepSpeed ZeRO-3's return ``detach()``-ed aliases)."""
    if x is y:
        return True
    return (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.device == y.device
            and x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
            and x.data_ptr() == y.data_ptr())


def _same_call(a: tuple, b: tuple) -> bool:
    """The same positional and keyword arguments: tensors the same memory, other values equal."""
    (args_a, kw_a), (args_b, kw_b) = a, b
    if len(args_a) != len(args_b) or kw_a.keys() != kw_b.keys():
        return False
    pairs = list(zip(args_a, args_b)) + [(kw_a[k], kw_b[k]) for k in kw_a]
    return all(_same_tensor(x, y) or (not isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor) and x == y)
               for x, y in pairs)


def _outputs_recorded() -> bool:
    """Whether Transformers records layer outputs in the forward in flight (``output_hidden_states`` and the like)."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # no recorder in this Transformers: nothing recorded by hooks
        return False
    return bool(_active_collector.get())


class _Block:
    """One block of consecutive decoder layers and the output its first layer handed to the others."""

    def __init__(self, layers: list[nn.Module], first: int) -> None:
        self.layers, self.first = layers, first
        self.plain = [_plain_forward(m) for m in layers]
        self.pending: tuple[int, torch.Tensor, tuple] | None = None  # (next layer, block output, the call)

    def _refuse_unsupported(self) -> None:
        from torch.distributed.fsdp import FSDPModule

        if any(isinstance(m, FSDPModule) for m in self.layers[1:]):
            raise ValueError("checkpoint_layers > 1: the decoder layers are sharded by FSDP2 (each gathers its weights "
                             "in its own call); use checkpoint_layers=1, or DeepSpeed ZeRO-3")
        if _outputs_recorded():
            raise ValueError("checkpoint_layers > 1 runs a block of layers in its first layer's call: the other "
                             "layers' hidden states cannot be recorded; train without output_hidden_states / "
                             "output_attentions, or with checkpoint_layers=1")

    def run_first(self, layer: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """The block's first layer: the whole block under the layer's checkpoint function (training with
        gradients), else the layer alone."""
        self.pending = None
        if not (layer.training and torch.is_grad_enabled()):
            return self.plain[0](layer, hidden_states, *args, **kwargs)
        if not layer.gradient_checkpointing:
            raise ValueError(f"checkpoint_layers={len(self.layers)} needs gradient checkpointing: turn it on "
                             "(MemoryLevers(gradient_checkpointing=True), --gradient_checkpointing)")
        self._refuse_unsupported()
        call = (args, dict(kwargs))
        if kwargs.get("use_cache"):  # as Transformers' per-layer checkpointing: no cache is written while training
            kwargs["use_cache"] = False
        for name in ("cache", "layer_past", "past_key_values"):
            if kwargs.get(name) is not None:
                kwargs[name] = None

        def run(h: torch.Tensor, *a: Any) -> torch.Tensor:
            for m, fn in zip(self.layers, self.plain):
                h = fn(m, h, *a, **kwargs)
                if not isinstance(h, torch.Tensor):
                    raise ValueError(f"checkpoint_layers > 1 needs decoder layers that return the hidden states as "
                                     f"a tensor ({type(m).__name__} returns {type(h).__name__}); use "
                                     "checkpoint_layers=1")
            return h

        out = layer._gradient_checkpointing_func(run, hidden_states, *args)
        self.pending = (1, out, call)
        return out

    def run_other(self, layer: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """A later layer of the block: the block's output handed on when its first layer ran the block (the
        tensor this layer was called with: hooks between the layers, e.g. ZeRO-3's, may have wrapped it)."""
        if self.pending is None:
            return self.plain[self.layers.index(layer)](layer, hidden_states, *args, **kwargs)
        i, out, call = self.pending
        if self.layers[i] is not layer or not _same_tensor(hidden_states, out) or not _same_call(call, (args, kwargs)):
            self.pending = None
            raise ValueError(f"checkpoint_layers > 1: decoder layer {self.first + self.layers.index(layer)} was not "
                             "called with the hidden states and the arguments of its block's first layer (the model "
                             "changes them between layers); use checkpoint_layers=1")
        self.pending = (i + 1, out, call) if i + 1 < len(self.layers) else None
        return hidden_states


def _check_blocks(model: nn.Module, layers: list[nn.Module], per_block: int) -> None:
    """Refuse what blocks cannot run exactly (module docstring)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    if state_of(model, MIXERS) is not None:  # prepare_model made its recurrent layers document-exact first
        raise ValueError(f"checkpoint_layers={per_block}: {type(model).__name__} has recurrent layers (a hybrid), "
                         "which blocks do not cover; use checkpoint_layers=1")
    for i, m in enumerate(layers):
        if not isinstance(m, GradientCheckpointingLayer):
            raise ValueError(f"checkpoint_layers={per_block}: decoder layer {i} ({type(m).__name__}) is not a "
                             "Transformers GradientCheckpointingLayer; use checkpoint_layers=1")
        if "forward" in m.__dict__:
            raise ValueError(f"checkpoint_layers={per_block}: decoder layer {i} already has a forward of its own; "
                             "use checkpoint_layers=1")
    kinds = getattr(text_config(model.config), "layer_types", None)
    for s in block_starts(len(layers), per_block) if kinds else ():
        mixed = sorted({str(t) for t in kinds[s:s + per_block]})
        if len(mixed) > 1:
            raise ValueError(f"checkpoint_layers={per_block}: layers {s}..{min(s + per_block, len(layers)) - 1} "
                             f"mix attention types {mixed} (their masks differ); use a checkpoint_layers whose "
                             "blocks each hold one type, or 1")


def enable_checkpoint_blocks(model: nn.Module, changes: ModelChanges, *, per_block: int) -> int:
    """Checkpoint ``model``'s decoder layers in blocks of ``per_block`` (module docstring).

    Args:
        model: the model, before wrapping. changes: ``prepare_model``'s journal (``undo()`` removes the forwards).
        per_block: decoder layers per checkpoint.

    Returns:
        The number of blocks.

    Raises:
        ValueError: what blocks cannot run exactly (the fix named).
    """
    layers = decoder_layers(model)
    _check_blocks(model, layers, per_block)
    starts = block_starts(len(layers), per_block)
    for s in starts:
        block = _Block(layers[s:s + per_block], s)
        for j, m in enumerate(block.layers):
            run = block.run_first if j == 0 else block.run_other
            changes.set(m, "forward", types.MethodType(lambda self, *a, _run=run, **k: _run(self, *a, **k), m))
    logger.info("hf_hsap: %d decoder layers of %s checkpointed in %d blocks of up to %d", len(layers),
                type(model).__name__, len(starts), per_block)
    return len(starts)


def keep_layers_on_device(model: nn.Module, changes: ModelChanges, *, kept: int) -> list[int]:
    """Keep the saved tensors of ``model``'s last ``kept`` decoder layers out of activation offloading (module
    docstring): each runs inside TRL's ``NoOpManager``, entered by a forward pre-hook and left by a forward hook.

    Args:
        model: the model, before wrapping. changes: ``prepare_model``'s journal (``undo()`` removes the hooks).
        kept: layers kept (at most all of them).

    Returns:
        The indices of the layers kept.
    """
    from trl.models.activation_offloading import NoOpManager

    layers = decoder_layers(model)
    first = max(0, len(layers) - kept)
    for m in layers[first:]:
        noop = NoOpManager()
        changes.hook(m.register_forward_pre_hook(lambda *_a, _n=noop: _n.__enter__()))
        changes.hook(m.register_forward_hook(lambda *_a, _n=noop: _n.__exit__(), always_call=True))
    logger.info("hf_hsap: the saved tensors of decoder layers %d..%d of %s stay on the device", first,
                len(layers) - 1, type(model).__name__)
    return list(range(first, len(layers)))

