"""Grid-layout vision-language models (Qwen-VL-like): what the packing collator must know, asked from the model.

A grid family gives each image or video flattened patches (``pixel_values [rows, D]``) and a ``[t, h, w]`` grid;
its ``t * h * w / merge`` placeholders take the merged patches in order, and each document keeps its own
multimodal rotary positions (the model's ``get_rope_index`` on that document alone). Everything here is derived
from the model, not from a list of family names:

- the merge factor: the vision config's ``spatial_merge_size`` (or ``merge_size``) squared, and for videos its
  ``temporal_merge_size`` (ERNIE-4.5-VL's resampler merges a video's temporal patches in pairs, an image's not);
- the modalities: images, and videos where ``get_video_features`` takes a ``video_grid_thw``; the per-item keys
  the rope index reads besides the grid (the seconds per temporal patch: the forward's ``second_per_grid_ts`` or
  ``video_second_per_grid``, the rope index's ``second_per_grids``);
- the rope index: ``get_rope_index`` called with the keywords its signature takes (the omni thinkers take no
  ``mm_token_type_ids``, name the seconds per grid ``second_per_grids`` and index by an ``attention_mask``);
- videos whose placeholders are the image token (GLM-4V: the model's own ``get_placeholder_mask`` marks the image
  token for both, :func:`video_placeholder`): such a model cannot tell an image's placeholders from a video frame's in one forward, so
  :func:`frames_as_images` gives it each video frame as an image of grid ``[1, h, w]`` (its ``get_video_features``
  encodes a video as exactly those frames, and its rope index places a frame as it places such an image);
- items whose placeholders are not ``t * h * w / merge`` (a merge size per item, rows of the encoder's own):
  counted per item from the model, :mod:`.grid_rows`;
- audios (the omni thinkers): :mod:`.audio`, their placeholders counted by the audio tower, each audio's real frames
  handed to the rope index (``audio_seqlens``).
"""
from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec
from .audio import audio_counter, audio_modality
from .grid_rows import grid_counter

__all__ = ["ROPE_INPUTS", "frames_as_images", "grid_merge", "grid_spec", "is_grid_model", "rope_index",
           "takes_text_row", "video_marks", "video_placeholder"]

# the rope index's inputs rope_index() gives it from one document (besides the forward's per-item keys)
ROPE_INPUTS = frozenset({"self", "kwargs", "input_ids", "mm_token_type_ids", "attention_mask", "image_grid_thw",
                         "video_grid_thw", "second_per_grid_ts", "second_per_grids", "audio_seqlens",
                         "use_audio_in_video"})
# a video's seconds per temporal patch, by its names: the forward's (Qwen2.5-VL, the omni thinkers) and the rope index's
_SECONDS_KEYS = ("second_per_grid_ts", "video_second_per_grid", "second_per_grids")


def _params(fn: Any) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def is_grid_model(inner: torch.nn.Module) -> bool:
    """Whether the model's image features take a ``[t, h, w]`` grid per image (``image_grid_thw``)."""
    return "image_grid_thw" in _params(getattr(inner, "get_image_features", None))


def grid_merge(config: Any) -> int:
    """Patches per placeholder: the vision config's ``merge_kernel_size`` product (Kimi-K2.5), else its
    ``spatial_merge_size`` (or ``merge_size``) squared (1 without)."""
    vision = config.vision_config
    kernel = getattr(vision, "merge_kernel_size", None)  # Kimi-K2.5: an h x w kernel (the temporal axis pooled)
    if kernel:
        return math.prod(int(k) for k in kernel)
    return int(getattr(vision, "spatial_merge_size", None) or getattr(vision, "merge_size", None) or 1) ** 2


def video_placeholder(inner: torch.nn.Module, image: int, video: int | None) -> str | None:
    """Which token the model's own ``get_placeholder_mask`` marks as a video's placeholder, asked on the two tokens
    alone: ``"video"`` (its video token), ``"image"`` (the image token: GLM-4V), or ``None`` (neither, e.g. the image
    token inside video start / end tokens, or a mask that needs more than the ids: the videos are not carried)."""
    mask_fn = getattr(inner, "get_placeholder_mask", None)
    if not callable(mask_fn) or video is None:
        return None
    try:
        with torch.no_grad():
            masks = mask_fn(torch.tensor([[image, video]]), inputs_embeds=torch.zeros(1, 2, 1))
        marked = masks[1].reshape(2).tolist()
    except Exception:  # noqa: BLE001 - a mask that needs more than the ids
        return None
    return {(False, True): "video", (True, False): "image"}.get((bool(marked[0]), bool(marked[1])))


def video_marks(model: torch.nn.Module, inner: torch.nn.Module, image: int, video: int | None) -> str | None:
    """How a grid family's videos are carried: ``"video"`` (their own modality), ``"image"`` (frames as images), or
    ``None`` (not carried: no ``get_video_features`` taking a ``video_grid_thw``, a placeholder mask that does not
    tell, or a tower that pools the temporal axis (Kimi-K2.5's ``merge_kernel_size``: a video's placeholders are not
    ``t * h * w / merge``))."""
    if "video_grid_thw" not in _params(getattr(inner, "get_video_features", None)):
        return None
    if getattr(getattr(model.config, "vision_config", None), "merge_kernel_size", None):
        return None
    return video_placeholder(inner, image, video)


def rope_index(inner: torch.nn.Module) -> Callable[..., torch.Tensor] | None:
    """``(input_ids [1, n], mm_token_type_ids [1, n], grids, ...) -> [3, 1, n]``: the model's own ``get_rope_index``
    on one document, called with the keywords its signature takes; ``None`` without one."""
    fn = getattr(inner, "get_rope_index", None)
    if not callable(fn):
        return None
    params = _params(fn)
    seconds = next((k for k in _SECONDS_KEYS if k in params), None)

    def index(**doc: Any) -> torch.Tensor:
        for key in _SECONDS_KEYS:
            if key in doc and seconds is not None and key != seconds:
                doc[seconds] = doc.pop(key)
        if "attention_mask" in params and doc.get("attention_mask") is None:  # the omni thinkers index by it
            doc["attention_mask"] = torch.ones_like(doc["input_ids"])
        if "audio_seqlens" in params and doc.get("feature_attention_mask") is not None:  # each audio's real frames
            doc["audio_seqlens"] = torch.as_tensor(doc.pop("feature_attention_mask")).sum(-1)
        return fn(**{k: v for k, v in doc.items() if k in params})[0]  # [3, 1, n]

    return index


def takes_text_row(model: torch.nn.Module, inner: torch.nn.Module) -> bool:
    """Whether the text model takes Transformers' packed multimodal positions ``[1 + rows, B, L]`` (row 0 the text
    positions), asked on one zero token: ``False`` where it refuses them and takes its ``rows`` rotary rows alone
    (HunYuan-VL); ``True`` where it takes them, or where it cannot be asked (no ``language_model``, the meta device,
    no ``mrope_section``)."""
    text = getattr(inner, "language_model", None)
    rows = len((getattr(model.config.get_text_config(), "rope_parameters", None) or {}).get("mrope_section") or ())
    param = next((p for p in inner.parameters() if p.is_floating_point()), None)
    if not isinstance(text, torch.nn.Module) or not rows or param is None or param.is_meta:
        return True
    width = int(model.config.get_text_config().hidden_size)
    embeds = torch.zeros(1, 1, width, device=param.device, dtype=param.dtype)

    def runs(n: int) -> bool:
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[param.device] if param.device.type == "cuda" else []):
                text(inputs_embeds=embeds, position_ids=torch.zeros(n, 1, 1, dtype=torch.int64, device=param.device),
                     use_cache=False)
            return True
        except (ValueError, RuntimeError):
            return False

    return runs(rows + 1) or not runs(rows)


def frames_as_images(image: int, *, types_key: str = "mm_token_type_ids", video_type: int = 2
                     ) -> Callable[[Mapping[str, Any], int], dict[str, Any]]:
    """The document transform of a family whose video frames are image placeholders (:func:`video_placeholder`:
    ``"image"``).

    Args:
        image: the image (and video frame) placeholder token; types_key: the per-token modality key the processor
            gives (1 image, ``video_type`` video); video_type: a video token's type.

    Returns:
        ``document(example, n) -> example`` with every video frame as an image of grid ``[1, h, w]``, in placeholder
        order (pixel rows and grids of images and frames interleaved as their placeholder runs are), types 1.

    Raises:
        ValueError (from the transform): a document with videos but no ``types_key``, or placeholder runs that do
        not match its grids.
    """
    def document(ex: Mapping[str, Any], n: int) -> dict[str, Any]:
        if ex.get("pixel_values_videos") is None:
            return dict(ex)
        if ex.get(types_key) is None or ex.get("video_grid_thw") is None:
            raise ValueError(f"example {n} has pixel_values_videos but no {types_key} / video_grid_thw: this "
                             "family's video frames use the image placeholder, so only the processor's "
                             f"{types_key} tells them apart; keep the processor's outputs with the document")
        ids = torch.as_tensor(ex["input_ids"]).reshape(-1)
        types = torch.as_tensor(ex[types_key]).reshape(-1)
        place = ids == image
        starts = place & torch.cat([torch.tensor([True]), ~place[:-1] | (types[1:] != types[:-1])])
        run_types = types[starts].tolist()  # one entry per placeholder run: 1 image, video_type a video frame
        v_grid = torch.as_tensor(ex["video_grid_thw"]).reshape(-1, 3).to(torch.int64)
        frames = [(int(f), int(h), int(w)) for t, h, w in v_grid.tolist() for f in range(t)]
        i_grid = torch.as_tensor(ex["image_grid_thw"]).reshape(-1, 3).to(torch.int64) \
            if ex.get("image_grid_thw") is not None else torch.zeros(0, 3, dtype=torch.int64)
        if run_types.count(video_type) != len(frames) or len(run_types) - len(frames) != len(i_grid):
            raise ValueError(f"example {n}: {run_types.count(video_type)} video placeholder runs and "
                             f"{len(run_types) - run_types.count(video_type)} image runs, but its grids hold "
                             f"{len(frames)} video frames and {len(i_grid)} images; tokenize each document with "
                             "the model's processor and keep its pixels with it")
        v_pix = torch.as_tensor(ex["pixel_values_videos"])
        i_pix = torch.as_tensor(ex["pixel_values"]) if ex.get("pixel_values") is not None else v_pix[:0]
        i_rows = i_grid.prod(dim=1).tolist()
        pieces, grids, i_at, f_at, i_row, v_row = [], [], 0, 0, 0, 0
        for kind in run_types:
            if kind == video_type:
                _, h, w = frames[f_at]
                pieces.append(v_pix[v_row:v_row + h * w])
                grids.append([1, h, w])
                f_at, v_row = f_at + 1, v_row + h * w
            else:
                pieces.append(i_pix[i_row:i_row + i_rows[i_at]])
                grids.append(i_grid[i_at].tolist())
                i_row, i_at = i_row + i_rows[i_at], i_at + 1
        out = {k: v for k, v in ex.items() if k not in ("pixel_values_videos", "video_grid_thw")}
        out["pixel_values"] = torch.cat(pieces)
        out["image_grid_thw"] = torch.tensor(grids, dtype=torch.int64)
        out[types_key] = torch.where(types == video_type, torch.ones_like(types), types)
        return out

    return document


def grid_spec(model: torch.nn.Module, inner: torch.nn.Module, family: str, image: int, video: int | None
              ) -> VisionSpec:
    """The :class:`VisionSpec` of a grid family (see the module docstring).

    Args:
        model: the model (its forward's keys); inner: the module with ``get_image_features``; family: its model
            type; image, video: the placeholder tokens (``video``: ``None`` without).

    Returns:
        Its spec: images, videos (as a modality, or as frames of images), audios, merge factor, rope index, token
        types.
    """
    merge = grid_merge(model.config)
    rope = rope_index(inner)
    rope_params = _params(getattr(inner, "get_rope_index", None))
    mods = [Modality("image", image, "pixel_values", "image_grid_thw", ("image_grid_thw",), 1)]
    document = None
    marks = video_marks(model, inner, image, video)
    if marks == "image":
        document = frames_as_images(image)
    elif marks == "video":
        forward = _params(type(model).forward)
        extra = tuple(k for k in _SECONDS_KEYS if k in forward)[:1]  # the seconds per grid the forward takes
        time_merge = int(getattr(model.config.vision_config, "temporal_merge_size", None) or 1)  # ERNIE-4.5-VL
        mods.append(Modality("video", video, "pixel_values_videos", "video_grid_thw", ("video_grid_thw", *extra), 2,
                             time_merge=time_merge))
    mods, counters, keep = grid_counter(model, inner, mods, frozenset(_params(type(model).forward)), merge=merge)
    if keep is not None:  # per-item keep masks (VideoLLaMA3's video_compression_mask), after any frames as images
        document = keep if document is None else _then(document, keep)
    audio = audio_modality(model, inner)
    if audio is not None:
        mods.append(audio)
        counters["audio"] = functools.partial(audio_counter(inner), "audio")
    takes_types = "mm_token_type_ids" in _params(type(model).forward)
    layout = VisionLayout(family, tuple(mods), merge=merge, counted=tuple(counters),
                          rope_rows_only=rope is not None and not takes_text_row(model, inner))
    return VisionSpec(layout, rope_index=rope, token_type_key="mm_token_type_ids" if takes_types else None,
                      item_tokens=_by_name(counters) if counters else None, document=document)


Document = Callable[[Mapping[str, Any], int], dict[str, Any]]  # VisionSpec.document


def _then(first: Document, second: Document) -> Document:
    """The document transform ``second(first(example))``."""
    def document(ex: Mapping[str, Any], n: int) -> dict[str, Any]:
        return second(first(ex, n), n)
    return document


def _by_name(counters: Mapping[str, Callable[[Mapping[str, Any]], list[int]]]
             ) -> Callable[[str, Mapping[str, Any]], list[int]]:
    """``count(name, document)``: the counter of modality ``name`` (``KeyError`` for a modality not counted)."""
    def count(name: str, ex: Mapping[str, Any]) -> list[int]:
        return counters[name](ex)
    return count
