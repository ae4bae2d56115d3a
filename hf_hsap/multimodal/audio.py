"""Audio items of a multimodal model (the omni thinkers, and the audio-language models: Voxtral, AudioFlamingo 3,
Qwen3-ASR, ...), asked from the model.

A processor gives each audio clip its features ``input_features [clips, ...frames...]`` and, where the model takes
one, a mask of its real frames (``feature_attention_mask`` / ``input_features_mask [clips, frames]``; the frames
zero-padded to the batch's longest); the model's ``get_audio_features`` encodes the clips and returns one feature row
per placeholder (``pooler_output``, or ``last_hidden_state`` where it has none). What is carried per clip is read from
the model: the keys ``get_audio_features`` takes that its forward takes too, the first of them the features (the
"pixels" of the modality), the rest per-clip keys; a key the forward takes whose name extends the features' key
(``input_features_mask``) but that ``get_audio_features`` does not take masks the encoder's *output* rows (Granite
Speech: the forward keeps ``features[mask]``).

A packed row carries every document's clips along the first axis (frames zero-padded to the row's longest, as the
processor pads a batch), and each clip's placeholders are counted before any encoder runs, so that the SP planner
knows them:

- by the audio tower's own ``_get_feat_extract_output_lengths`` (a method, or its module's function with the tower
  config's arguments, e.g. ``n_window``) on the clip's real frames, where the encoder takes a frame mask;
- by the output mask's real rows, where the forward masks the output;
- by the document's runs of placeholders, one per clip, where the encoder takes a frame mask but the model names no
  rule (GLM-ASR computes its rows inline);
- else every clip has the same placeholders (fixed-length clips, e.g. Voxtral's 30-second chunks).

Every forward checks the counts against the encoder (:func:`hf_hsap.multimodal.select.select_rows`).
"""
from __future__ import annotations

import functools
import inspect
import sys
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec
from .audio_inline import has_inline_audio, inline_audio_encoder
from .structure import CONTROL_KEYS, VisionRefusal, fix, forward_keys, param_names, token

__all__ = ["AUDIO_TYPE", "audio_counter", "audio_encoder", "audio_inputs", "audio_modality", "audio_probe_inputs", "audio_spec",
           "encode_per_clip", "is_audio_lm", "output_mask_key", "placeholder_runs"]

AUDIO_TYPE = 3  # the audio placeholders' type in the collator's token types (text 0, image 1, video 2)
AUDIO_TOKENS = ("audio_token_id", "audio_token_index")


def audio_encoder(inner: torch.nn.Module) -> Callable[..., Any] | None:
    """The inner model's ``get_audio_features`` (bound), the one hf_hsap gives an inline encoder
    (:func:`.audio_inline.inline_audio_encoder`: Qwen2-Audio), or ``None``."""
    if has_inline_audio(inner):
        return inline_audio_encoder(inner)
    encode = getattr(inner, "get_audio_features", None)
    return encode if callable(encode) else None


def _encode_params(inner: torch.nn.Module) -> list[str]:
    """The named parameters of the inner model's ``get_audio_features``, in order."""
    encode = audio_encoder(inner)
    return list(param_names(inspect.unwrap(encode))) if encode is not None else []


def audio_inputs(model: torch.nn.Module, inner: torch.nn.Module) -> tuple[str, tuple[str, ...]] | None:
    """``(features key, per-clip keys)``: the keys ``get_audio_features`` takes that the forward takes too, the first
    one the features, then the masks and the keys it requires (an optional one that is not a mask, e.g. the omni
    thinkers' ``audio_feature_lengths``, is another way to give what the mask gives: not carried); ``None`` where
    there are none."""
    forward = forward_keys(model)
    encode = audio_encoder(inner)
    params = param_names(inspect.unwrap(encode)) if encode is not None else {}
    keys = [k for k in params if k in forward and k not in CONTROL_KEYS]
    if not keys:
        return None
    items = tuple(k for k in keys[1:] if k.endswith("mask") or params[k].default is inspect.Parameter.empty)
    return keys[0], items


def output_mask_key(model: torch.nn.Module, inner: torch.nn.Module) -> str | None:
    """The forward's key that masks the encoder's output rows (its name extends the features' key, and
    ``get_audio_features`` does not take it: Granite Speech's ``input_features_mask``), or ``None``."""
    inputs = audio_inputs(model, inner)
    if inputs is None:
        return None
    taken = set(_encode_params(inner))
    return next((k for k in sorted(forward_keys(model)) if k.startswith(inputs[0] + "_") and k.endswith("mask")
                 and k not in taken), None)


def _frame_mask_key(item_keys: tuple[str, ...]) -> str | None:
    """The per-clip key that marks the real frames (``feature_attention_mask``, ``input_features_mask``)."""
    return next((k for k in item_keys if k.endswith("mask")), None)


def _lengths_fn(inner: torch.nn.Module) -> Callable[[torch.Tensor], Any] | None:
    """The audio tower's ``_get_feat_extract_output_lengths`` (frames -> feature rows): its method, or its module's
    function bound to the tower config's values of its other parameters (Qwen3-Omni's ``n_window``); ``None``."""
    for module in inner.modules():
        fn = getattr(module, "_get_feat_extract_output_lengths", None)
        if callable(fn) and module is not inner:
            return fn
    for module in inner.modules():
        fn = getattr(sys.modules.get(type(module).__module__), "_get_feat_extract_output_lengths", None)
        config = getattr(module, "config", None)
        if module is inner or not callable(fn) or config is None:
            continue
        extra = list(inspect.signature(fn).parameters)[1:]
        if all(hasattr(config, n) for n in extra):  # the tower's config names them
            return functools.partial(fn, **{n: getattr(config, n) for n in extra})
    return None


def audio_modality(model: torch.nn.Module, inner: torch.nn.Module) -> Modality | None:
    """The audio :class:`Modality` of a model with ``get_audio_features``, an audio placeholder and the features
    among its forward's keys (module docstring), or ``None``."""
    encode = audio_encoder(inner)
    placeholder = token(model.config, *AUDIO_TOKENS)
    inputs = audio_inputs(model, inner)
    if encode is None or placeholder is None or inputs is None:
        return None
    features, item_keys = inputs
    out_mask = output_mask_key(model, inner)
    item_keys = item_keys + ((out_mask,) if out_mask else ())
    # an encoder that attends to padded frames (no frame mask, or one it does not pass to its tower): a row's clips
    # keep their own frames (not padded)
    frame_mask = _frame_mask_key(inputs[1])
    masked = frame_mask is not None and _ignores_padding(model, inner, features, frame_mask)
    padded = (features, *item_keys) if masked else tuple(k for k in item_keys if k == out_mask)
    return Modality("audio", placeholder, features, item_keys=item_keys, type_id=AUDIO_TYPE, padded=padded)


_ASKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> whether its encoder ignores padding


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes and values up to the kernels' rounding (another length or batch, another kernel)."""
    if a.shape != b.shape:
        return False
    scale = float(a.abs().max()) if a.numel() else 1.0
    return float((a - b).abs().max()) <= 1e-3 * (scale or 1.0)


def _ignores_padding(model: torch.nn.Module, inner: torch.nn.Module, features: str, mask_key: str) -> bool:
    """Whether the audio encoder's rows of a clip ignore zero frames padded after it, as the collator pads a row's
    clips to its longest; asked once per model with one clip of :func:`_clip_frames` frames in the first layout its
    encoder takes, its second half masked, alone and with as many zero frames again. ``True`` on the meta device or
    where the encoder takes none of the layouts (not asked), or no longer clip (a fixed-length tower: every clip has
    its frames). GLM-ASR takes the frame mask but only counts rows with it: its tower attends to the padding."""
    if model in _ASKED:
        return _ASKED[model]
    param = next((p for p in inner.parameters() if p.is_floating_point()), None)
    if param is None or param.is_meta:
        return True
    config = getattr(model.config, "audio_config", None) or getattr(model.config, "encoder_config", None)
    frames = _clip_frames(config)
    mel = int(getattr(config, "num_mel_bins", None) or getattr(config, "input_dim", None) or 80)
    devices = [param.device] if param.device.type == "cuda" else []
    g = torch.Generator().manual_seed(0)

    def encode(clip: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(0)  # the same dropout draws (a model in train mode) for every call
        out = audio_encoder(inner)(**{features: clip.to(param.device, param.dtype), mask_key: mask.to(
            param.device)}, return_dict=True)
        rows = _audio_rows(out)
        return rows.reshape(-1, rows.shape[-1])

    answer = True
    with torch.no_grad(), torch.random.fork_rng(devices=devices):  # training's random streams stay as they were
        for shape, axis in (((1, mel, frames), 2), ((1, frames, mel), 1), ((1, 1, frames * 160), 2)):  # a waveform:
            n = shape[axis]  # 160 samples a frame
            real = (torch.arange(n) < n // 2).to(torch.int64)[None]
            clip = torch.randn(*shape, generator=g) * real.reshape([1] * (len(shape) - 1 - (axis == 1)) + [-1] +
                                                                    [1] * (axis == 1))
            try:
                alone = encode(clip, real)
            except Exception:  # noqa: BLE001 - not this layout
                continue
            more = list(shape)
            more[axis] = n
            try:
                padded = encode(torch.cat([clip, torch.zeros(more)], dim=axis), torch.cat([real, 0 * real], dim=1))
            except Exception:  # noqa: BLE001 - no longer clip: a fixed-length tower (its clips are never padded)
                padded = alone
            answer = _close(alone, padded)
            break
    _ASKED[model] = answer
    return answer


def _audio_rows(out: Any) -> torch.Tensor:
    """The rows an audio encoder's output hands the text model (``pooler_output``, else ``last_hidden_state``)."""
    pooled = getattr(out, "pooler_output", None)
    return pooled if pooled is not None else out.last_hidden_state


def audio_counter(model: torch.nn.Module, inner: torch.nn.Module
                  ) -> Callable[[str, Mapping[str, Any]], list[int]] | None:
    """``count("audio", document) -> [placeholders of each clip]`` (module docstring; ``KeyError`` for another
    modality), or ``None`` where every clip has the same placeholders (no mask)."""
    inputs = audio_inputs(model, inner)
    if inputs is None:
        return None
    out_mask = output_mask_key(model, inner)
    key = out_mask or _frame_mask_key(inputs[1])
    if key is None:
        return None
    lengths = None if out_mask else _lengths_fn(inner)
    placeholder = token(model.config, *AUDIO_TOKENS)

    def count(name: str, ex: Mapping[str, Any]) -> list[int]:
        if name != "audio":
            raise KeyError(name)
        if not out_mask and lengths is None:  # no named rule: the document's placeholder runs, one per clip
            return placeholder_runs(ex["input_ids"], placeholder)
        mask = ex.get(key)
        if mask is None:
            raise ValueError(f"an audio document needs its {key} (the processor's, one row per clip): its "
                             "placeholders are counted from it")
        mask = torch.as_tensor(mask)
        real = mask.reshape(-1, mask.shape[-1]).sum(-1).to(torch.int64)
        if lengths is None:  # a mask of the output rows: its real rows are the placeholders
            return [int(x) for x in real]
        out = lengths(real)
        out = out[-1] if isinstance(out, tuple) else out  # (after the convolutions, after the pooling)
        return [int(x) for x in torch.as_tensor(out).reshape(-1)]

    return count


def placeholder_runs(ids: Any, placeholder: int) -> list[int]:
    """The lengths of the runs of ``placeholder`` in one document's ``ids`` (one run per clip, in order: how its
    processor marked each clip, where the model names no rule to count a clip's rows before encoding it; every
    forward still checks the encoder's rows against them)."""
    flag = torch.as_tensor(ids).reshape(-1) == placeholder
    zero = torch.zeros(1, dtype=torch.int8)
    edges = torch.diff(torch.cat([zero, flag.to(torch.int8), zero]))
    starts, ends = torch.nonzero(edges == 1).reshape(-1), torch.nonzero(edges == -1).reshape(-1)
    return [int(x) for x in ends - starts]


def is_audio_lm(inner: torch.nn.Module | None) -> bool:
    """Whether ``inner`` (:func:`~.structure.inner_vlm`) encodes audio only (``get_audio_features``, no
    ``get_image_features`` / ``get_video_features``)."""
    return inner is not None and (callable(getattr(type(inner), "get_audio_features", None)) or
                                  has_inline_audio(inner)) and \
        not any(callable(getattr(type(inner), n, None)) for n in ("get_image_features", "get_video_features"))


def audio_spec(model: torch.nn.Module, inner: torch.nn.Module) -> VisionSpec:
    """The spec of an audio-language model (audio only: 1-D positions restarting per document).

    Raises:
        VisionRefusal: ``"no placeholder"`` (no audio token in the config) or ``"input not carried"`` (no
            features key its forward and ``get_audio_features`` share, or an encoder that reads the text's attention mask
            or positions; one that reads ``input_ids``, MusicFlamingo, is given each clip's own run).
    """
    family = model.config.model_type
    if token(model.config, *AUDIO_TOKENS) is None:
        raise VisionRefusal("no placeholder", (
            f"{family}'s config has no audio_token_id / audio_token_index: no placeholder tokens mark where a clip's "
            f"features go, so a packed row cannot keep each clip with its document; {fix(model)}"))
    # MusicFlamingo reads each clip's placeholder run from input_ids: given its own (encode_per_clip's runs)
    text = [k for k in _encode_params(inner) if k in ("attention_mask", "position_ids")]
    if text:
        raise VisionRefusal("input not carried", (
            f"{family}: its get_audio_features takes the text's {', '.join(text)}, of which an SP rank holds only "
            "its own part, so a clip's features would depend on how the row is cut; " + fix(model)))
    mod = audio_modality(model, inner)
    if mod is None:
        raise VisionRefusal("input not carried", (
            f"{family}: its get_audio_features takes {', '.join(_encode_params(inner)) or 'no named input'}, none of "
            "which its forward takes, so a packed row has no features key to carry per clip; " + fix(model)))
    count = audio_counter(model, inner)
    layout = VisionLayout(family, (mod,), counted=("audio",) if count is not None else ())
    return VisionSpec(layout, item_tokens=count)


def _clip_frames(audio_config: Any) -> int:
    """The frames of a clip to ask the encoder about: one chunk of Qwen3's tower (``2 * n_window``), a Whisper-like
    tower's fixed input (``2 * max_source_positions``), else 128."""
    for name in ("n_window", "max_source_positions"):
        value = getattr(audio_config, name, None)
        if isinstance(value, int):
            return 2 * value
    return 128


def audio_probe_inputs(model: torch.nn.Module, spec: VisionSpec, device: torch.device, dtype: torch.dtype
                       ) -> dict[str, Any]:
    """``check_model``'s probe of an audio-language model: two text tokens around one clip's placeholders (as many
    as its encoder returns rows for a clip of :func:`_clip_frames` frames).

    Args:
        model: the model; spec: its audio spec; device, dtype: of the features.

    Returns:
        ``model(**inputs)`` keyword arguments.

    Shapes:
        ``input_features [1, mel, frames]`` or ``[1, frames, mel]`` (``num_mel_bins`` / ``input_dim`` of the audio
        config), masks ``[1, frames]``.
    """
    from .structure import inner_vlm

    inner = inner_vlm(model)
    audio = spec.layout.modalities[0]
    config = getattr(model.config, "audio_config", None) or getattr(model.config, "encoder_config", None)
    frames = _clip_frames(config)
    mel = int(getattr(config, "num_mel_bins", None) or getattr(config, "input_dim", None) or 80)
    extra = {k: torch.ones(1, frames, dtype=torch.int64, device=device) for k in audio.item_keys
             if k.endswith("mask") and k != output_mask_key(model, inner)}
    error: Exception | None = None
    for shape in ((1, mel, frames), (1, frames, mel)):  # mel bins first (Whisper-like), or frames first (Granite)
        feats = torch.zeros(*shape, device=device, dtype=dtype)
        try:
            with torch.no_grad():
                out = audio_encoder(inner)(feats, **extra, return_dict=True)
            break
        except Exception as e:  # noqa: BLE001 - the other layout
            error = e
    else:
        raise error
    rows = _audio_rows(out)
    n = int(rows.numel() // rows.shape[-1])
    out_mask = output_mask_key(model, inner)
    if out_mask is not None:
        extra[out_mask] = torch.ones(1, int(rows.shape[-2]), dtype=torch.bool, device=device)
    ids = torch.tensor([[1] + [audio.token_id] * n + [1]], device=device)
    return {"input_ids": ids, audio.pixel_key: feats, **extra}


def encode_per_clip(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    runs: dict[str, Any] | None = None) -> Any:
    """``method(*args, **kwargs)`` (``get_audio_features`` of a row's clips) one clip at a time, as each document
    alone encodes its clip, the outputs' per-clip fields concatenated along the clips. An audio encoder's rows of a
    clip may depend on the clips encoded with it: Granite Speech's conformer normalizes over its batch (BatchNorm),
    Qwen3-Omni's tower pads a batch's chunks to the longest; one clip at a time is each document alone.

    Args:
        method: the encoder; args, kwargs: its call, the features first (``[clips, ...]``); every tensor with as
            many entries along its first axis is split per clip, the rest passed whole.
        runs: where the encoder reads its clips' placeholder runs from ``input_ids``: ``{"token_id", "tokens",
            "windows"}`` (:func:`_encode_with_runs`).

    Returns:
        The first clip's output object with every tensor field the concatenation of the clips'.
    """
    feats = args[0] if args else next(v for v in kwargs.values() if torch.is_tensor(v))
    n = int(feats.shape[0])
    if runs is not None:  # an encoder reading each clip's placeholder run from input_ids (MusicFlamingo)
        return _encode_with_runs(method, args, kwargs, n=n, **runs)
    if n <= 1:
        return method(*args, **kwargs)

    def part(value: Any, i: int) -> Any:
        return value[i:i + 1] if torch.is_tensor(value) and value.dim() and value.shape[0] == n else value

    outs = [method(*(part(a, i) for a in args), **{k: part(v, i) for k, v in kwargs.items()}) for i in range(n)]
    return _joined(outs)


def _encode_with_runs(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *, n: int,
                      token_id: int, tokens: torch.Tensor, windows: torch.Tensor) -> Any:
    """``method`` of an encoder that reads each clip's placeholder run from ``input_ids`` (MusicFlamingo: a clip's
    time stamps are its window's index in its run, a long sample being cut in windows with one run), one clip at a
    time as its document alone sees it: clip ``i``, window ``w`` of its run (from the whole row:
    :func:`~.shard.window_key`), is encoded as the last of ``w + 1`` copies of itself with one run of
    ``(w + 1) * tokens[i]`` placeholders (the encoder's own rule; a window's rows depend on its own frames only);
    its rows are the last copy's.

    Args:
        method, args, kwargs: as :func:`encode_per_clip`; n: the clips; token_id: the audio placeholder;
        tokens, windows: ``[n]`` each clip's placeholders and its window index.
    """
    def part(value: Any, i: int, copies: int) -> Any:
        if torch.is_tensor(value) and value.dim() and value.shape[0] == n:
            return value[i:i + 1].expand(copies, *value.shape[1:])
        return value

    outs = []
    for i in range(n):
        copies, count = int(windows[i]) + 1, int(tokens[i])
        ids = torch.full((1, copies * count), token_id, dtype=torch.long, device=kwargs["input_ids"].device)
        call = {k: part(v, i, copies) for k, v in kwargs.items() if k != "input_ids"}
        out = method(*(part(a, i, copies) for a in args), input_ids=ids, **call)
        for key in list(out.keys()):  # the last copy's
            value = out[key]
            if torch.is_tensor(value) and value.dim():
                out[key] = value[-count:] if key == "pooler_output" else value[-1:]
        outs.append(out)
    return _joined(outs)


def _joined(outs: list[Any]) -> Any:
    """The clips' encoder outputs as one: the first, its tensor fields concatenated over the clips (dim 0)."""
    first = outs[0]
    for key in list(first.keys()):
        values = [o[key] for o in outs]
        if all(torch.is_tensor(v) for v in values):
            first[key] = torch.cat(values, dim=0)
    return first
