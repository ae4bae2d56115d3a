"""Audio-language models that encode their clips inline (Qwen2-Audio): an audio tower and a projector, run by the
forward itself on ``input_features`` with the frame mask ``feature_attention_mask``, their rows scattered into the
audio placeholders; no ``get_audio_features``.

hf_hsap gives such a model the ``get_audio_features`` its forward lacks (:func:`inline_audio_encoder`: the tower and
the projector with the masks the forward builds, the rows of each clip's real frames), so that the per-clip path of
:mod:`.audio` applies (count each clip, encode a rank's own clips, cut its rows, place them): ``prepare_model``
installs it, and a forward pre-hook (:func:`inline_audio_pre`) encodes the clips with it and hands the forward the
merged ``inputs_embeds`` instead of the features (``PreparedModel.undo()`` removes both).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["has_inline_audio", "inline_audio_encoder", "inline_audio_pre"]

FEATURES, FRAME_MASK = "input_features", "feature_attention_mask"


def has_inline_audio(module: torch.nn.Module | None) -> bool:
    """Whether ``module`` encodes audio inline: no ``get_audio_features``, an ``audio_tower`` with a rule for its
    rows (``_get_feat_extract_output_lengths``) and a ``multi_modal_projector``."""
    if module is None or callable(getattr(type(module), "get_audio_features", None)):
        return False
    tower = getattr(module, "audio_tower", None)
    return tower is not None and hasattr(module, "multi_modal_projector") and \
        callable(getattr(tower, "_get_feat_extract_output_lengths", None))


def inline_audio_encoder(inner: torch.nn.Module) -> Callable[..., Any]:
    """``get_audio_features(input_features, feature_attention_mask=None, **kwargs)`` of an inline encoder: what the
    forward computes before it scatters the rows (Qwen2-Audio's ``Qwen2AudioModel.forward``, step 2).

    Returns:
        The encoder; its output's ``last_hidden_state [clips, rows, hidden]`` (projected, padding rows included) and
        ``pooler_output [real rows, hidden]`` (each clip's real rows, in clip order: the placeholders' rows).

    Shapes:
        ``input_features [clips, mel, frames]``, ``feature_attention_mask [clips, frames]``.
    """
    from transformers.masking_utils import create_bidirectional_mask
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    def get_audio_features(input_features: torch.Tensor, feature_attention_mask: torch.Tensor | None = None,
                           **kwargs: Any) -> BaseModelOutputWithPooling:
        tower = inner.audio_tower
        feats = input_features.to(tower.device)
        clips, _, frames = feats.shape
        mask = torch.ones(clips, frames, dtype=torch.int64, device=feats.device) if feature_attention_mask is None \
            else feature_attention_mask.to(feats.device)
        conv_lengths, out_lengths = tower._get_feat_extract_output_lengths(mask.sum(-1))
        rows = (frames - 2) // 2 + 1  # the first convolution's rows of the padded clips (as the forward)
        mask_2d = (torch.arange(rows, device=feats.device)[None] < conv_lengths[:, None]).to(torch.long)
        dummy = torch.zeros(clips, rows, 1, dtype=inner.get_input_embeddings().weight.dtype,  # the forward's
                            device=feats.device)
        attention = create_bidirectional_mask(config=tower.config, inputs_embeds=dummy, attention_mask=mask_2d)
        hidden = inner.multi_modal_projector(tower(feats, attention_mask=attention).last_hidden_state)
        keep = torch.arange(hidden.shape[1], device=hidden.device)[None] < out_lengths.to(hidden.device)[:, None]
        return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=hidden[keep])

    return get_audio_features


def inline_audio_pre(token_id: int) -> Callable[[torch.nn.Module, tuple, dict[str, Any]], tuple]:
    """A forward pre-hook (``with_kwargs``) of an inline encoder's module: a call with features encodes them by the
    module's (installed, row-selecting) ``get_audio_features``, scatters the rows into the ``token_id`` placeholders
    of ``input_ids`` and calls the forward with ``inputs_embeds`` and no features (what the forward would do).

    Raises:
        ValueError: the rows and this call's placeholders disagree (named counts).
    """

    def pre(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        feats, ids = kwargs.get(FEATURES), kwargs.get("input_ids")  # (Qwen2-Audio's caller passes keywords)
        if args or feats is None or ids is None or kwargs.get("inputs_embeds") is not None:
            return args, kwargs
        out = module.get_audio_features(feats, kwargs.get(FRAME_MASK), return_dict=True)
        embeds = module.get_input_embeddings()(ids)
        where = (ids == token_id).to(embeds.device)
        rows = out.pooler_output
        if int(where.sum()) != int(rows.shape[0]):
            raise ValueError(f"{module.config.model_type}: this forward's input_ids have {int(where.sum())} audio "
                             f"placeholders, its clips' encoder gives {int(rows.shape[0])} rows")
        embeds = embeds.masked_scatter(where[..., None], rows.to(embeds.device, embeds.dtype))
        kwargs = {**kwargs, "input_ids": None, "inputs_embeds": embeds, FEATURES: None, FRAME_MASK: None}
        return args, kwargs

    return pre
