"""What a Transformers model must be for ``attn_implementation="hsap"`` to be exact, checked before a step.

hf_hsap replaces the *attention* of a model. It is exact only when every token mixer of the model is an
attention layer that goes through Transformers' ``AttentionInterface`` (so that the ``"hsap"`` function is
what runs) and receives the model's keyword arguments (so that the SP plan reaches it). Three families
of models break that, and each is refused here with its reason and a fix that works:

* **Other token mixers** (linear attention, Mamba / SSM, short convolutions, recurrent blocks): they see
  the whole packed row (documents leak into each other) and, under SP, only this rank's tokens. Seen in
  ``config.layer_types`` or in other config fields, and in the model's module classes.
* **Attention outside the interface** (Bloom, MPT, Falcon, ...): the model computes attention itself and
  "hsap" never runs (Bloom would even lose causality).
* **Attention that the keyword arguments do not reach** (StableLM, Nemotron, ...: a decoder layer calls it
  without ``**kwargs``): exact on one device, but under SP the plan never reaches the layer. Found by one
  two-token forward with a sentinel argument.

:func:`check_config` needs only the config (the mask function and the attention function call it on every
forward, so direct calls and hand-written loops are covered); :func:`check_model` also inspects the modules. Both
only read: what hf_hsap changes on a model (its recurrent layers, the plan relay, the vision rows, the memory levers)
is :func:`~.prepare.prepare_model`'s, which calls :func:`check_model` first.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from ..config import text_config
from ..log import get_logger
from ..mixers.layers import mixer_layers
from ..model_state import DEPTH, MIXERS_READY, state_of
from ..plan.chain import RECURRENT_LAYER_TYPES
from .encoder_attention import is_encoder_module
from .indexed_layers import other_indexed_layers
from .plan_relay import Probe, probe_attention
from .mixer_families import (FAMILY_REASONS, MIXER_CLASS_WORDS, MIXER_FAMILIES, MIXER_FIELDS, NO_HOOK,
                             NON_MIXING_LAYER_TYPES)

logger = get_logger(__name__)

__all__ = ["ATTENTION_LAYER_TYPES", "MIXER_FAMILIES", "REFERENCE_SLIDING", "ModelCheck", "UnsupportedModelError",
           "attention_dropout_layers", "attention_layer_count", "attention_modules", "check_config", "check_mixers_prepared", "check_model",
           "chunked_attention_size", "has_mixer_layers", "has_reference_sliding", "layer_type", "sliding_window_size",
           "uses_attention_interface"]

# `config.layer_types` entries that are plain softmax attention through the AttentionInterface, and DeepSeek-sparse
# "indexed_attention" (softmax attention over an indexer's top-k keys, made per-document by integrations/indexed.py).
# "reference_sliding_attention" (Unlimited-OCR): Transformers masks it with `window OR (causal AND key in the prefill)`
# over a sliding window; without a KV cache every key is prefill, so one forward (training, prefill) is plain causal
# attention with no window. Only a decode step after the prefill slides (its cache keeps the prefill and the window).
REFERENCE_SLIDING = "reference_sliding_attention"
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention", "indexed_attention",
                                   REFERENCE_SLIDING})
# Config fields of families whose attention adds a dense bias the model computes itself (Doge's dynamic
# mask from `dt_states`): "hsap" has no additive biases.
_DENSE_BIAS_FIELDS = ("keep_window_size",)
_SDPA_FIX = "use attn_implementation='sdpa' (or 'eager'), without packing and without sequence parallelism"


class UnsupportedModelError(ValueError):
    """A model (or one of its layers) that hf_hsap cannot run exactly; the message names the fix."""


@dataclass(frozen=True)
class ModelCheck:
    """What :func:`check_model` found.

    Attributes:
        family: ``config.model_type``.
        attention_layers: decoder attention layers a text forward runs (what a forward under SP must show; under
            SP counted by the probe, else the modules that call the attention interface; a vision / audio
            encoder's layers are not counted).
        chunk_size: ``attention_chunk_size`` of chunked layers (``None``: no chunked layers).
        mixer_layers: recurrent layers (linear attention, SSM, short convolution) that
            :func:`~.prepare.prepare_model` makes document-exact (each records the plan under SP).
        unreached_layers: class names of the attention layers the model's keyword arguments do not reach under SP
            (found by the probe; :func:`~.prepare.prepare_model` relays the plan to them).
        no_positions_layers: class names of the attention layers that the ``position_ids`` of a direct call do not
            reach (:func:`~.prepare.prepare_model` relays a packed row's documents to them).
    """

    family: str
    attention_layers: int
    chunk_size: int | None = None
    mixer_layers: int = 0
    unreached_layers: tuple[str, ...] = ()
    no_positions_layers: tuple[str, ...] = ()


def _family(config: Any) -> str:
    return str(getattr(config, "model_type", type(config).__name__))


def layer_type(config: Any, layer_idx: int | None) -> str | None:
    """``config.layer_types[layer_idx]`` (``None`` when the config has no layer types or no index)."""
    types = getattr(text_config(config), "layer_types", None)
    if not types or layer_idx is None or not 0 <= layer_idx < len(types):
        return None
    return str(types[layer_idx])


def chunked_attention_size(config: Any) -> int | None:
    """``attention_chunk_size`` when the model has chunked-attention layers, else ``None``."""
    text = text_config(config)
    if "chunked_attention" not in {str(t) for t in (getattr(text, "layer_types", None) or [])}:
        return None
    return getattr(text, "attention_chunk_size", None)


def sliding_window_size(config: Any) -> int | None:
    """``sliding_window`` of the decoder's config: the window ``masking_utils`` builds the sliding layers' mask
    with (``None``: no window)."""
    return getattr(text_config(config), "sliding_window", None)


def has_reference_sliding(config: Any) -> bool:
    """Whether the decoder has ``"reference_sliding_attention"`` layers (see :data:`REFERENCE_SLIDING`)."""
    return REFERENCE_SLIDING in {str(t) for t in (getattr(text_config(config), "layer_types", None) or [])}


def attention_layer_count(config: Any) -> int | None:
    """Attention layers a text forward runs, from the config: the attention entries of ``layer_types``, else
    ``num_hidden_layers`` less cross-attention layers (``None`` when the config says neither)."""
    text = text_config(config)
    types = getattr(text, "layer_types", None)
    n_layers = getattr(text, "num_hidden_layers", None)
    if types:
        types = list(types)[:n_layers] if isinstance(n_layers, int) else list(types)
        return sum(str(t) in ATTENTION_LAYER_TYPES for t in types)
    if not isinstance(n_layers, int):
        return None
    cross = getattr(text, "cross_attention_layers", None) or ()  # Mllama: run only with images
    return n_layers - len(cross)


@functools.lru_cache(maxsize=None)
def _interface_of_config_class(config_class: type) -> bool | None:
    """Whether the causal-LM class registered for ``config_class`` computes attention through the
    AttentionInterface (Transformers' own source heuristic); ``None`` when no class is registered."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING

        for mapping in (MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_MAPPING):
            if config_class in mapping:
                model_class = mapping[config_class]
                if isinstance(model_class, (list, tuple)):
                    model_class = model_class[0]
                return bool(model_class._can_set_attn_implementation())
    except Exception:  # noqa: BLE001 - an unknown or custom config: nothing to say
        return None
    return None


def uses_attention_interface(config: Any) -> bool | None:
    """Whether the model family of ``config`` runs its attention through the AttentionInterface
    (``None``: unknown, e.g. a custom model)."""
    return _interface_of_config_class(type(text_config(config)))


def has_mixer_layers(config: Any) -> bool:
    """Whether the config's model has recurrent token mixers (linear attention, SSM, short convolutions)."""
    text = text_config(config)
    types = getattr(text, "layer_types", None)
    if types:
        return bool({str(t) for t in types} & RECURRENT_LAYER_TYPES)
    return any(getattr(text, name, None) is not None for name in MIXER_FIELDS)


def _mixer_reason(config: Any) -> str | None:
    """Why the config's model has token mixers hf_hsap cannot run exactly (a phrase), or ``None``."""
    text = text_config(config)
    types = getattr(text, "layer_types", None)
    family = _family(text)
    known = family in MIXER_FAMILIES
    if family in FAMILY_REASONS:
        return FAMILY_REASONS[family]
    hooks = ("hf_hsap makes recurrent layers document-exact through Transformers' kernel hooks, and this family "
             f"computes them in its own code ({NO_HOOK.get(family, 'no kernel hook to replace')})")
    if types:
        allowed = ATTENTION_LAYER_TYPES | (RECURRENT_LAYER_TYPES | NON_MIXING_LAYER_TYPES if known else frozenset())
        other = sorted({str(t) for t in types} - allowed)
        unknown = [t for t in other if t not in RECURRENT_LAYER_TYPES | NON_MIXING_LAYER_TYPES]
        if unknown:
            return f"layers of type {unknown} (config.layer_types) that are not softmax attention"
        if other:
            return f"recurrent layers of type {other} (config.layer_types): {hooks}"
        return None
    for name in MIXER_FIELDS:
        if getattr(text, name, None) is not None and not known:
            return (f"non-attention token mixers (config.{name} is set: Mamba / SSM, convolution or linear "
                    f"attention): {hooks}")
    return None


def check_mixers_prepared(module: torch.nn.Module, config: Any, sp_size: int = 1) -> None:
    """Refuse a packed / sharded forward of a hybrid model whose recurrent layers ``prepare_model`` did not prepare.

    Args:
        module: an attention layer of the model (``prepare_model`` marks every module of the models it prepares).
        config: the layer's config. sp_size: the plan's SP size.
    """
    if state_of(module, MIXERS_READY) is None and has_mixer_layers(config):
        where = f"under sequence parallelism (sp_size={sp_size})" if sp_size > 1 else "on packed rows"
        raise UnsupportedModelError(
            f"{_family(text_config(config))}'s linear-attention / state-space / convolution layers would mix the "
            f"documents {where}: call hf_hsap.prepare_model(model, sp_size={sp_size}) once before the first forward "
            "(the trainers do); it makes them exact")


def check_config(config: Any, *, packed: bool = True, sp_size: int = 1) -> None:
    """Refuse what the config alone shows hf_hsap cannot compute exactly on packed rows or under SP.

    Args:
        config: the model's config.
        packed: the input holds several documents in a row (or its layout is unknown).
        sp_size: the SP size (> 1: the row is split over ranks).

    Raises:
        UnsupportedModelError: non-attention token mixers (on packed rows or under SP), or a family that
            computes attention outside the AttentionInterface.
    """
    family = _family(text_config(config))
    if uses_attention_interface(config) is False:
        raise UnsupportedModelError(
            f"{family} computes attention in its own code, outside Transformers' AttentionInterface, so "
            f"attn_implementation='hsap' would never run (and its mask would be wrong); {_SDPA_FIX}"
        )
    text = text_config(config)
    for name in _DENSE_BIAS_FIELDS:
        if getattr(text, name, None) is not None:
            raise UnsupportedModelError(
                f"{family}'s attention adds a dense bias it computes itself (config.{name}: a dynamic mask), which "
                f"attn_implementation='hsap' does not implement; {_SDPA_FIX}"
            )
    if packed or sp_size > 1:
        reason = _mixer_reason(config)
        if reason is not None:
            where = f"under sequence parallelism (sp_size={sp_size})" if sp_size > 1 else "on packed rows"
            raise UnsupportedModelError(
                f"{family} has {reason}, so it would not be exact {where}. Train it with one document per row: "
                f"{_SDPA_FIX}"
            )


def _calls_attention_interface(module: torch.nn.Module) -> bool:
    """Whether the module's ``forward`` dispatches through ``ALL_ATTENTION_FUNCTIONS`` (cached per class)."""
    return _forward_uses_interface(type(module))


@functools.lru_cache(maxsize=None)
def _forward_uses_interface(cls: type) -> bool:
    try:
        return "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False


def encoder_parts(model: torch.nn.Module) -> set[int]:
    """The ids of every module inside a vision / audio encoder of ``model`` (a sub-model whose config is an
    encoder's): they run on each item's own tokens (the items' exactness is the multimodal checks'), never on the
    decoder's packed rows."""
    return {id(x) for m in model.modules() if is_encoder_module(m) for x in m.modules()}


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder's attention layers of ``model``: modules whose forward calls the AttentionInterface, less a vision
    or audio encoder's, less the layers that attend over one token's own states (``DEPTH``, marked by
    ``prepare_model``)."""
    return [m for m in model.modules() if _calls_attention_interface(m) and not is_encoder_module(m)
            and state_of(m, DEPTH) is None]  # Inkling 2's attention residuals mix no tokens


def check_model(model: torch.nn.Module, sp_size: int = 1, packed: bool = True) -> ModelCheck:
    """Refuse, before the first step, a model that ``attn_implementation="hsap"`` cannot run exactly; only reads.

    Under SP or on packed rows a two-token probe forward (with an image for a vision-language model) finds the
    attention layers the keyword arguments and the ``position_ids`` reach; it leaves the model as it was (hooks
    removed, random streams forked, no gradients).

    Args:
        model: a Transformers model (e.g. ``AutoModelForCausalLM.from_pretrained(..., attn_implementation="hsap")``).
        sp_size: the SP size it will train with.
        packed: whether rows hold several documents (the reason to use ``"hsap"``).

    Returns:
        A :class:`ModelCheck` with the number of attention layers a forward must run.

    Raises:
        UnsupportedModelError: with the family, the reason and a fix (see the module docstring).
    """
    config = model.config
    family = _family(text_config(config))
    check_config(config, packed=packed, sp_size=sp_size)
    encoders = encoder_parts(model)  # a vision / audio tower's mixers run per item, not on the packed rows
    words = [m for m in model.modules() if any(w in type(m).__name__ for w in MIXER_CLASS_WORDS)
             and "Norm" not in type(m).__name__ and not _calls_attention_interface(m) and id(m) not in encoders]
    mixers = mixer_layers(model) if family in MIXER_FAMILIES else []
    ids = {id(p) for p in mixers}
    inside = {id(x) for p in mixers for x in p.modules()}  # a recurrent layer, its parts and its parents count
    left = sorted({type(m).__name__ for m in words if id(m) not in inside and not any(id(x) in ids for x in m.modules())})
    if left and (packed or sp_size > 1):
        raise UnsupportedModelError(
            f"{family} has non-attention token mixers ({', '.join(left)}) without a kernel hook hf_hsap can replace "
            "(the hooks come with the `kernels` package: pip install kernels), so they would mix documents on packed "
            f"rows and see only local tokens under SP; {_SDPA_FIX}"
        )
    odd = other_indexed_layers(model)
    if odd and (packed or sp_size > 1):
        raise UnsupportedModelError(
            f"{family}'s indexed-attention layers ({', '.join(odd)}) hand their key selection to the attention in a "
            "way hf_hsap does not know (it makes exact: top-k indices through the attention interface, a top-k "
            f"turned into a mask by build_attention_mask_from_topk, a selection mask ANDed with the causal mask); "
            f"{_SDPA_FIX}")
    attention = attention_modules(model)
    if not attention and not mixers:
        raise UnsupportedModelError(f"{family} has no layer that calls Transformers' AttentionInterface, so "
                                    f"attn_implementation='hsap' would never run; {_SDPA_FIX}")
    dropout = sorted({type(m).__name__ for m in attention_dropout_layers(model)})
    if dropout:  # checked in eval mode too: from_pretrained returns eval mode, training turns it on
        raise UnsupportedModelError(
            f"{family}: {', '.join(dropout)} has attention dropout > 0, which hf_hsap does not implement; pass "
            "disable_attention_dropout=True to hf_hsap.prepare_model (or load with attention_dropout=0.0)"
        )
    probe = None
    if sp_size > 1 or packed:  # whether the plan (SP) and the documents (a direct packed call) reach the attention
        probe = probe_attention(model, attention)
    else:
        logger.debug("check_model: one document per row at sp_size=1, so no probe of the attention's arguments")
    probe = probe or Probe(len(attention), (), True)
    if sp_size > 1 and probe.unreached and not probe.accepts:
        raise UnsupportedModelError(
            f"{family}: the model's forward takes no extra keyword arguments, so shard_batch's plan cannot reach "
            f"{', '.join(probe.unreached)} and every rank would attend to its own tokens only; use sp_size=1 (packed "
            "rows are exact there) or a family whose forward takes **kwargs (Llama, Qwen2/3, Mistral, ...)")
    n_layers = probe.layers if sp_size > 1 else len(attention)
    result = ModelCheck(family=family, attention_layers=n_layers, chunk_size=chunked_attention_size(config),
                        mixer_layers=len(mixers), unreached_layers=probe.unreached if sp_size > 1 else (),
                        no_positions_layers=probe.no_positions)
    logger.info("check_model: %s is supported (%d attention layers, sp_size=%d)", family, n_layers, sp_size)
    return result


_DROPOUT_ATTRS = ("attention_dropout", "attn_dropout", "dropout")  # where attention layers keep their p
DROPOUT_CONFIG_FIELDS = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")  # and configs theirs


def _dropout_p(module: torch.nn.Module) -> float:
    """The attention dropout probability of a layer (a number, or an ``nn.Dropout``'s ``p``, under any of
    the names families use: ``attention_dropout``, GPT-2's ``attn_dropout``, BERT's ``dropout``)."""
    for name in _DROPOUT_ATTRS:
        dropout = getattr(module, name, None)
        p = float(dropout.p) if isinstance(dropout, torch.nn.Dropout) else dropout
        if isinstance(p, (int, float)) and p > 0:
            return float(p)
    return 0.0


def attention_dropout_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The attention layers of ``model`` with a dropout probability above 0 (what ``"hsap"`` does not implement)."""
    return [m for m in model.modules() if _calls_attention_interface(m) and _dropout_p(m) > 0]


def dropout_settings(module: torch.nn.Module) -> list[tuple[Any, str]]:
    """Where an attention layer keeps a dropout probability above 0: ``(object, attribute)`` pairs, an
    ``nn.Dropout``'s ``p`` (Persimmon, GPT-2, BERT) or a number on the layer."""
    found = []
    for name in _DROPOUT_ATTRS:
        dropout = getattr(module, name, None)
        if isinstance(dropout, torch.nn.Dropout) and dropout.p > 0:
            found.append((dropout, "p"))
        elif isinstance(dropout, (int, float)) and dropout > 0:
            found.append((module, name))
    return found
