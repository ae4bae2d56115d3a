"""The one step that changes a model for hf_hsap, and undoes it.

:func:`prepare_model` is the only place hf_hsap changes a model, in this order:

1. the decoder's attention implementation becomes ``"hsap"`` (the other sub-models keep theirs);
2. attention dropout is set to 0 where asked (``disable_attention_dropout=True``);
   DeepSeek-sparse indexed layers get their per-document top-k (:func:`~.indexed.prepare_indexed`: before the check,
   whose probe forward runs them);
3. :func:`~.model_check.check_model` refuses what ``"hsap"`` cannot run exactly (it only reads);
4. a hybrid model's recurrent layers are made document-exact (:func:`~.mixer_hooks.prepare_mixers`);
5. the SP plan, and a direct packed call's documents, are relayed to the attention layers the model's call does not
   reach (:func:`~.plan_relay.relay_plan`);
6. a vision-language model keeps only its rank's feature rows (:func:`hf_hsap.multimodal.prepare_vision`);
7. the memory levers (:func:`hf_hsap.memory.levers.apply_memory_levers`: the chunked LM head, the tiled MLP, the
   recomputed norms, gradient checkpointing, activation offloading).

Every change goes through one :class:`~hf_hsap.model_state.ModelChanges` journal, so :meth:`PreparedModel.undo`
restores the model: its forwards, its hooks, its head, its config and its state dict. A preparation that fails half
way undoes what it did before raising. Checks (:func:`~.model_check.check_model`, the per-step
:func:`~.plan_use.check_plan_used`) never change a model.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch

from ..config import text_config
from ..log import get_logger
from ..memory.levers import MemoryLevers, apply_memory_levers
from ..model_state import PREPARED, ModelChanges, state_of
from ..multimodal import prepare_vision
from ..multimodal.layer_blocks import mark_causal_layers
from ..multimodal.marked import drop_dense_masks, mark_image_path_layers
from ..multimodal.prefix import mark_prefix_lm
from .indexed import prepare_indexed
from .mixer_hooks import prepare_mixers
from .relative_bias import prepare_relative_bias
from .model_check import (DROPOUT_CONFIG_FIELDS, ModelCheck, attention_dropout_layers, attention_modules,
                          check_model, dropout_settings)
from .plan_relay import relay_plan
from .registry import ATTN_NAME

__all__ = ["PreparedModel", "prepare_model"]

logger = get_logger(__name__)


@dataclass
class PreparedModel:
    """What :func:`prepare_model` did to a model, and how to take it back.

    Attributes:
        model: the prepared model.
        check: what :func:`~.model_check.check_model` found (attention layers a forward must run, recurrent layers).
        offload: the factory of the context every forward + backward runs in (activation offloading; a null
            context without it).
        sp_size, packed, levers: the arguments it was prepared with.
    """

    model: torch.nn.Module
    check: ModelCheck
    offload: Callable[[], ContextManager[Any]]
    sp_size: int
    packed: bool
    levers: MemoryLevers | None
    _changes: ModelChanges = field(repr=False, default_factory=ModelChanges)

    @property
    def changes(self) -> int:
        """How many changes are recorded (0 once undone)."""
        return len(self._changes)

    def undo(self) -> None:
        """Restore the model as it was before :func:`prepare_model`: forwards, hooks, head, config, state dict.

        Call it on the unwrapped model's preparation, after training (or to prepare again with other arguments).
        """
        self._changes.undo()
        logger.info("prepare_model: %s restored", type(self.model).__name__)


def _use_hsap_in_decoder(model: torch.nn.Module, changes: ModelChanges) -> None:
    """Give the decoder ``attn_implementation="hsap"`` unless it has it; the other sub-models (vision, audio
    towers) keep the implementation the user chose for them (``"hsap"`` serves their bidirectional calls too)."""
    config = model.config
    text = text_config(config)
    current = getattr(text, "_attn_implementation", None)
    if current == ATTN_NAME:
        return
    composite = text is not config
    logger.info("hf_hsap: %s's decoder was loaded with attn_implementation=%r; switching it to %r%s",
                type(model).__name__, current, ATTN_NAME, " (the other sub-models keep theirs)" if composite else "")
    if composite:
        name = next((k for k in getattr(config, "sub_configs", {}) if getattr(config, k, None) is text), "text_config")
        changes.on_undo(lambda: model.set_attn_implementation({name: current}))
        model.set_attn_implementation({name: ATTN_NAME})
    else:
        changes.on_undo(lambda: model.set_attn_implementation(current))
        model.set_attn_implementation(ATTN_NAME)


def _disable_attention_dropout(model: torch.nn.Module, changes: ModelChanges) -> int:
    """Set the attention dropout of every attention layer, and of the decoder's config, to 0 (recorded).

    Changing ``model.config.attention_dropout`` after construction alone does nothing: each layer copied the value.
    Returns the number of layers changed."""
    layers = attention_dropout_layers(model)
    for layer in layers:
        for obj, name in dropout_settings(layer):
            changes.set(obj, name, 0.0)
    text = text_config(model.config)
    for name in DROPOUT_CONFIG_FIELDS:
        if getattr(text, name, None):
            changes.set(text, name, 0.0)
    return len(layers)


def _same_preparation(done: PreparedModel, sp_size: int, packed: bool, levers: MemoryLevers | None) -> bool:
    return (done.sp_size, done.packed, done.levers) == (sp_size, packed, levers)


def prepare_model(model: torch.nn.Module, *, sp_size: int = 1, levers: MemoryLevers | None = None,
                  packed: bool = True, disable_attention_dropout: bool = False,
                  verify_head: bool = True) -> PreparedModel:
    """Make ``model`` ready for ``attn_implementation="hsap"`` on packed rows and under SP (module docstring).

    Call it once on the unwrapped model, before ``accelerator.prepare`` / DDP / FSDP (the trainers call it at
    construction). Calling it again with the same arguments returns the same preparation.

    Args:
        model: a Transformers model.
        sp_size: the SP size it will train with.
        levers: the memory levers (``None``: none; ``MemoryLevers()`` is the chunked loss alone).
        packed: whether rows hold several documents (the reason to use ``"hsap"``).
        disable_attention_dropout: set attention dropout to 0 (``"hsap"`` does not implement it; refused otherwise).
        verify_head: check the chunked LM head against the model's own logits once.

    Returns:
        A :class:`PreparedModel`: ``check`` (what :func:`~.model_check.check_model` found), ``offload`` (the context
        of every forward + backward) and ``undo()``.

    Raises:
        UnsupportedModelError: what ``"hsap"`` cannot run exactly, with a fix (nothing is left changed).
        ValueError: a lever the model cannot use, or a model prepared before with other arguments.
    """
    done = state_of(model, PREPARED)
    if done is not None:
        if _same_preparation(done, sp_size, packed, levers):
            return done
        raise ValueError(f"{type(model).__name__} was prepared before with sp_size={done.sp_size}, "
                         f"packed={done.packed}, levers={done.levers}; call .undo() on that preparation "
                         "(trainer.hsap_prepared.undo() for a trainer's) before preparing it again")
    changes = ModelChanges()
    try:
        _use_hsap_in_decoder(model, changes)
        if disable_attention_dropout:
            _disable_attention_dropout(model, changes)
        prepare_relative_bias(model, changes)  # before check_model: its probe forward runs the bias layers
        prepare_indexed(model, changes)  # before check_model: its probe forward runs the indexed layers
        drop_dense_masks(model, changes)  # Kosmos-2's text transformer builds no dense causal mask of its own
        mark_image_path_layers(model, changes)  # and its image-to-text projection's attention runs per image
        mark_prefix_lm(model, attention_modules(model), changes)  # PaliGemma: causal by its mask, not by its flag
        mark_causal_layers(model, attention_modules(model), changes)  # Gemma 4: image blocks on sliding layers
        check = check_model(model, sp_size=sp_size, packed=packed)
        if check.mixer_layers:
            prepare_mixers(model, changes)
        relayed = set(check.unreached_layers) | set(check.no_positions_layers)
        if relayed:  # the plan / the documents go round the layers the model's call does not reach
            relay_plan(model, [m for m in attention_modules(model) if type(m).__name__ in relayed], changes)
        prepare_vision(model, changes)
        offload = (contextlib.nullcontext if levers is None
                   else apply_memory_levers(model, levers, changes, verify=verify_head,
                                               attention_layers=attention_modules(model)))
    except BaseException:
        changes.undo()
        raise
    prepared = PreparedModel(model=model, check=check, offload=offload, sp_size=sp_size, packed=packed,
                             levers=levers, _changes=changes)
    changes.put(model, PREPARED, prepared)
    logger.info("prepare_model: %s prepared (sp_size=%d, %d changes, levers: %s)", type(model).__name__, sp_size,
                len(changes), ", ".join(levers.names) if levers is not None else "none")
    return prepared
