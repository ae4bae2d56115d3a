"""Audio items of a multimodal model (the omni thinkers: Qwen2.5-Omni, Qwen3-Omni), asked from the model.

A processor gives each audio ``input_features [audios, mel, frames]`` with ``feature_attention_mask [audios,
frames]`` (the frames zero-padded to the batch's longest); the model's ``get_audio_features`` encodes each audio's
real frames and returns one feature row per placeholder in ``last_hidden_state``. A packed row carries every
document's audios along the first axis (frames zero-padded to the row's longest, as the processor pads a batch), and
each audio's placeholders are counted by the audio tower's own ``_get_feat_extract_output_lengths`` on its real
frames, so that the SP planner knows them before any encoder runs; every forward checks them against the encoder
(:func:`hf_hsap.multimodal.select.select_rows`).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..data.vision import Modality

__all__ = ["AUDIO_TYPE", "audio_counter", "audio_modality"]

AUDIO_TYPE = 3  # the audio placeholders' type in the collator's token types (text 0, image 1, video 2)


def _lengths_fn(inner: torch.nn.Module) -> Callable[[torch.Tensor], Any] | None:
    """The audio tower's ``_get_feat_extract_output_lengths`` (frames -> feature rows), or ``None``."""
    for module in inner.modules():
        fn = getattr(module, "_get_feat_extract_output_lengths", None)
        if callable(fn) and module is not inner:
            return fn
    return None


def audio_modality(model: torch.nn.Module, inner: torch.nn.Module) -> Modality | None:
    """The audio :class:`Modality` of a model whose ``get_audio_features`` takes ``input_features`` and their
    ``feature_attention_mask`` and whose forward takes both, or ``None``."""
    encode = getattr(inner, "get_audio_features", None)
    token = next((getattr(model.config, n) for n in ("audio_token_id", "audio_token_index")
                  if isinstance(getattr(model.config, n, None), int)), None)
    if not callable(encode) or token is None or _lengths_fn(inner) is None:
        return None
    params = set(inspect.signature(encode).parameters)
    forward = set(inspect.signature(type(model).forward).parameters)
    keys = {"input_features", "feature_attention_mask"}
    if not keys <= params or not keys <= forward:
        return None
    return Modality("audio", token, "input_features", item_keys=("feature_attention_mask",), type_id=AUDIO_TYPE,
                    padded=("input_features", "feature_attention_mask"))


def audio_counter(inner: torch.nn.Module) -> Callable[[str, Mapping[str, Any]], list[int]]:
    """``count("audio", document) -> [placeholders of each audio]``: the audio tower's output lengths of each audio's
    real frames (``feature_attention_mask.sum(-1)``); ``KeyError`` for another modality."""
    lengths = _lengths_fn(inner)

    def count(name: str, ex: Mapping[str, Any]) -> list[int]:
        if name != "audio":
            raise KeyError(name)
        mask = ex.get("feature_attention_mask")
        if mask is None:
            raise ValueError("an audio document needs its feature_attention_mask (the processor's, one row per "
                             "audio): its placeholders are counted from the real frames")
        frames = torch.as_tensor(mask).reshape(-1, torch.as_tensor(mask).shape[-1]).sum(-1).to(torch.int64)
        out = lengths(frames)
        out = out[-1] if isinstance(out, tuple) else out  # (after the convolutions, after the pooling)
        return [int(x) for x in torch.as_tensor(out).reshape(-1)]

    return count
