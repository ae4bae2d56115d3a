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
from .audio import audio_probe_inputs, audio_spec, is_audio_lm
from .cross import cross_probe_inputs, cross_spec, is_cross_attention_vlm
from .derived import derived_spec
from .grid import ROPE_INPUTS, grid_spec
from .grid_rows import vision_geometry
from .indicators import boundary_check, boundary_ids, has_indicators, indicators_supported
from .items import anyres_counter, sizes_counter
from .layer_blocks import vision_blocks
from .marked import marked_probe_inputs
from .markers import marker_keys
from .pooled import pooled_probe_inputs
from .prefix import is_prefix_lm, position_start
from .qformer import video_qformer_probe_inputs
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
    if is_audio_lm(inner):  # an audio-language model (Voxtral, AudioFlamingo 3, ...): its clips only
        refusal = structural_refusal(model, None)
        if refusal is not None and refusal.kind == "encoder-decoder":
            raise refusal
        return _with_uncarried(audio_spec(model, inner), forward_keys(model))
    refusal = structural_refusal(model, inner)
    if refusal is not None:
        raise refusal
    keys = forward_keys(model)
    derived = derived_spec(model, inner)
    if derived is not None:  # exact in the multimodal zoo in every mode, its encoder's rows checked every forward
        return _with_uncarried(derived, keys)
    encode = getattr(type(inner), "get_image_features", None)
    if encode is None:  # a video-only encoder not derived above
        raise _refuse(model, "no image encoder", "it has get_video_features but no get_image_features, and its videos "
                                                 "are not queried by a Q-Former (the video-only layout hf_hsap takes)")
    if "pixel_values" not in keys | set(param_names(encode)):
        raise _refuse(model, "input not carried", "its forward takes no pixel_values")
    if "pixel_values" in required(type(model).forward):
        raise _refuse(model, "image required", (
            "its forward requires pixel_values on every call, so a packed row (or an SP rank's part of one) "
            "holding no image cannot run"))
    indicators = has_indicators(inner)  # Ovis 2.5: learned rows over each item's start / end tokens (.indicators)
    if indicators and not indicators_supported(model, inner):
        raise _refuse(model, "encoder layout", (
            "it writes learned embeddings at each image's start / end tokens (get_visual_indicator_features) in a "
            "merge that counts them against the images of one forward, and its config or merge is not the one "
            "hf_hsap writes those rows for (hf_hsap.multimodal.indicators)"))
    missing = [k for k in required(encode) if k not in CARRIED_KEYS]
    if missing:
        raise _not_carried(model, "get_image_features", missing)
    markers = marker_keys(config, keys)  # ERNIE-4.5-VL's MoE routing types (placeholders and their start / end)
    per_token = sorted(k for k in keys if k.endswith("token_type_ids") and k not in CARRIED_KEYS and k not in markers)
    if per_token:
        raise _not_carried(model, "its forward (per token)", per_token)
    text = config.get_text_config()
    bidirectional = getattr(text, "use_bidirectional_attention", None)
    if bidirectional in (True, "all") and not is_prefix_lm(model):  # a prefix-LM's prefixes are blocks (.prefix)
        raise _refuse(model, "bidirectional text", (
            f"its text attends bidirectionally (use_bidirectional_attention={bidirectional!r}: a prefix-LM over "
            "image and prefix), which hf_hsap's causal kernels do not take yet"))
    image = token(config, "image_token_id", "image_token_index")
    video = token(config, "video_token_id", "video_token_index")
    if "image_grid_thw" in keys:
        spec = _grid_spec(model, inner, keys, image, video)
    else:
        spec = _item_spec(model, inner, keys, image, video)
    spec = _check_rows(model, inner, spec)
    if indicators:  # each document's start / end tokens checked against its items, as the model does alone
        check = boundary_check(config, grid_keys={m.name: m.grid_key for m in spec.layout.modalities if m.grid_key})
        spec = dataclasses.replace(spec, document=check if spec.document is None else _chained(spec.document, check))
    return _with_uncarried(dataclasses.replace(spec, token_keys=markers), keys)


def _chained(first: Any, then: Any) -> Any:
    """``document(example, n)``: ``first``'s rewrite, then ``then``'s."""
    return lambda ex, n: then(first(ex, n), n)


def _with_uncarried(spec: VisionSpec, keys: frozenset[str]) -> VisionSpec:
    """``spec`` with the forward's keys it does not carry (:attr:`~hf_hsap.data.vision.VisionSpec.uncarried`)."""
    carried = {k for m in spec.layout.modalities for k in (m.pixel_key, *m.item_keys)} | {spec.token_type_key} | \
        set(spec.token_keys)
    return dataclasses.replace(spec, uncarried=tuple(sorted(keys - CONTROL_KEYS - carried)))


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
    sections = (getattr(model.config.get_text_config(), "rope_parameters", None) or {}).get("mrope_section") or ()
    if callable(rope) and len(sections) not in (0, 3):  # e.g. a HunYuan-VL with 4 axes (its last three: w, h, image)
        raise _refuse(model, "input not carried", (
            f"its rope index gives {len(sections)} rotary rows (rope_parameters['mrope_section'] = {list(sections)}), "
            "but packed rows carry 3 per token (Transformers' packed [4, B, L] with the text positions) yet"))
    if callable(rope):
        other = sorted(set(param_names(rope)) - ROPE_INPUTS - keys)
        if other:
            raise _refuse(model, "input not carried", (
                f"its rope index (get_rope_index) takes {', '.join(other)}, which packed rows do not give it per "
                "document yet"))
    try:
        return grid_spec(model, inner, model.config.model_type, image, video)
    except VisionRefusal:
        raise
    except ValueError as e:  # rows per item that are no formula of the grid (.grid_rows)
        raise _refuse(model, "encoder layout", str(e)) from e


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
    blocks = types == "token_type_ids" and not prefix or vision_blocks(config.get_text_config())
    layout = VisionLayout(family, (mod, *videos), image_blocks=blocks,
                          prefix_blocks=prefix, position_start=position_start(model) if prefix else 0)
    return VisionSpec(layout, token_type_key=types)


def _check_rows(model: torch.nn.Module, inner: torch.nn.Module, spec: VisionSpec) -> VisionSpec:
    """Ask the encoder for a minimal image of the derived layout (a grid of 2 x 2 merge windows, or one image of
    the tower's size) and refuse a family whose encoder takes none of the layout's pixel shapes, returns rows of
    another width than the text's embeddings, or (grid) other than one row per merge window: an item's placeholders
    are derived from that. Skipped for a model on the meta device and for counted items (asked per image).

    Returns:
        ``spec``, or, for a grid family whose encoder takes one pixel row per placeholder with the grid counted in
        placeholders (Inkling 2: rows of merge x merge patches), ``spec`` with one pixel row per placeholder
        (``merge`` 1)."""
    if spec.counts("image") or any(p.is_meta for p in inner.parameters()):
        return spec
    tower = next((getattr(inner, n) for n in ("visual", "vision_tower", "vision_model", "vision_encoder")
                  if isinstance(getattr(inner, n, None), torch.nn.Module)), inner)
    param = next((p for p in tower.parameters() if p.is_floating_point()), None)  # not a quantized weight's
    if param is None:
        return spec
    errors = []
    devices = [param.device] if param.device.type == "cuda" else []
    for pixels, extra, expect, merge in _minimal_images(model, spec, param.device):
        try:
            with torch.random.fork_rng(devices=devices):  # training's random streams stay as they were
                rows, width = _feature_rows(inner, pixels.to(param.device, param.dtype), **extra)
            _IMAGES[model] = pixels, extra, rows
            if merge != spec.layout.merge:
                spec = dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, merge=merge))
            break
        except Exception as e:  # noqa: BLE001 - any failure of the encoder on the layout's pixels
            errors.append(f"{tuple(pixels.shape)}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    else:
        raise _refuse(model, "encoder layout", (
            f"its get_image_features takes none of the pixel shapes of the layout derived from its forward "
            f"({'; '.join(errors)})" if errors else
            "its vision config gives no image size (vision_config.image_size) nor patch size to derive one image's "
            "pixels from"))
    hidden = getattr(model.config.get_text_config(), "hidden_size", None)
    if hidden is not None and width != hidden:
        raise _refuse(model, "encoder layout", (
            f"its get_image_features returns rows {width} wide where its text embeddings are {hidden}: its forward "
            "does not place them as one row per placeholder"))
    if expect is not None and rows != expect:
        raise _refuse(model, "encoder layout", (
            f"its encoder returns {rows} rows for a grid of {expect} merge windows (rows of its own besides one per "
            "window), which the packed-row planner does not count yet"))
    return spec


def _minimal_images(model: torch.nn.Module, spec: VisionSpec, device: torch.device
                    ) -> list[tuple[torch.Tensor, dict[str, Any], int | None, int]]:
    """``[(pixels, other get_image_features inputs, expected rows or None, pixel rows per placeholder)]``: the
    smallest image of the layout in each pixel shape it may take."""
    image = spec.layout.modalities[0]
    vision = getattr(model.config, "vision_config", None)
    if vision is None:
        return []
    c, size, patch, frames = vision_geometry(vision)
    if image.grid_key is not None:  # 2 x 2 merge windows of patches, flattened or not
        side = int(round(spec.layout.merge ** 0.5))
        n = 4 * side * side
        grid = {image.grid_key: torch.tensor([[1, 2 * side, 2 * side]], device=device)}
        m = spec.layout.merge
        # or one row of side x side patches (channels last) per placeholder, the grid counted in placeholders
        # (Inkling 2): then an item has one pixel row per placeholder
        per_token = {image.grid_key: torch.tensor([[1, 2, 2]], device=device)}
        return [(torch.ones(n, c * frames * patch * patch), grid, 4, m), (torch.ones(n, c, patch, patch), grid, 4, m),
                (torch.ones(4, side * patch, side * patch, c), per_token, 4, 1)]
    if "image_position_ids" in image.item_keys:  # patches with their (x, y): one pooling window's square
        side = int(getattr(vision, "pooling_kernel_size", None) or 1) * 2
        if getattr(vision, "model_patch_size", None):  # Gemma 4 unified: merged patches, one row each
            side, patch = 2, int(vision.model_patch_size)
        xy = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="xy"), -1)
        return [(torch.ones(1, side * side, c * patch * patch), {"image_position_ids": xy.reshape(1, -1, 2).to(device)},
                 None, spec.layout.merge)]
    if size is None:  # no image size: one patch per row, channels last (Inkling: an MLP per patch), if it has patches
        return [(torch.ones(1, frames, patch, patch, c), {}, None, spec.layout.merge)] if patch > 1 else []
    if image.item_axis == 1:  # Idefics: [rows, images, C, H, W] with its pixel mask (all-zero pixels are padding)
        mask = torch.ones(1, 1, size, size, dtype=torch.bool, device=device)
        return [(torch.ones(1, 1, c, size, size), {"pixel_attention_mask": mask}, None, spec.layout.merge),
                (torch.ones(1, 1, c, size, size), {"pixel_attention_mask": mask[:, :, 0, 0]}, None,
                 spec.layout.merge)]  # one per tile
    plain = [(torch.ones(1, c, size, size), {}, None, spec.layout.merge)]
    if "image_sizes" not in image.item_keys:
        return plain
    # or with its image_sizes (Apertus 1.5 tokenizes each image at its sizes; LLaVA's CLIP tower takes none)
    sizes = {"image_sizes": torch.tensor([[size, size]], device=device)}
    return plain + [(torch.ones(1, c, size, size), sizes, None, spec.layout.merge)]


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
    if spec.layout.modalities[0].mark_key is not None:  # images placed by a per-token mask (Kosmos-2)
        return marked_probe_inputs(model, spec, device, dtype)
    if spec.layout.modalities[0].name == "video":  # videos only (InstructBLIP-Video's Q-Former)
        return video_qformer_probe_inputs(model, spec, device, dtype)
    if spec.layout.modalities[0].name == "audio":  # an audio-language model: one clip
        return audio_probe_inputs(model, spec, device, dtype)
    image = spec.layout.modalities[0]
    if image.token_rows:  # Molmo2: crops whose placeholders pool chosen patches
        return pooled_probe_inputs(model, spec, device, dtype)
    vision = model.config.vision_config
    extra: dict[str, Any] = {}
    if model in _IMAGES:  # the image the encoder took when the spec was derived
        pixels, given, n_tokens = _IMAGES[model]
        extra = {k: v.to(device) for k, v in given.items()}
    elif image.grid_key is not None and image.pixel_axis == 3:  # NaViT: one crop of one merge block [1, C, p, cells*p]
        side = int(round(spec.layout.merge ** 0.5))
        pixels = torch.zeros(1, getattr(vision, "num_channels", 3), image.cell_size, side * side * image.cell_size)
        extra[image.grid_key] = torch.tensor([[side, side]], device=device)
        n_tokens = 1
    elif image.grid_key is not None and image.grid_dims == 2:  # (h, w) grid (.hwgrid): one merge block's patch rows
        side = int(round(spec.layout.merge ** 0.5))
        channels = getattr(vision, "num_channels", 3)
        pixels = torch.zeros(side * side, channels * vision.patch_size ** 2)
        extra[image.grid_key] = torch.tensor([[side, side]], device=device)
        n_tokens = 1
    elif image.grid_key is not None:
        side = int(round(spec.layout.merge ** 0.5))  # one placeholder: one merge window of patches
        channels = getattr(vision, "in_channels", getattr(vision, "in_chans", 3))
        dim = channels * getattr(vision, "temporal_patch_size", 1) * vision.patch_size ** 2
        pixels = torch.zeros(side * side, dim)
        extra[image.grid_key] = torch.tensor([[1, side, side]], device=device)
        n_tokens = 1
        if spec.counts("image"):  # placeholders counted per item (.grid_rows): a merge size of 1, or the model's rows
            extra.update({k: torch.ones(1, dtype=torch.int64, device=device) for k in image.item_keys
                          if k.endswith("merge_sizes")})
            n_tokens = spec.item_tokens("image", extra)[0]
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
    marks = boundary_ids(model.config) if has_indicators(inner_vlm(model)) else None  # Ovis 2.5: the image's start
    body = [image.token_id] * n_tokens if marks is None else [marks[0]] + [image.token_id] * n_tokens + [marks[1]]
    ids = torch.tensor([[1] + body + [1]], device=device)
    if spec.token_type_key == "mm_token_type_ids" and not spec.layout.image_blocks:  # blocks: shard_batch's own
        extra["mm_token_type_ids"] = (ids == image.token_id).to(torch.int64)
    return {"input_ids": ids, image.pixel_key: pixels.to(device, dtype), **extra}
