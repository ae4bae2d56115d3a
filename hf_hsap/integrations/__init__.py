"""Integrations with Hugging Face Transformers (attention registry), Trainer / TRL and data loading.

Call :func:`register` once (``import hf_hsap`` does it) before ``attn_implementation="hsap"`` is used.
The trainers and their arguments import ``transformers.Trainer`` / TRL lazily (``from hf_hsap.integrations
import HSAPTrainer, HSAPSFTConfig``).
"""
from typing import Any

from .dataloader import SPDataLoader
from .model_check import ModelCheck, UnsupportedModelError, check_config, check_model
from .prepare import PreparedModel, prepare_model
from .plan_use import PlanNotUsedError, PlanUse, check_plan_used
from .loss import dp_grad_scale, global_num_items, hsap_causal_lm_loss, hsap_model_loss, reduce_loss_for_logging
from .sharding import batch_cu_seqlens, shard_batch, shift_labels_global
from .registry import ATTN_NAME, is_registered, register
from .transformers import document_starts, hsap_attention_forward, hsap_mask_function

_TRAINERS = ("HSAPSFTTrainer", "HSAPTrainer", "HSAPTrainerMixin")
_ARGUMENTS = ("HSAPArguments", "HSAPSFTConfig", "HSAPTrainingArguments")

__all__ = [
    "ATTN_NAME",
    "ModelCheck",
    "PlanNotUsedError",
    "PlanUse",
    "PreparedModel",
    "SPDataLoader",
    "UnsupportedModelError",
    "batch_cu_seqlens",
    "check_config",
    "check_model",
    "check_plan_used",
    "document_starts",
    "dp_grad_scale",
    "global_num_items",
    "hsap_attention_forward",
    "hsap_causal_lm_loss",
    "hsap_model_loss",
    "hsap_mask_function",
    "is_registered",
    "prepare_model",
    "reduce_loss_for_logging",
    "register",
    "shard_batch",
    "shift_labels_global",
    *_TRAINERS,
    *_ARGUMENTS,
]


def __getattr__(name: str) -> Any:
    if name in _TRAINERS:
        from . import trainer

        return getattr(trainer, name)
    if name in _ARGUMENTS:
        from . import arguments

        return getattr(arguments, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
