"""What hf_hsap must know of a vision-language model to train it on packed rows, derived from the model itself.

A packed row is one sample with many images: every per-item input the family's processor emits is carried in
document order, and each document keeps its own positions. :func:`vision_spec` reads, not a list of families, but
the model (:mod:`.structure`):

- its placeholders (``image_token_id`` / ``image_token_index``, ``video_token_id`` ...);
- which keys its forward and its encoders take: ``image_grid_thw`` (a grid of flattened patches per item, with the
  model's own ``get_rope_index`` per document where it has one), ``pack_image_features`` (any-resolution tiles:
  placeholders counted per image by the model, :mod:`.items`), a Pixtral tower (``image_sizes`` of padded images),
  ``pixel_attention_mask`` in ``get_image_features`` (Idefics: ``[rows, images, C, H, W]``), or one pixel row per
  image; ``token_type_ids`` (image blocks) and ``mm_token_type_ids`` filled from the placeholders; videos where
  ``get_video_features`` takes nothing but the video (and its grid);
- what its encoder returns for a minimal image (asked once per model: the rows the placeholders stand for);
- encoders that take per-item inputs besides the pixels, read from their signatures (:mod:`.derived`: MiniCPM-V's
  crop sizes, LFM2-VL's spatial shapes, DeepSeek-VL-Hybrid's second view, the Q-Former families, Fuyu's patches).

It refuses a model for a structural reason no packing fixes (:data:`.structure.REFUSAL_KINDS`: encoder-decoder,
VQ codes in the vocabulary, no placeholder, no image encoder) or for an input the family needs that packed rows do
not carry yet (named), each with a fix that works; keys the forward takes but packing does not carry are listed in
:attr:`~hf_hsap.data.vision.VisionSpec.uncarried`, and the collator refuses a document that holds one.
"""
from __future__ import annotations

import dataclasses
import sys
import weakref
from typing import Any

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec
from ..log import get_logger
from ..plan.items import encoder_patch_work
from .cross import cross_probe_inputs, cross_spec, is_cross_attention_vlm
from .derived import derived_spec
from .grid import ROPE_INPUTS, grid_spec
from .items import anyres_counter, sizes_counter
from .prefix import is_prefix_lm, position_start
from .structure import (CARRIED_KEYS, CONTROL_KEYS, VisionRefusal, fix, forward_keys, inner_vlm,
                        param_names, required, structural_refusal, token)

__all__ = ["VisionRefusal", "accepted_families", "inner_vlm", "is_vlm", "probe_inputs", "vision_spec"]

logger = get_logger(__name__)
_SPECS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its spec (the encoder is asked once)
_IMAGES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (pixels, inputs, rows) its encoder took


def accepted_families(models: Any) -> frozenset[str]:
    """The families among ``models`` that :func:`vision_spec` accepts (e.g. every family of the multimodal zoo).

    Args:
        models: an iterable of models.

    Returns:
        Their ``config.model_type`` where ``vision_spec`` returns a spec.
    """
    out = set()
    for model in models:
        try:
            vision_spec(model)
        except ValueError:
            continue
        out.add(str(model.config.model_type))
    return frozenset(out)


def is_vlm(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a vision(-audio)-language model with an image encoder."""
    return inner_vlm(model) is not None


def vision_spec(model: torch.nn.Module) -> VisionSpec:
    """The :class:`~hf_hsap.data.vision.VisionSpec` of a vision-language model, for
    ``PackingCollator(max_length, vision=vision_spec(model))``, derived from the model (module docstring).

    Args:
        model: a Transformers vision-language model (``AutoModelForImageTextToText``).

    Returns:
        Its modalities, placeholder tokens, merge factor, per-item keys, (grid families) its own rope index and the
        forward's keys packing does not carry.

    Raises:
        VisionRefusal: a ``ValueError`` naming its ``kind`` (:data:`.structure.REFUSAL_KINDS`), the structure read
            and a fix that works.
    """
    if model in _SPECS:
        return _SPECS[model]
    spec = _with_patch_work(_derive(model), model.config)
    _SPECS[model] = spec
    return spec


def _with_patch_work(spec: VisionSpec, config: Any) -> VisionSpec:
    """``spec`` with every modality's encoder work per patch (:attr:`~hf_hsap.data.vision.Modality.patch_work`,
    from its tower's shape: the audio tower's for audio, else the vision tower's)."""
    mods = tuple(dataclasses.replace(m, patch_work=encoder_patch_work(
        config, "audio_config" if m.name == "audio" else "vision_config")) for m in spec.layout.modalities)
    return dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, modalities=mods))


def _refuse(model: torch.nn.Module, kind: str, what: str) -> VisionRefusal:
    return VisionRefusal(kind, f"{model.config.model_type}: {what}; {fix(model)}")


def _not_carried(model: torch.nn.Module, where: str, keys: list[str]) -> VisionRefusal:
    return _refuse(model, "input not carried", f"{where} needs {', '.join(keys)}, which packed rows do not carry yet")


def _derive(model: torch.nn.Module) -> VisionSpec:
    """:func:`vision_spec` uncached."""
    config = model.config
    if is_cross_attention_vlm(model):  # Mllama, Idefics: text attends to the images by cross-attention
        return cross_spec(model)
    inner = inner_vlm(model)
    refusal = structural_refusal(model, inner)
    if refusal is not None:
        raise refusal
    keys = forward_keys(model)
    derived = derived_spec(model, inner)
    if derived is not None:  # exact in the multimodal zoo in every mode, its encoder's rows checked every forward
        return _with_uncarried(derived, keys)
    encode = type(inner).get_image_features
    if "pixel_values" not in keys | set(param_names(encode)):
        raise _refuse(model, "input not carried", "its forward takes no pixel_values")
    if "pixel_values" in required(type(model).forward):
        raise _refuse(model, "image required", (
            "its forward requires pixel_values on every call, so a packed row (or an SP rank's part of one) "
            "holding no image cannot run"))
    projector = getattr(inner, "multi_modal_projector", None)
    if callable(getattr(projector, "get_visual_indicator_features", None)):
        raise _refuse(model, "encoder layout", (
            "it writes learned embeddings at each image's start / end tokens (get_visual_indicator_features) and "
            "counts them against the images of one forward, which an SP rank's part of a packed row does not hold "
            "whole"))
    missing = [k for k in required(encode) if k not in CARRIED_KEYS]
    if missing:
        raise _not_carried(model, "get_image_features", missing)
    per_token = sorted(k for k in keys if k.endswith("token_type_ids") and k not in CARRIED_KEYS)
    if per_token:
        raise _not_carried(model, "its forward (per token)", per_token)
    text = config.get_text_config()
    bidirectional = getattr(text, "use_bidirectional_attention", None)
    if bidirectional in (True, "all") and not is_prefix_lm(model):  # a prefix-LM's prefixes are blocks (.prefix)
        raise _refuse(model, "bidirectional text", (
            f"its text attends bidirectionally (use_bidirectional_attention={bidirectional!r}: a prefix-LM over "
            "image and prefix), which hf_hsap's causal kernels do not take yet"))
    if bidirectional == "vision":
        raise _refuse(model, "image blocks", (
            "its image placeholders attend to each other on some layer kinds only "
            "(use_bidirectional_attention='vision'), which hf_hsap's image blocks (every layer) do not take yet"))
    image = token(config, "image_token_id", "image_token_index")
    video = token(config, "video_token_id", "video_token_index")
    if "image_grid_thw" in keys:
        spec = _grid_spec(model, inner, keys, image, video)
    else:
        spec = _item_spec(model, inner, keys, image, video)
    _check_rows(model, inner, spec)
    return _with_uncarried(spec, keys)


def _with_uncarried(spec: VisionSpec, keys: frozenset[str]) -> VisionSpec:
    """``spec`` with the forward's keys it does not carry (:attr:`~hf_hsap.data.vision.VisionSpec.uncarried`)."""
    carried = {k for m in spec.layout.modalities for k in (m.pixel_key, *m.item_keys)} | {spec.token_type_key}
    uncarried = tuple(sorted(keys - CONTROL_KEYS - carried))
    return VisionSpec(spec.layout, rope_index=spec.rope_index, token_type_key=spec.token_type_key,
                      item_tokens=spec.item_tokens, document=spec.document, uncarried=uncarried)


def _video_takes_only(inner: torch.nn.Module, allowed: set[str], video: int) -> bool:
    """Whether ``get_video_features`` exists, takes nothing but ``allowed`` (and encoder options), and the model
    marks a video's features by its own placeholder ``video`` (GLM-4V marks them with the image token, told apart
    by ``mm_token_type_ids`` only, which the packed-row planner does not count per modality yet)."""
    encode = getattr(type(inner), "get_video_features", None)
    if not callable(encode) or set(param_names(encode)) - CONTROL_KEYS - allowed:
        return False
    mask = getattr(inner, "get_placeholder_mask", None)
    if not callable(mask):
        return False
    embed = inner.get_input_embeddings().weight
    ids = torch.tensor([[video]], device=embed.device)
    try:
        with torch.no_grad():
            masks = mask(ids, inputs_embeds=torch.zeros(1, 1, embed.shape[-1], dtype=embed.dtype, device=embed.device))
        return isinstance(masks, tuple) and len(masks) == 2 and bool(masks[1].any()) and not bool(masks[0].any())
    except Exception:  # noqa: BLE001 - a mask the model cannot make of one video token (or on meta): not carried
        return False


def _grid_spec(model: torch.nn.Module, inner: torch.nn.Module, keys: frozenset[str], image: int,
               video: int | None) -> VisionSpec:
    """Flattened patches with a ``[t, h, w]`` grid per item (Qwen-VL-like), read from the model by
    :func:`.grid.grid_spec` (videos, GLM-4V's frames as images, the omni thinkers' audios, the rope index called
    by its signature); refused where the rope index takes inputs packed rows do not give it per document."""
    rope = getattr(inner, "get_rope_index", None)
    if callable(rope):
        other = sorted(set(param_names(rope)) - ROPE_INPUTS - keys)
        if other:
            raise _refuse(model, "input not carried", (
                f"its rope index (get_rope_index) takes {', '.join(other)}, which packed rows do not give it per "
                "document yet"))
    return grid_spec(model, inner, model.config.model_type, image, video)


def _item_spec(model: torch.nn.Module, inner: torch.nn.Module, keys: frozenset[str], image: int,
               video: int | None) -> VisionSpec:
    """Items along an axis of the pixels: any-resolution tiles (``pack_image_features``), a Pixtral tower
    (``image_sizes``), Idefics' images per row (``pixel_attention_mask``), or one pixel row per image; videos
    ``[videos, frames, C, H, W]`` where ``get_video_features`` takes nothing but them."""
    config = model.config
    family = config.model_type
    encode = param_names(type(inner).get_image_features)
    videos = ()
    if video is not None and "pixel_values_videos" in keys and \
            _video_takes_only(inner, {"pixel_values_videos"}, video):
        videos = (Modality("video", video, "pixel_values_videos", type_id=2),)
    types = "token_type_ids" if "token_type_ids" in keys else "mm_token_type_ids" if "mm_token_type_ids" in keys \
        else None
    if callable(getattr(inner, "pack_image_features", None)) and "image_sizes" in encode:
        mod = Modality("image", image, "pixel_values", item_keys=("image_sizes",), padded=("pixel_values",))
        count = anyres_counter(inner, one_image_per_document="batch_num_images" in encode)
        return VisionSpec(VisionLayout(family, (mod, *videos), counted=("image",)), item_tokens=count,
                          token_type_key=types)
    if getattr(getattr(config, "vision_config", None), "model_type", None) == "pixtral" and "image_sizes" in keys:
        mod = Modality("image", image, "pixel_values", item_keys=("image_sizes",), padded=("pixel_values",))
        ratio = int(config.vision_config.patch_size) * int(getattr(config, "spatial_merge_size", None) or 1)
        return VisionSpec(VisionLayout(family, (mod, *videos), counted=("image",)), item_tokens=sizes_counter(ratio),
                          token_type_key=types)
    if "pixel_attention_mask" in encode:
        mod = Modality("image", image, "pixel_values", item_keys=("pixel_attention_mask",), item_axis=1)
        return VisionSpec(VisionLayout(family, (mod, *videos)), token_type_key=types)
    item_keys = tuple(k for k in ("image_sizes", "pixel_mask", "image_position_ids") if k in keys)
    mod = Modality("image", image, "pixel_values", item_keys=item_keys)
    prefix = is_prefix_lm(model)  # PaliGemma: each document's image and prompt are one bidirectional block
    layout = VisionLayout(family, (mod, *videos), image_blocks=types == "token_type_ids" and not prefix,
                          prefix_blocks=prefix, position_start=position_start(model) if prefix else 0)
    return VisionSpec(layout, token_type_key=types)


def _check_rows(model: torch.nn.Module, inner: torch.nn.Module, spec: VisionSpec) -> None:
    """Ask the encoder for a minimal image of the derived layout (a grid of 2 x 2 merge windows, or one image of
    the tower's size) and refuse a family whose encoder takes none of the layout's pixel shapes, returns rows of
    another width than the text's embeddings, or (grid) other than one row per merge window: an item's placeholders
    are derived from that. Skipped for a model on the meta device and for counted items (asked per image)."""
    if spec.counts("image") or any(p.is_meta for p in inner.parameters()):
        return
    tower = next((getattr(inner, n) for n in ("visual", "vision_tower", "vision_model", "vision_encoder")
                  if isinstance(getattr(inner, n, None), torch.nn.Module)), inner)
    param = next((p for p in tower.parameters() if p.is_floating_point()), None)  # not a quantized weight's
    if param is None:
        return
    errors = []
    devices = [param.device] if param.device.type == "cuda" else []
    for pixels, extra, expect in _minimal_images(model, spec, param.device):
        try:
            with torch.random.fork_rng(devices=devices):  # training's random streams stay as they were
                rows, width = _feature_rows(inner, pixels.to(param.device, param.dtype), **extra)
            _IMAGES[model] = pixels, extra, rows
            break
        except Exception as e:  # noqa: BLE001 - any failure of the encoder on the layout's pixels
            errors.append(f"{tuple(pixels.shape)}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    else:
        raise _refuse(model, "encoder layout", (
            f"its get_image_features takes none of the pixel shapes of the layout derived from its forward "
            f"({'; '.join(errors)})" if errors else
            "its vision config gives no image size (vision_config.image_size) to derive one image's pixels from"))
    hidden = getattr(model.config.get_text_config(), "hidden_size", None)
    if hidden is not None and width != hidden:
        raise _refuse(model, "encoder layout", (
            f"its get_image_features returns rows {width} wide where its text embeddings are {hidden}: its forward "
            "does not place them as one row per placeholder"))
    if expect is not None and rows != expect:
        raise _refuse(model, "encoder layout", (
            f"its encoder returns {rows} rows for a grid of {expect} merge windows (rows of its own besides one per "
            "window), which the packed-row planner does not count yet"))


def _geometry(vision: Any) -> tuple[int, int | None, int, int]:
    """``(channels, image side or None, patch side, frames per temporal patch)`` of a vision config."""
    channels = int(getattr(vision, "num_channels", None) or getattr(vision, "in_channels", None)
                   or getattr(vision, "in_chans", None) or 3)
    size = getattr(vision, "image_size", None)
    size = int(size[0] if isinstance(size, (list, tuple)) else size) if size else None
    patch = getattr(vision, "patch_size", None) or 1
    patch = int(patch[0] if isinstance(patch, (list, tuple)) else patch)
    frames = int(getattr(vision, "temporal_patch_size", None) or getattr(vision, "patch_temporal", None) or 1)
    return channels, size, patch, frames


def _minimal_images(model: torch.nn.Module, spec: VisionSpec, device: torch.device
                    ) -> list[tuple[torch.Tensor, dict[str, Any], int | None]]:
    """``[(pixels, other get_image_features inputs, expected rows or None)]``: the smallest image of the layout in
    each pixel shape it may take."""
    image = spec.layout.modalities[0]
    vision = getattr(model.config, "vision_config", None)
    if vision is None:
        return []
    c, size, patch, frames = _geometry(vision)
    if image.grid_key is not None:  # 2 x 2 merge windows of patches, flattened or not
        side = int(round(spec.layout.merge ** 0.5))
        n = 4 * side * side
        grid = {image.grid_key: torch.tensor([[1, 2 * side, 2 * side]], device=device)}
        return [(torch.ones(n, c * frames * patch * patch), grid, 4), (torch.ones(n, c, patch, patch), grid, 4)]
    if "image_position_ids" in image.item_keys:  # patches with their (x, y): one pooling window's square
        side = int(getattr(vision, "pooling_kernel_size", None) or 1) * 2
        xy = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="xy"), -1)
        return [(torch.ones(1, side * side, c * patch * patch), {"image_position_ids": xy.reshape(1, -1, 2).to(device)},
                 None)]
    if size is None:
        return []
    if image.item_axis == 1:  # Idefics: [rows, images, C, H, W] with its pixel mask (all-zero pixels are padding)
        mask = torch.ones(1, 1, size, size, dtype=torch.bool, device=device)
        return [(torch.ones(1, 1, c, size, size), {"pixel_attention_mask": mask}, None),
                (torch.ones(1, 1, c, size, size), {"pixel_attention_mask": mask[:, :, 0, 0]}, None)]  # one per tile
    return [(torch.ones(1, c, size, size), {}, None)]


def _feature_rows(inner: torch.nn.Module, pixels: torch.Tensor, **extra: Any) -> tuple[int, int]:
    """``(rows, width)`` of the placeholder rows the model's encoder makes of ``pixels`` (asked, not derived from
    the config)."""
    with torch.no_grad():
        out = inner.get_image_features(pixel_values=pixels, return_dict=True, **extra).pooler_output
    if torch.is_tensor(out):
        return int(out.numel() // out.shape[-1]), int(out.shape[-1])
    return int(sum(v.numel() // v.shape[-1] for v in out)), int(out[0].shape[-1])


def probe_inputs(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> dict[str, Any] | None:
    """A two-text-token forward's inputs with one smallest image between them, for ``check_model``'s probe (the
    decoder must get the keyword arguments with images too); ``None`` for a model without a vision spec.

    Args:
        model: the model; device, dtype: where and in which dtype its pixels go.

    Returns:
        ``model(**inputs)`` keyword arguments (zero pixels), or ``None``.
    """
    try:
        spec = vision_spec(model)
    except ValueError:
        return None
    if spec.layout.cross_key is not None:  # cross-attention (Mllama, Idefics)
        return cross_probe_inputs(model, spec, device, dtype)
    image = spec.layout.modalities[0]
    vision = model.config.vision_config
    extra: dict[str, Any] = {}
    if model in _IMAGES:  # the image the encoder took when the spec was derived
        pixels, given, n_tokens = _IMAGES[model]
        extra = {k: v.to(device) for k, v in given.items()}
    elif image.grid_key is not None and image.grid_dims == 2:  # NaViT: one crop of one merge block [1, C, p, cells*p]
        side = int(round(spec.layout.merge ** 0.5))
        pixels = torch.zeros(1, getattr(vision, "num_channels", 3), image.cell_size, side * side * image.cell_size)
        extra[image.grid_key] = torch.tensor([[side, side]], device=device)
        n_tokens = 1
    elif image.grid_key is not None:
        side = int(round(spec.layout.merge ** 0.5))  # one placeholder: one merge window of patches
        channels = getattr(vision, "in_channels", getattr(vision, "in_chans", 3))
        dim = channels * getattr(vision, "temporal_patch_size", 1) * vision.patch_size ** 2
        pixels = torch.zeros(side * side, dim)
        extra[image.grid_key] = torch.tensor([[1, side, side]], device=device)
        n_tokens = 1
    else:
        size = vision.image_size
        h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]
        channels = getattr(vision, "num_channels", 3)
        pixels = torch.zeros(1, channels, h, w)
        if spec.counts("image"):  # one image of the tower's size, with its image_sizes
            extra["image_sizes"] = torch.tensor([[h, w]], device=device)
            n_tokens = spec.item_tokens("image", {"image_sizes": extra["image_sizes"]})[0]
            inner = inner_vlm(model)
            if callable(getattr(inner, "pack_image_features", None)):  # any-resolution: its tiles (the model's count)
                tiles = sys.modules[type(inner).__module__].image_size_to_num_patches(
                    image_size=[h, w], grid_pinpoints=model.config.image_grid_pinpoints, patch_size=h)
                pixels = torch.zeros(1, int(tiles), channels, h, w)
        elif image.item_axis == 1:  # Idefics: [rows, images, C, H, W]; an all-zero image would be padding
            pixels = torch.ones(1, 1, channels, h, w)
            n_tokens = _feature_rows(inner_vlm(model), pixels.to(device, dtype))[0]
        else:
            n_tokens = _feature_rows(inner_vlm(model), pixels.to(device, dtype))[0]
    ids = torch.tensor([[1] + [image.token_id] * n_tokens + [1]], device=device)
    if spec.token_type_key == "mm_token_type_ids":
        extra["mm_token_type_ids"] = (ids == image.token_id).to(torch.int64)
    return {"input_ids": ids, image.pixel_key: pixels.to(device, dtype), **extra}
