"""Proof that a sharded batch's plan reached every attention layer of the forward that consumed it.

Under SP a rank holds a non-contiguous subset of the row's tokens. If the plan does not reach an attention
layer (the model was loaded without ``attn_implementation="hsap"``, or a layer drops the keyword arguments),
that layer silently attends to the rank's own tokens only: a wrong loss with no error. So
:func:`~.sharding.shard_batch` puts a fresh :class:`PlanUse` next to the plan (``hsap_plan_use``), the
``"hsap"`` attention records each layer that consumed the plan, and the record is checked:

* by the HSAP trainers right after each forward (:func:`check_plan_used` in ``compute_loss``);
* by :func:`~.loss.hsap_causal_lm_loss` when given ``sp=`` (hand-written loops);
* at the latest by the next :func:`~.sharding.shard_batch` of the same SP group, for the batch before.

A loop that passes only some keys of the local batch to the model (``hsap_plan`` without
``hsap_plan_use``) is recorded too: the attention then fills the group's last record of the same plan.

A forward is complete when the distinct attention layers that consumed the plan are as many as the model's
attention layers (:func:`~.model_check.check_model`'s count, else the config's; recomputation under
gradient checkpointing calls the same layers again and counts once).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..plan.plan import Plan
from ..model_state import PREPARED, state_of
from .model_check import attention_layer_count, check_model, has_mixer_layers

__all__ = ["PLAN_USE_KEY", "PlanNotUsedError", "PlanUse", "check_plan_used", "plan_use_of"]

PLAN_USE_KEY = "hsap_plan_use"  # the key of the record in shard_batch's output (rides in the model kwargs)


class PlanNotUsedError(RuntimeError):
    """A forward under SP in which some attention layers did not consume the plan (results would be wrong)."""


class PlanUse:
    """Which attention layers consumed one sharded batch's plan.

    Attributes:
        sp_size: the plan's SP size.
        plan: the plan whose use this records.
        layers: ``id(module) -> class name`` of every attention layer that consumed the plan.
        calls: attention calls that consumed it (more than ``len(layers)`` under recomputation).
        config: the config of the first layer that consumed it (for the expected layer count).
        first_positions: ``[n_docs]`` position of each document's first token where one is not 0 (a document
            continuing from an earlier row), else ``None``; where chunked layers' chunks start
            (:func:`~.chunked_attention.layer_plan`).
    """

    def __init__(self, sp_size: int, plan: Plan | None = None, *, first_positions: np.ndarray | None = None) -> None:
        self.sp_size = sp_size
        self.plan = plan
        self.first_positions = first_positions
        self.layers: dict[int, str] = {}
        self.calls = 0
        self.config: Any = None
        self.checked = False
        self.mixers: dict[int, str] = {}

    @torch.compiler.disable
    def record_mixer(self, layer: torch.nn.Module, config: Any = None) -> None:
        """Called by a hybrid model's prepared recurrent layers (:mod:`.mixer_hooks`) that ran on the plan."""
        self.mixers.setdefault(id(layer), type(layer).__name__)
        if self.config is None:
            self.config = config

    @torch.compiler.disable  # dynamo would guard on the record's size and recompile in every layer
    def record(self, module: torch.nn.Module) -> None:
        """Called by the ``"hsap"`` attention for every layer that consumes the plan."""
        self.layers.setdefault(id(module), type(module).__name__)
        self.calls += 1
        if self.config is None:
            self.config = getattr(module, "config", None)

    def problem(self, expected: int | None = None, expected_mixers: int | None = None) -> str | None:
        """Why this record shows an incomplete forward (``None``: complete).

        Args:
            expected: the model's attention layers (default: counted from the recorded config).
            expected_mixers: the model's recurrent layers prepared by ``prepare_model`` (default: at least one when
                the recorded config has such layers).
        """
        if not self.layers and not self.mixers:
            return ("the sharded batch's plan reached no attention layer: the model runs without "
                    "attn_implementation='hsap', or its layers drop the keyword arguments, so every rank attended "
                    "to its own tokens only. Load it with AutoModelForCausalLM.from_pretrained(..., "
                    "attn_implementation='hsap') (or model.set_attn_implementation('hsap')), pass every key of "
                    "shard_batch's output to model(**local), and prepare the model with hf_hsap.prepare_model(model, "
                    "sp_size=...)")
        if expected_mixers is None and self.config is not None and has_mixer_layers(self.config):
            expected_mixers = 1
        if expected_mixers and len(self.mixers) < expected_mixers:
            return (f"only {len(self.mixers)} of the model's {expected_mixers} linear-attention / state-space / "
                    "convolution layers ran on the sequence-parallel plan; the others mixed this rank's tokens "
                    "only. Call hf_hsap.prepare_model(model, sp_size=...) once before the first forward (the "
                    "trainers do): it prepares them")
        if expected is None and self.config is not None:
            expected = attention_layer_count(self.config)
        if expected is not None and len(self.layers) < expected:
            return (f"only {len(self.layers)} of the model's {expected} attention layers consumed the sequence-parallel "
                    f"plan ({sorted(set(self.layers.values()))}); the others attended to this rank's tokens only. "
                    "Prepare the model with hf_hsap.prepare_model(model, sp_size=...): it relays the plan to the layers "
                    "that drop the keyword arguments")
        return None


def plan_use_of(plan: Plan, use: PlanUse | None = None) -> PlanUse | None:
    """The record an attention call with ``plan`` fills.

    Args:
        plan: the call's ``hsap_plan``.
        use: the call's ``hsap_plan_use`` (the record :func:`~.sharding.shard_batch` put next to the plan), or
            ``None``.

    Returns:
        ``use`` when given, else the SP group's last record from :func:`~.sharding.shard_batch` if it is of the
        same plan; ``None``: nothing to record.
    """
    if use is None:
        use = getattr(getattr(plan, "sp", None), "pending_plan_use", None)
        if use is not None and use.plan is not plan:
            return None
    return use


def check_plan_used(batch: Mapping[str, Any] | PlanUse | None, model: torch.nn.Module | None = None,
                    expected_layers: int | None = None) -> None:
    """Raise unless the forward that consumed ``batch`` ran its plan through every attention layer.

    Args:
        batch: the local batch from :func:`~.sharding.shard_batch` (or its ``hsap_plan_use`` record), after
            ``model(**batch)``; a batch without a record (SP size 1, or built by hand) passes.
        model: the model, to count its attention layers exactly (its :func:`~.prepare.prepare_model` record, else
            :func:`~.model_check.check_model`; both only read).
        expected_layers: that count, if known (wins over ``model``).

    Raises:
        PlanNotUsedError: the plan reached no attention layer, or fewer layers than the model has.
    """
    use = batch.get(PLAN_USE_KEY) if isinstance(batch, Mapping) else batch
    if use is None or use.sp_size <= 1:
        return
    expected_mixers = None
    if expected_layers is None and model is not None:  # a loop calling this every step: pass expected_layers
        model = getattr(model, "module", model)  # DDP / Accelerate wrappers
        prepared = state_of(model, PREPARED)
        found = (prepared.check if prepared is not None and prepared.sp_size == use.sp_size
                 else check_model(model, sp_size=use.sp_size))
        expected_layers, expected_mixers = found.attention_layers, found.mixer_layers
    use.checked = True
    problem = use.problem(expected_layers, expected_mixers)
    if problem is not None:
        raise PlanNotUsedError(problem)
