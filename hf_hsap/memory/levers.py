"""The memory levers of a training step, in one object, applied to a model by :func:`hf_hsap.prepare_model`.

    levers = MemoryLevers(gradient_checkpointing=True, tiled_mlp=True)      # chunked loss is on by default
    prepared = hf_hsap.prepare_model(model, sp_size=sp.size, levers=levers)  # before accelerator.prepare
    with prepared.offload():                                                 # around every forward + backward
        loss = hsap_model_loss(model, local, n, grad_scale=W, sp=sp)
        loss.backward()

* ``chunked_loss``: :class:`~.head.ChunkedLMHead` (the logits never exist whole; the loss comes from
  :func:`hf_hsap.integrations.hsap_model_loss`).
* ``gradient_checkpointing``: Transformers' own (``model.activation_checkpointing_enable``), non-reentrant: each decoder
  layer keeps only its input and recomputes the rest in backward (the SAP attention recomputes its transfers too).
* ``activation_offloading``: :class:`~.offload.SlabOffload`: tensors saved for backward (with checkpointing, the
  layers' inputs) go to one exactly sized pinned host slab on a side stream and come back for their backward (TRL's
  context rounds each up to a power of two). On CPU activations are already in host memory: nothing to do (logged).
* ``tiled_mlp``: :func:`~.tiled_mlp.enable_tiled_mlp`.
* ``recompute_norms``: :func:`~.norms.enable_norm_recompute` (each RMSNorm saves only its input; its backward
  runs one tile of tokens at a time).
* ``tiled_attention``: :func:`~.tiled_attention.enable_tiled_attention` (the single-device attention, ``sp_size == 1``,
  in query tiles of ``attention_tile_tokens``; its backward's buffers exist for one tile at a time).
* ``checkpoint_layers``: with checkpointing, :func:`~.blocks.enable_checkpoint_blocks` (one checkpoint per block of
  that many decoder layers; its backward recomputes the block).
* ``layers_kept_on_device``: with offloading, :func:`~.blocks.keep_layers_on_device` (the last layers' saved tensors
  stay on the device).
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Sequence

import torch
from torch import nn

from ..log import get_logger
from ..model_state import ModelChanges
from .blocks import enable_checkpoint_blocks, keep_layers_on_device
from .head import enable_chunked_loss
from .norms import enable_norm_recompute
from .offload import slab_offload_context
from .tiled_attention import DEFAULT_ATTENTION_TILE_TOKENS, enable_tiled_attention
from .tiled_mlp import DEFAULT_TILE_TOKENS, enable_tiled_mlp

__all__ = ["LEVER_ORDER", "MemoryLevers", "apply_memory_levers", "has_accelerator"]

logger = get_logger(__name__)

# The levers by name (MemoryLevers' switches), in the order the fit check suggests them: each costs more step
# time than the one before it (tiled attention: no recomputation, only more, smaller kernel calls; after the recomputing
# levers since it pays only at SP 1 on long rows).
LEVER_ORDER = ("chunked_loss", "gradient_checkpointing", "tiled_mlp", "recompute_norms", "tiled_attention",
               "activation_offloading")


@dataclass(frozen=True)
class MemoryLevers:
    """Which memory levers a training step uses (module docstring).

    Args:
        chunked_loss: the LM head and the loss in tiles (default on).
        loss_tile_tokens: tokens per tile of the loss (default: a tile of about 16M logits, 128 tokens of a
            128K vocabulary).
        gradient_checkpointing: recompute each decoder layer in backward.
        activation_offloading: move saved activations to host memory (CUDA only).
        tiled_mlp: the MLPs in tiles of ``mlp_tile_tokens`` tokens, recomputed in backward.
        mlp_tile_tokens: tokens per tile of the tiled MLP and of the recomputed norms.
        recompute_norms: every RMSNorm keeps only its input and is recomputed in backward, one tile at a time.
        tiled_attention: the single-device attention (``sp_size == 1``) runs in query tiles, dK|dV summed in float32.
        attention_tile_tokens: query rows per tile (and keys per chunk) of the tiled attention (default 8192, see
            :data:`~.tiled_attention.DEFAULT_ATTENTION_TILE_TOKENS`).
        checkpoint_layers: with gradient checkpointing (this lever's or the Trainer's), decoder layers per
            checkpoint: a block keeps only its input and recomputes all its layers in backward (default 1: each
            layer). The first training forward refuses blocks without checkpointing.
        layers_kept_on_device: with activation offloading, the last this many decoder
            layers' saved tensors stay on the device (default 0: all offloaded).
    """

    chunked_loss: bool = True
    loss_tile_tokens: int | None = None
    gradient_checkpointing: bool = False
    activation_offloading: bool = False
    tiled_mlp: bool = False
    mlp_tile_tokens: int = DEFAULT_TILE_TOKENS
    recompute_norms: bool = False
    tiled_attention: bool = False
    attention_tile_tokens: int = DEFAULT_ATTENTION_TILE_TOKENS
    checkpoint_layers: int = 1
    layers_kept_on_device: int = 0

    def __post_init__(self) -> None:
        for name in ("loss_tile_tokens", "mlp_tile_tokens", "attention_tile_tokens", "checkpoint_layers"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise ValueError(f"MemoryLevers.{name} must be positive, got {getattr(self, name)}")
        if int(self.layers_kept_on_device) < 0:
            raise ValueError(f"MemoryLevers.layers_kept_on_device must be 0 or more, got {self.layers_kept_on_device}")

    def replace(self, **changes: Any) -> "MemoryLevers":
        """A validated copy with ``changes``."""
        return dataclasses.replace(self, **changes)

    def check_counts(self, *, checkpointing: bool | None = None, offloading: bool | None = None) -> "MemoryLevers":
        """Refuse ``checkpoint_layers > 1`` without gradient checkpointing and ``layers_kept_on_device`` without
        activation offloading (they would do nothing), where the levers are configured: the recipes, the trainers'
        arguments, ``hsap-plan`` (``prepare_model`` cannot: a Trainer turns checkpointing on after it).

        Args:
            checkpointing: whether gradient checkpointing is on (default: this object's switch; a Trainer's own
                comes from its arguments).
            offloading: whether activation offloading is on (default: this object's switch; a Trainer's comes from
                its arguments).

        Returns:
            ``self``.
        """
        ckpt = self.gradient_checkpointing if checkpointing is None else checkpointing
        off = self.activation_offloading if offloading is None else offloading
        if self.checkpoint_layers > 1 and not ckpt:
            raise ValueError(f"checkpoint_layers={self.checkpoint_layers} needs gradient checkpointing: turn it on "
                             "(gradient_checkpointing), or leave checkpoint_layers at 1")
        if self.layers_kept_on_device and not off:
            raise ValueError(f"layers_kept_on_device={self.layers_kept_on_device} needs activation offloading: turn it "
                             "on (activation_offloading), or leave layers_kept_on_device at 0")
        return self

    @property
    def names(self) -> list[str]:
        """The levers that are on, by their command-line names, in :data:`LEVER_ORDER`."""
        return [n for n in LEVER_ORDER if getattr(self, n)]


NOTHING_TO_OFFLOAD = "hf_hsap: activation offloading has nothing to move on CPU (activations are in host memory); off"


def has_accelerator() -> bool:
    """A device to offload activations from (the offloading context moves them from it to host memory; none on
    CPU)."""
    return hasattr(torch, "accelerator") and torch.accelerator.current_accelerator() is not None


def _enable_checkpointing(model: nn.Module, changes: ModelChanges) -> None:
    """Transformers' gradient checkpointing, non-reentrant, recorded so that undo turns it off exactly as it was."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing in Transformers; "
                         "train without --gradient_checkpointing")
    for module in model.modules():  # what Transformers sets on every module that checkpoints
        if hasattr(module, "gradient_checkpointing"):
            changes.keep(module, "gradient_checkpointing")
            changes.keep(module, "_gradient_checkpointing_func")
    for name in ("_require_grads_hook", "_require_grads_hooks"):  # Transformers' input-embedding hooks, kept here
        changes.keep(model, name)
    kwargs = {"use_reentrant": False}
    with changes.hooks_registered_by(model):  # ... and registered on the input embeddings (their handles kept above)
        if hasattr(model, "activation_checkpointing_enable"):  # Transformers >= 5.2x; the old name warns there
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if getattr(model.config, "use_cache", None):
        changes.set(model.config, "use_cache", False)  # a KV cache is not built while training


def apply_memory_levers(model: nn.Module, levers: MemoryLevers, changes: ModelChanges, *, verify: bool = True,
                        attention_layers: Sequence[nn.Module] = ()) -> Callable[[], ContextManager[Any]]:
    """Apply ``levers`` to ``model`` (unwrapped, before ``accelerator.prepare`` / DDP / FSDP); the memory part of
    :func:`hf_hsap.prepare_model`, the one caller.

    Args:
        model: a causal LM.
        levers: what to turn on.
        changes: ``prepare_model``'s journal: every change is recorded there and undone by ``PreparedModel.undo()``.
        verify: check the chunked head against the model's own logits once (:func:`~.head.verify_chunked_head`).
        attention_layers: the decoder's attention layers (the tiled attention's; ``prepare_model`` finds them).

    Returns:
        A factory of the context every forward + backward runs in (:class:`~.offload.SlabOffload` on an
        accelerator, else a null context).

    Raises:
        ValueError: a lever this model cannot use (a head that is not linear, a model without checkpointing).
    """
    if levers.chunked_loss:
        enable_chunked_loss(model, changes, tile_tokens=levers.loss_tile_tokens, verify=verify)
    if levers.tiled_mlp:
        enable_tiled_mlp(model, changes, tile_tokens=levers.mlp_tile_tokens)
    if levers.recompute_norms:
        enable_norm_recompute(model, changes, tile_tokens=levers.mlp_tile_tokens)
    if levers.tiled_attention:
        enable_tiled_attention(model, changes, attention_layers=attention_layers,
                               tile_tokens=levers.attention_tile_tokens)
    if levers.gradient_checkpointing:
        _enable_checkpointing(model, changes)
    if levers.checkpoint_layers > 1:  # checkpointing may be the Trainer's, turned on later: checked at the forward
        enable_checkpoint_blocks(model, changes, per_block=levers.checkpoint_layers)
    if levers.layers_kept_on_device:
        keep_layers_on_device(model, changes, kept=levers.layers_kept_on_device)
    if not levers.activation_offloading:
        return contextlib.nullcontext
    if not has_accelerator():
        logger.info(NOTHING_TO_OFFLOAD)
        return contextlib.nullcontext
    return slab_offload_context(model)
