"""Audio clips and documents of the multimodal zoo's audio-language models (``vlm_zoo_configs.audio_families``) and of
the omni thinkers, as a processor would give them.

A clip is ``input_features`` of its family's layout (``[1, mel, frames]``, ``[1, frames, features]``, or a waveform
``input_values [1, 1, samples]`` of 160 samples a frame) with, where
the model takes one, the mask of its real frames (``feature_attention_mask`` / ``input_features_mask [1, frames]``;
the frames past the real ones zero), or, where the forward masks the encoder's output rows (Granite Speech), that
output mask ``[1, rows]`` (the rows of its real frames). A tower without a frame mask attends to the padding, so its
clips are padded alike (to the longest, as its processor pads a batch; the collator does not pad them); a
Whisper-like tower takes a fixed number of frames (``2 * max_source_positions``, the processor's 30 seconds), Qwen3's
whole chunks of ``2 * n_window``: every clip has that many, its real frames fewer. Each clip's placeholders are as
many as the rows the model's own ``get_audio_features`` returns for it alone (what its processor inserts).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from hf_hsap.multimodal.audio import audio_counter, audio_encoder, audio_inputs, audio_modality, output_mask_key
from hf_hsap.multimodal.structure import inner_vlm, token
from workers.vlm_zoo_configs import NotBuildable, first_line

__all__ = ["AUDIO_SHAPES", "audio_documents", "clip_maker"]

# per document (text before, real frames of its clip, text after): a long clip that SP splits, and shorter ones
AUDIO_SHAPES = [(5, 96, 4), (3, 40, 6), (2, 64, 3), (4, 24, 5)]

HOP = 160  # raw audio samples per frame (the Whisper feature extractor's hop length)
Clip = Callable[[int, torch.Generator, torch.dtype], tuple[dict[str, Any], int]]


def _rows(out: Any) -> torch.Tensor:
    """The rows an audio encoder's output hands the text model (``pooler_output``, else ``last_hidden_state``)."""
    pooled = getattr(out, "pooler_output", None)
    return pooled if pooled is not None else out.last_hidden_state


def clip_maker(config: Any, model: torch.nn.Module, frames: int | None = None) -> Clip:
    """The first clip layout the model's ``get_audio_features`` accepts.

    Args:
        config: the family's tiny config; model: a model of it; frames: the clips' frames (``None``: each clip its
            real frames, or the tower's fixed input where it has one).

    Returns:
        ``clip(real, generator, dtype) -> (keys, placeholders)``.

    Raises:
        NotBuildable: the model has no audio inputs its forward takes, or its encoder refuses every layout.
    """
    inner = inner_vlm(model)
    inputs = audio_inputs(model, inner) if inner is not None else None
    if inputs is None:
        raise NotBuildable(f"{type(model).__name__} has no get_audio_features input its forward takes")
    features, item_keys = inputs
    out_mask = output_mask_key(model, inner)
    frame_mask = next((k for k in item_keys if k.endswith("mask")), None)
    audio = getattr(config, "audio_config", None) or getattr(config, "encoder_config", None)
    mel = int(getattr(audio, "input_size", None) or getattr(audio, "num_mel_bins", None)  # FunASR: stacked frames
              or getattr(audio, "input_dim", None) or 16)
    most = getattr(audio, "max_source_positions", None)
    fixed = 2 * int(most) if isinstance(most, int) else None
    window = getattr(audio, "n_window", None)  # Qwen3's tower: frames in whole chunks of 2 * n_window
    chunk = 2 * int(window) if isinstance(window, int) else None

    def make(layout: str, length: Callable[[int], int]) -> Clip:
        def clip(real: int, g: torch.Generator, dtype: torch.dtype) -> tuple[dict[str, Any], int]:
            n, real = length(real), real
            if layout == "raw":  # a waveform: HOP samples per frame
                n, real = n * HOP, real * HOP
            mask = torch.zeros(1, n, dtype=torch.int64)
            mask[:, :real] = 1
            shape = {"mel": (1, mel, n), "frames": (1, n, mel), "raw": (1, 1, n)}[layout]
            feats = torch.randn(*shape, generator=g, dtype=dtype)
            feats = feats * (mask[..., None] if layout == "frames" else mask[:, None])
            keys: dict[str, Any] = {features: feats}
            if frame_mask is not None:
                keys[frame_mask] = mask
            for key in item_keys:  # a mask of the raw samples (MOSS's padding_mask): the real frames' (hop 160)
                if key.endswith("mask") and key != frame_mask:
                    keys[key] = torch.ones(1, real * HOP, dtype=torch.int64)
            extra = {k: v for k, v in keys.items() if k != features}
            if takes_ids:  # MusicFlamingo's encoder reads the clip's placeholder run (counted by the tower's rule)
                n_ids = count("audio", keys)[0]
                extra["input_ids"] = torch.full((1, n_ids), token(config, "audio_token_id", "audio_token_index"))
            with torch.no_grad():
                got = _rows(audio_encoder(inner)(feats.to(model.dtype), **extra, return_dict=True))
            if out_mask is not None:  # the output rows of its real frames (the rest: padding the forward drops)
                rows = int(got.shape[-2])
                keys[out_mask] = torch.arange(rows)[None] < -(-rows * real // n)
                return keys, int(keys[out_mask].sum())
            return keys, int(got.numel() // got.shape[-1])
        return clip

    mod = audio_modality(model, inner)
    if mod is None:
        raise NotBuildable("the config has no audio_token_id / audio_token_index (no placeholder to insert)")
    takes_ids = "input_ids" in inspect.signature(inspect.unwrap(audio_encoder(inner))).parameters
    count = audio_counter(model, inner)
    if features not in mod.padded and fixed is None and frames is None:  # an encoder that attends to the padding:
        frames = max(s[1] for s in AUDIO_SHAPES)  # every clip padded to the batch's longest, as in a batch
    lengths = [(f"{frames} frames", lambda real: frames)] if frames is not None else \
        [("its real frames", lambda real: real)] + ([(f"{fixed} frames", lambda real: fixed)] if fixed else []) + \
        ([(f"whole chunks of {chunk} frames", lambda real: -(-real // chunk) * chunk)] if chunk else [])
    errors = []
    for layout in ("mel", "frames", "raw"):
        for name, length in lengths:
            clip = make(layout, length)
            try:
                for real in sorted({s[1] for s in AUDIO_SHAPES}):
                    clip(real, torch.Generator().manual_seed(0), torch.float32)
                return clip
            except Exception as e:  # noqa: BLE001 - the encoder refuses this layout
                errors.append(f"[1, {layout}] of {name}: {first_line(e)}")
    raise NotBuildable("get_audio_features refuses the tiny clips (" + "; ".join(errors)[:300] + ")")


def audio_documents(config: Any, model: torch.nn.Module, shapes: list[tuple[int, int, int]] = AUDIO_SHAPES,
                    seed: int = 0, dtype: torch.dtype = torch.float64) -> list[dict[str, Any]]:
    """Documents ``text, [audio start] placeholders [audio end], text`` of an audio-language model, one clip each.

    Args:
        config: the family's tiny config; model: a model of it; shapes: per document (text before, real frames,
            text after); seed: tokens and features; dtype: of the features.

    Returns:
        One dict per document: ``input_ids [n]``, ``labels [n]`` (-100 on placeholders and markers), the clip's keys.
    """
    clip = clip_maker(config, model)
    placeholder = token(config, "audio_token_id", "audio_token_index")
    fields = config.to_dict()
    start = next((fields[n] for n in ("audio_start_token_id", "audio_bos_token_id", "begin_audio_token_id")
                  if isinstance(fields.get(n), int)), None)
    end = next((fields[n] for n in ("audio_end_token_id", "audio_eos_token_id", "end_audio_token_id")
                if isinstance(fields.get(n), int)), None)
    vocab = config.get_text_config().vocab_size
    low = min(vocab, *(v for n, v in fields.items() if n.endswith(("_token_id", "_token_index"))
                       and isinstance(v, int) and v > 2))
    g = torch.Generator().manual_seed(seed)
    docs = []
    for before, real, after in shapes:
        keys, n = clip(real, g, dtype)
        ids = torch.cat([torch.randint(3, low, (before,), generator=g)] +
                        ([torch.tensor([start])] if start is not None else []) + [torch.full((n,), placeholder)] +
                        ([torch.tensor([end])] if end is not None else []) + [torch.randint(3, low, (after,),
                                                                                            generator=g)])
        docs.append({"input_ids": ids, "labels": torch.where(ids >= low, -100, ids), **keys})
    return docs
