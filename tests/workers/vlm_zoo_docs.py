"""Documents of the multimodal zoo's tiny vision-language models (``vlm_zoo_configs.py``), as a processor would give
them.

A document is ``text, [start] placeholders [end], text``: its pixels are made for the family's input kind (one
``[1, C, S, S]`` image, any-resolution tiles with ``image_sizes`` (1 to 4 tiles and the base image, by the
document's image size), Pixtral's images of their own sizes with ``image_sizes``, Idefics' images per row with their
``pixel_attention_mask`` (1 to 4 tiles, the last one's right patches padding), Gemma 4's patches with their
positions, or Qwen-VL-like flattened patches with an ``image_grid_thw``), and the number of placeholders is what the
model's own ``get_image_features`` returns for them (the rows a processor would insert). Families without an image
placeholder id (Kosmos-2's per-token image mask, InstructBLIP-Video's videos) take ``vlm_zoo_unplaced.py``. The five families of
:data:`hf_hsap.examples.vlm.TINY_VLMS` use :func:`hf_hsap.examples.vlm.vlm_documents`.
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

from hf_hsap.examples import TINY_VLMS, vlm_documents
from hf_hsap.multimodal.audio import is_audio_lm
from hf_hsap.multimodal.cross import is_cross_attention_vlm
from hf_hsap.multimodal.structure import inner_vlm
from hf_hsap.multimodal.prefix import is_prefix_lm, prefix_token_types
from workers.vlm_zoo_audio import audio_documents
from workers.vlm_zoo_configs import SPECIAL_SUFFIXES, NotBuildable, first_line
from workers.vlm_zoo_unplaced import unplaced_documents

__all__ = ["SHAPES", "documents", "feature_module", "image_maker", "image_token_id"]

PATCH = 2  # pixels per patch side where the vision config names none


def image_token_id(config: Any) -> int | None:
    """The image placeholder id of a config (``image_token_id`` / ``image_token_index``), or ``None``."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _params(fn: Any) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def feature_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module with ``get_image_features``."""
    for m in (getattr(model, "model", None), model):
        if m is not None and callable(getattr(m, "get_image_features", None)):
            return m
    raise NotBuildable(f"{type(model).__name__} has no get_image_features (no image encoder to ask)")


def _geometry(config: Any) -> tuple[int, int, int, int]:
    """``(channels, image side, patch side, frames per temporal patch)`` of the vision tower."""
    v = getattr(config, "vision_config", None)
    channels = int(getattr(v, "num_channels", None) or getattr(v, "in_channels", None) or 3)
    size = getattr(v, "image_size", None) or 8
    size = int(size[0] if isinstance(size, (list, tuple)) else size)
    patch = getattr(v, "patch_size", None) or PATCH
    patch = int(patch[0] if isinstance(patch, (list, tuple)) else patch)
    tp = int(getattr(v, "temporal_patch_size", None) or getattr(v, "patch_temporal", None) or 1)
    return channels, size, patch, tp


Maker = Callable[[tuple[int, int, int], torch.Generator, torch.dtype], dict[str, Any]]


def _candidates(config: Any, model: torch.nn.Module) -> list[tuple[str, Maker]]:
    """The input kinds to try, in order: ``(name, make(grid, generator, dtype) -> one image's inputs)``."""
    c, size, patch, tp = _geometry(config)
    params = _params(feature_module(model).get_image_features)
    v = getattr(config, "vision_config", None)
    merge = int(getattr(v, "spatial_merge_size", None) or getattr(v, "merge_size", None) or 2)
    if "image_grid_thw" in params:  # Qwen-VL-like: flattened patches and a [t, h, w] grid per image
        def grid(shape: Callable[[int], tuple[int, ...]]) -> Maker:
            def make(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
                n = thw[0] * thw[1] * thw[2]
                doc = {"pixel_values": torch.randn(*shape(n), generator=g, dtype=dtype),
                       "image_grid_thw": torch.tensor([list(thw)])}
                if "image_merge_sizes" in params:  # VideoLLaMA3: its image processor's merge size (its videos': 2)
                    doc["image_merge_sizes"] = torch.tensor([1])
                return doc
            return make
        return [("grid", grid(lambda n: (n, c * tp * patch * patch))),
                ("grid patches", grid(lambda n: (n, c, patch, patch))),
                # Inkling 2: one row of merge x merge patches (channels last) per placeholder, the grid in placeholders
                ("grid of placeholder patches", grid(lambda n: (n, merge * patch, merge * patch, c)))]

    def image(shape: tuple[int, ...], sizes: bool) -> Maker:
        def make(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
            doc = {"pixel_values": torch.randn(*shape, generator=g, dtype=dtype)}
            if sizes:
                doc["image_sizes"] = torch.tensor([[size, size]])
            return doc
        return make

    def tiles(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        sizes = [2 * thw[1], 2 * thw[2]]  # grid (1, 8, 8): a 16x16 image in 4 tiles and the base image
        count = sys.modules[type(feature_module(model)).__module__].image_size_to_num_patches
        n = int(count(image_size=sizes, grid_pinpoints=config.image_grid_pinpoints, patch_size=size))
        return {"pixel_values": torch.randn(1, n, c, size, size, generator=g, dtype=dtype),
                "image_sizes": torch.tensor([sizes])}

    def sized(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        h, w = 4 * thw[1], 4 * thw[2]  # grid (1, 8, 8): a 32x32 image (64 placeholders after the 2x2 merge)
        return {"pixel_values": torch.randn(1, c, h, w, generator=g, dtype=dtype), "image_sizes": torch.tensor([[h, w]])}

    def per_row(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        n = max(1, thw[1] // 2)  # grid (1, 8, 8): 4 images (an image split into tiles), else 1 or 2
        mask = torch.ones(1, n, size, size, dtype=torch.bool)
        mask[0, -1, :, size - PATCH:] = False  # the last tile's right patches are padding
        return {"pixel_values": torch.randn(1, n, c, size, size, generator=g, dtype=dtype) * mask[:, :, None],
                "pixel_attention_mask": mask}

    def tile_mask(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        n = max(1, thw[1] // 2)  # as per_row, with one flag per tile (Granite-Docling: real tiles)
        return {"pixel_values": torch.randn(1, n, c, size, size, generator=g, dtype=dtype),
                "pixel_attention_mask": torch.ones(1, n, dtype=torch.bool)}

    out = []
    if "image_token_pooling" in params:  # Molmo2: crops of patches, each placeholder pooling 2x2 patches of one crop
        out.append(("pooled crops", pooled_crops(c, size, patch)))
    if "image_grid_hw" in params:  # Nemotron-H Omni: flattened patches and an [h, w] patch grid per image
        def hw_grid(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
            h, w = thw[1], thw[2]
            return {"pixel_values": torch.randn(h * w, c * patch * patch, generator=g, dtype=dtype),
                    "image_grid_hw": torch.tensor([[h, w]])}
        out.append(("flattened patches with an (h, w) grid", hw_grid))
    if "target_sizes" in params:  # MiniCPM-V: NaViT patches side by side, [1, C, p, h * w * p], (h, w) per crop
        def navit(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
            h, w = 4 * thw[1], 4 * thw[2]  # grid (1, 8, 8): 32x32 patches (64 placeholders after the 4x4 merge)
            return {"pixel_values": torch.randn(1, c, patch, h * w * patch, generator=g, dtype=dtype),
                    "target_sizes": torch.tensor([[h, w]], dtype=torch.int32)}
        out.append(("NaViT patches with target sizes", navit))
    if "spatial_shapes" in params:  # NaFlex (LFM2-VL): patch rows padded to the processor's most, a patch mask
        def naflex(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
            h, w = 2 * thw[1], 2 * thw[2]  # grid (1, 8, 8): 16x16 patches (64 placeholders after the 2x2 unshuffle)
            most = 256  # every image padded to 256 patches, as a processor pads to its max_num_patches
            mask = torch.zeros(1, most, dtype=torch.bool)
            mask[0, :h * w] = True
            pixels = torch.randn(1, most, c * patch * patch, generator=g, dtype=dtype) * mask[..., None]
            return {"pixel_values": pixels, "spatial_shapes": torch.tensor([[h, w]]), "pixel_attention_mask": mask}
        out.append(("NaFlex patches with spatial shapes", naflex))
    if "image_position_ids" in params:  # Gemma 4: [images, patches, C * p * p] and each patch's (x, y)
        model_patch = getattr(v, "model_patch_size", None)  # Gemma 4 unified: 4x4 merged patches, a placeholder each

        def patches(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
            p = int(model_patch or patch)
            side = 4 if model_patch else size // patch  # every image padded to one size, as its processor does
            xy = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="xy"), -1)
            return {"pixel_values": torch.randn(1, side * side, c * p * p, generator=g, dtype=dtype),
                    "image_position_ids": xy.reshape(1, -1, 2)}
        out.append(("patches with positions", patches))
    if getattr(config, "image_grid_pinpoints", None):  # any-resolution: the base image and its tiles by its size
        out.append(("any-res tiles", tiles))
    if getattr(v, "model_type", None) == "pixtral":  # images of their own sizes (Pixtral)
        out.append(("sized image", sized))
    if "pixel_attention_mask" in params:  # Idefics: a row's images (tiles) and their pixel masks
        out.append(("images per row with masks", per_row))
        out.append(("tiles per row with a tile mask", tile_mask))
    with_sizes = "image_sizes" in params
    if "qformer_input_ids" in params:  # InstructBLIP: each image with its instruction for the Q-Former
        words = int(config.qformer_config.vocab_size)

        def instructed(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
            n = 2 + thw[2]  # instructions of different lengths (padded in the packed batch)
            return {"pixel_values": torch.randn(1, c, size, size, generator=g, dtype=dtype),
                    "qformer_input_ids": torch.randint(3, words, (1, n), generator=g),
                    "qformer_attention_mask": torch.ones(1, n, dtype=torch.int64)}
        out.append(("image with a Q-Former instruction", instructed))
    if "high_res_pixel_values" in params:  # DeepSeek-VL-Hybrid: each image at its low and high resolution
        high = int(config.high_res_vision_config.image_size)

        def two_views(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
            return {"pixel_values": torch.randn(1, c, size, size, generator=g, dtype=dtype),
                    "high_res_pixel_values": torch.randn(1, c, high, high, generator=g, dtype=dtype)}
        out.append(("low- and high-resolution image", two_views))
    out.append(("image", image((1, c, size, size), with_sizes)))
    out.append(("images per row", image((1, 1, c, size, size), with_sizes)))  # Idefics: [rows, images, C, H, W]

    def flat_patches(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        side = size // patch  # a fixed-size image's patches, one placeholder each (the processor pads every image)
        return {"pixel_values": torch.randn(1, side * side, patch * patch * c, generator=g, dtype=dtype)}
    out.append(("flattened patches [images, patches, p * p * C]", flat_patches))  # Fuyu: a linear patch embedding

    def patch_rows(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        n = thw[1] * thw[2]  # grid (1, 8, 8): 64 patches, one placeholder each
        return {"pixel_values": torch.randn(n, tp, patch, patch, c, generator=g, dtype=dtype)}
    out.append(("patch rows [patches, t, p, p, C]", patch_rows))  # Inkling: an MLP per patch (channels last)
    return out


def pooled_crops(c: int, size: int, patch: int) -> Maker:
    """Molmo2's image inputs as its processor gives them: a low-resolution crop and ``k`` high-resolution crops
    (grid ``(1, h, w)``: ``k = max(1, h // 4)``) of ``side x side`` patches, every placeholder pooling a 2 x 2 window
    of one crop (``image_token_pooling``: indices into the image's own patches), ``image_grids`` ``[h_low, w_low,
    h_high, w_high]`` (the low crop's windows, then the high crops' side by side) and ``image_num_crops``."""
    side = size // patch
    half = side // 2

    def window(crop: int, r: int, col: int) -> list[int]:
        return [crop * side * side + (2 * r + dr) * side + 2 * col + dc for dr in (0, 1) for dc in (0, 1)]

    def make(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> dict[str, Any]:
        k = max(1, thw[1] // 4)
        rows = [window(0, r, col) for r in range(half) for col in range(half)]
        rows += [window(1 + col // half, r, col % half) for r in range(half) for col in range(half * k)]
        return {"pixel_values": torch.randn(1 + k, side * side, c * patch * patch, generator=g, dtype=dtype),
                "image_token_pooling": torch.tensor(rows), "image_grids": torch.tensor([[half, half, half, half * k]]),
                "image_num_crops": torch.tensor([1 + k])}
    return make


def _feature_rows(model: torch.nn.Module, image: dict[str, Any]) -> int:
    """How many feature rows (placeholders) the model makes of one image's inputs."""
    image = {k: (v.to(model.dtype) if v.is_floating_point() else v) for k, v in image.items()}
    with torch.no_grad():
        out = feature_module(model).get_image_features(**image, return_dict=True)
    feats = getattr(out, "pooler_output", None)
    deepstack = getattr(out, "deepstack_features", None)
    if feats is None and deepstack:  # Granite 4 Vision: (decoder layer, per-image rows) pairs only
        feats = deepstack[0][1]
    if feats is None:  # Fuyu merges its patch embeddings, the last hidden state
        feats = getattr(out, "last_hidden_state", None)
    if feats is None:
        feats = out[0] if isinstance(out, (tuple, list)) else out
    if torch.is_tensor(feats):
        return feats.numel() // feats.shape[-1]
    return sum(f.numel() // f.shape[-1] for f in feats)


def image_maker(config: Any, model: torch.nn.Module) -> tuple[str, Maker]:
    """The first input kind whose image the model's ``get_image_features`` accepts.

    Args:
        config: the family's tiny config; model: a model of it.

    Returns:
        ``(kind, make)``; ``make(grid, generator, dtype)`` gives one image's inputs.

    Raises:
        NotBuildable: none is accepted (the refusals in the message), or it needs inputs not made here.
    """
    known = {"self", "pixel_values", "image_sizes", "image_grid_thw", "image_merge_sizes", "pixel_attention_mask",
             "target_sizes", "spatial_shapes", "high_res_pixel_values", "qformer_input_ids", "image_token_pooling",
             "image_grids",
             "image_grid_hw"}
    required = [n for n, p in _params(feature_module(model).get_image_features).items()
                if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD and n not in known]
    if required:
        raise NotBuildable(f"get_image_features needs {', '.join(required)} (not made here)")
    errors = []
    for kind, make in _candidates(config, model):
        try:
            _feature_rows(model, make((1, 4, 4), torch.Generator().manual_seed(0), torch.float32))
            return kind, make
        except Exception as e:  # noqa: BLE001
            errors.append(f"{kind}: {first_line(e)}")
    raise NotBuildable("get_image_features refuses the tiny image (" + "; ".join(errors)[:300] + ")")


# per document (text before, grid (t, h, w) in patches or None, text after), as tests/workers/vlm.py: one long
# document whose image SP must split, a text-only one and short ones (fixed-size-image families ignore the grid)
SHAPES = [(21, (1, 8, 8), 11), (2, (1, 4, 4), 4), (5, None, 7), (1, (1, 2, 4), 2), (3, (1, 4, 2), 6)]


_CANVAS_MARKERS = ("image_start_id", "image_end_id", "slice_start_id", "slice_end_id", "newline_id")  # MiniCPM-V 4.7


def _marker(fields: dict[str, Any], names: tuple[str, ...]) -> int | None:
    return next((fields[n] for n in names if isinstance(fields.get(n), int)), None)


def documents(config: Any, model: torch.nn.Module, shapes: list[tuple[int, tuple[int, int, int] | None, int]] = SHAPES,
              seed: int = 0, dtype: torch.dtype = torch.float64, examples: bool = True) -> list[dict[str, Any]]:
    """Documents as a processor would give them (see the module docstring).

    Args:
        config: the family's tiny config; model: a model of it (asked how many rows an image becomes);
        shapes: per document ``(text before, grid or None, text after)``; seed: tokens and pixels; dtype: pixels;
        examples: the families of ``TINY_VLMS`` take ``vlm_documents`` (False: the input kinds here, e.g. for a
        LLaVA with a Pixtral tower).

    Returns:
        One dict per document: ``input_ids [n]``, ``labels [n]`` (-100 on placeholders and markers), the image
        inputs and, where the model's forward takes them, ``token_type_ids`` / ``mm_token_type_ids`` (1 on
        placeholders).

    Raises:
        NotBuildable: no image token id, or the model refuses the images made for it.
    """
    if examples and config.model_type in TINY_VLMS:
        return vlm_documents(config, shapes, seed=seed, dtype=dtype)
    if is_cross_attention_vlm(model):
        return cross_documents(config, model, shapes, seed=seed, dtype=dtype)
    if is_audio_lm(inner_vlm(model)):  # an audio-language model: one clip per document (vlm_zoo_audio)
        return audio_documents(config, model, seed=seed, dtype=dtype)
    unplaced = unplaced_documents(config, model, shapes, seed=seed, dtype=dtype)  # Kosmos-2, InstructBLIP-Video
    if unplaced is not None:
        return unplaced
    token = image_token_id(config)
    if token is None:
        raise NotBuildable("the config has no image_token_id / image_token_index (no placeholder to insert)")
    vocab = config.get_text_config().vocab_size
    fields = config.to_dict()
    start = _marker(fields, ("vision_start_token_id", "image_start_token_id", "boi_token_id", "boi_token_index",
                             "image_start_id"))  # MiniCPM-V 4.7's <image>
    end = _marker(fields, ("vision_end_token_id", "image_end_token_id", "eoi_token_id", "eoi_token_index",
                           "image_end_id"))
    specials = [v for n, v in fields.items() if n.endswith(SPECIAL_SUFFIXES) and isinstance(v, int) and v > 2]
    specials += [v for n, v in fields.items() if n in _CANVAS_MARKERS and isinstance(v, int)]
    low = min([vocab, *specials, *(m for m in (start, end) if m is not None)])  # text stays below every special id
    kind, make = image_maker(config, model)
    video = grid_video(config, model, kind, make)
    audio = audio_maker(config, model)
    g = torch.Generator().manual_seed(seed)
    pixels = _params(type(model).forward).get("pixel_values")
    every = pixels is not None and pixels.default is inspect.Parameter.empty  # BLIP-2: no text-only forward
    docs = []
    for k, (before, grid, after) in enumerate(shapes):
        doc: dict[str, Any] = {}
        if grid is None and every:
            grid = (1, 2, 2)  # the smallest image (fixed-size families ignore the grid)
        body = [torch.randint(3, low, (before,), generator=g)]
        video_at: list[torch.Tensor] = []  # the video's placeholder runs (type 2)
        if grid is not None and not (video is not None and video.shared and k in VIDEO_DOCS):
            image = make(grid, g, dtype)
            try:
                n_tok = _feature_rows(model, image)
            except Exception as e:  # noqa: BLE001
                raise NotBuildable(f"get_image_features refuses a {kind} of grid {grid}: {first_line(e)}") from e
            doc.update(image)
            body += ([torch.tensor([start])] if start is not None else []) + [torch.full((n_tok,), token)] + \
                ([torch.tensor([end])] if end is not None else [])
        n_prefix = sum(int(b.numel()) for b in body)  # text before and the image: a prefix-LM's prefix
        body.append(torch.randint(3, low, (after,), generator=g))
        if video is not None and k in VIDEO_DOCS:  # a video after the text: (t, h, w) = (2, 4, 4), then (2, 2, 4)
            keys, runs = video((2, 4, 4) if k == VIDEO_DOCS[0] else (2, 2, 4), g, dtype)
            doc.update(keys)
            v_start, v_end = start, end
            if not video.shared:  # a video of its own token: its own start / end markers where the config names them
                v_start = _marker(fields, ("video_start_token_id",)) or start  # (Ovis 2.5 writes a learned
                v_end = _marker(fields, ("video_end_token_id",)) or end  # embedding there, counted per video)
            for run in runs:
                body += [torch.randint(3, low, (1,), generator=g)]  # a timestamp's text before each frame
                n_body = sum(int(b.numel()) for b in body)
                body += ([torch.tensor([v_start])] if v_start is not None else []) + [run] + \
                    ([torch.tensor([v_end])] if v_end is not None else [])
                video_at.append(torch.arange(run.numel()) + n_body + (v_start is not None))
            body.append(torch.randint(3, low, (2,), generator=g))
        ids = torch.cat(body)
        doc["input_ids"] = ids
        for key in ("token_type_ids", "mm_token_type_ids"):
            if key in _params(type(model).forward):
                doc[key] = (ids == token).to(torch.int64)
                for where in video_at:
                    doc[key][where] = 2
        if "moe_mm_token_type_ids" in _params(type(model).forward):  # ERNIE-4.5-VL's processor: the MoE routing
            doc["moe_mm_token_type_ids"] = _moe_types(fields, ids)  # types, start / end markers included
        if audio is not None and k in AUDIO_DOCS:  # an audio after the text: 24 real frames, then 20 of 32
            keys, n_audio = audio(24 if k == AUDIO_DOCS[0] else 32, 24 if k == AUDIO_DOCS[0] else 20, g, dtype)
            doc.update(keys)
            a_start = _marker(fields, ("audio_start_token_id",))
            a_end = _marker(fields, ("audio_end_token_id",))
            a_token = _marker(fields, ("audio_token_id", "audio_token_index"))
            ids = torch.cat([ids] + ([torch.tensor([a_start])] if a_start is not None else []) +
                            [torch.full((n_audio,), a_token)] + ([torch.tensor([a_end])] if a_end is not None else []) +
                            [torch.randint(3, low, (2,), generator=g)])
            doc["input_ids"] = ids
            for key in ("token_type_ids", "mm_token_type_ids"):
                if key in doc:
                    doc[key] = torch.cat([doc[key], torch.zeros(ids.numel() - doc[key].numel(), dtype=torch.int64)])
        if _positions_need_mask(model):  # as the processor gives it: all ones
            doc["attention_mask"] = torch.ones_like(ids)
        if is_prefix_lm(model):  # PaliGemma: 0 on the image and the prompt, 1 on the suffix
            doc["token_type_ids"] = prefix_token_types(ids.numel(), n_prefix)
        labels = ids.clone()
        labels[ids >= low] = -100  # no loss on placeholders and markers
        doc["labels"] = labels
        docs.append(doc)
    return docs


def _moe_types(fields: dict[str, Any], ids: torch.Tensor) -> torch.Tensor:
    """``[n]`` as ERNIE-4.5-VL's processor's ``create_moe_mm_token_type_ids``: 1 on image placeholders and the image
    start / end tokens, 2 on video placeholders and the video start / end tokens, 0 elsewhere."""
    out = torch.zeros_like(ids)
    for kind, name in ((1, "image"), (2, "video")):
        for key in (f"{name}_token_id", f"{name}_start_token_id", f"{name}_end_token_id"):
            if isinstance(fields.get(key), int):
                out[ids == fields[key]] = kind
    return out


def cross_documents(config: Any, model: torch.nn.Module, shapes: list[tuple[int, tuple[int, int, int] | None, int]],
                    *, seed: int = 0, dtype: torch.dtype = torch.float64) -> list[dict[str, Any]]:
    """Documents of a cross-attention family as its processor gives them.

    Mllama: ``text, <|image|> per image, text``; every image ``[max_num_tiles, C, S, S]`` with its real tiles first
    (the rest zero), its ``aspect_ratio_ids`` (1 + the index of its tiles' ``[rows, cols]`` in
    ``supported_aspect_ratios``) and ``aspect_ratio_mask``; ``cross_attention_mask [1, n, images, max_num_tiles]``:
    each image's real tiles from its placeholder to the document's end (the tokens before it attend to none). A grid
    ``(t, h, w)`` gives an image of ``ceil(h / 4) x ceil(w / 4)`` tiles, and a grid of 64 patches or more a second
    image of ``1 x 2`` tiles. Idefics: ``[1, images, C, S, S]`` and ``image_attention_mask [1, n, images]`` the same
    way, without placeholders (its config names none), and an image in every document (it runs none without).

    Returns:
        One dict per document (``input_ids [n]``, ``labels [n]``: -100 on the placeholders, the image inputs).
    """
    v = config.vision_config
    c, size = int(getattr(v, "num_channels", 3)), int(v.image_size)
    tiled = "aspect_ratio_ids" in _params(type(model).forward)
    tiles = int(v.max_num_tiles) if tiled else 1
    ratios = [list(r) for r in v.supported_aspect_ratios] if tiled else []
    token = image_token_id(config) if tiled else None
    low = min(config.get_text_config().vocab_size, token if token is not None else 10 ** 9)
    g = torch.Generator().manual_seed(seed)
    docs = []
    for before, grid, after in shapes:
        grid = grid if grid is not None or tiled else (1, 2, 2)  # Idefics: every document has an image
        layouts = [] if grid is None else [[-(-grid[1] // 4), -(-grid[2] // 4)]] + \
            ([[1, 2]] if grid[1] * grid[2] >= 64 else [])
        if not tiled:
            layouts = [[1, 1] for _ in layouts]
        n_img = len(layouts)
        marks = torch.full((n_img,), token) if token is not None else torch.zeros(0, dtype=torch.int64)
        ids = torch.cat([torch.randint(3, low, (before,), generator=g), marks,
                         torch.randint(3, low, (after,), generator=g)])
        doc: dict[str, Any] = {"input_ids": ids, "labels": torch.where(ids >= low, -100, ids)}
        if n_img:
            pixels = torch.zeros(1, n_img, tiles, c, size, size, dtype=dtype)
            mask = torch.zeros(1, ids.numel(), n_img, tiles, dtype=torch.int64)
            ratio_mask = torch.zeros(1, n_img, tiles, dtype=torch.int64)
            for j, (rows, cols) in enumerate(layouts):
                real = rows * cols
                pixels[0, j, :real] = torch.randn(real, c, size, size, generator=g, dtype=dtype)
                ratio_mask[0, j, :real] = 1
                mask[0, before + (j if token is not None else 0):, j, :real] = 1
            if tiled:
                doc.update(pixel_values=pixels, cross_attention_mask=mask, aspect_ratio_mask=ratio_mask,
                           aspect_ratio_ids=torch.tensor([[ratios.index(r) + 1 for r in layouts]]))
            else:
                doc.update(pixel_values=pixels[:, :, 0], image_attention_mask=mask[..., 0])
        docs.append(doc)
    return docs


def _positions_need_mask(model: torch.nn.Module) -> bool:
    """Whether the forward computes its multimodal rotary positions only when given an ``attention_mask`` (the omni
    thinkers' ``compute_3d_position_ids``; without one a document alone would run on 1-D positions)."""
    fn = getattr(feature_module(model), "compute_3d_position_ids", None)
    try:
        return callable(fn) and "and attention_mask is not None" in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


AUDIO_DOCS = (2, 4)  # the documents an omni model's audio is added to (documents())


def audio_maker(config: Any, model: torch.nn.Module) -> Callable[..., Any] | None:
    """An audio maker for a model whose spec carries audios (an audio modality beside its images), else ``None``.

    Returns:
        ``audio(frames, real, generator, dtype) -> (keys, placeholders)``: ``input_features [1, mel, frames]`` (zero
        past the ``real`` frames) with its ``feature_attention_mask [1, frames]``, and as many placeholders as the
        model's ``get_audio_features`` returns rows.
    """
    from hf_hsap.multimodal import vision_spec

    inner = feature_module(model)
    try:  # audios only where the model's spec carries them (Gemma 4's are not carried yet)
        if not any(m.name == "audio" for m in vision_spec(model).layout.modalities):
            return None
    except ValueError:
        return None
    mel = getattr(config.audio_config, "num_mel_bins", None)
    if mel is None:  # a waveform input (Muse Spark's input_values): not made here, its documents have no audio
        return None
    mel = int(mel)

    def audio(frames: int, real: int, g: torch.Generator, dtype: torch.dtype) -> tuple[dict[str, Any], int]:
        mask = torch.zeros(1, frames, dtype=torch.int64)
        mask[:, :real] = 1
        feats = torch.randn(1, mel, frames, generator=g, dtype=dtype) * mask[:, None]
        with torch.no_grad():
            out = inner.get_audio_features(feats.to(model.dtype), feature_attention_mask=mask, return_dict=True)
        return {"input_features": feats, "feature_attention_mask": mask}, int(out.last_hidden_state.shape[0])

    return audio


VIDEO_DOCS = (1, 3)  # the documents a grid family's video is added to (documents())


def grid_video(config: Any, model: torch.nn.Module, kind: str, make: Maker) -> Callable[..., Any] | None:
    """A grid family's video maker, where its ``get_video_features`` takes a ``video_grid_thw`` (else ``None``).

    Returns:
        ``video(thw, generator, dtype) -> (keys, runs)``: ``pixel_values_videos`` and ``video_grid_thw`` (and
        ``second_per_grid_ts`` where the rope index reads it), and the placeholder runs: one per frame where the
        model's rope index places each frame apart (Qwen3-VL, GLM-4V: a timestamp between frames), else one; the
        video placeholder is the image token where the model's placeholder mask says so (GLM-4V: ``video.shared``;
        such a model's own forward cannot take an image and a video together, so its video documents hold no image).
    """
    from hf_hsap.multimodal.grid import video_marks

    inner = feature_module(model)
    vtoken = next((getattr(config, n) for n in ("video_token_id", "video_token_index")
                   if isinstance(getattr(config, n, None), int)), None)
    encode = _params(getattr(inner, "get_video_features", None))
    needs = {n for n, p in encode.items() if p.default is inspect.Parameter.empty and
             p.kind is p.POSITIONAL_OR_KEYWORD} - {"self", "pixel_values_videos", "video_grid_thw", "video_merge_sizes"}
    if not kind.startswith("grid") or vtoken is None or "video_grid_thw" not in encode or needs:
        return None  # no grid video, or one that needs inputs not made here
    itoken = image_token_id(config)
    marks = video_marks(model, inner, itoken, vtoken)  # as grid_spec reads it: no video where it reads none
    if marks is None:
        return None
    token = itoken if marks == "image" else vtoken
    rope = getattr(inner, "get_rope_index", None)
    per_frame = callable(rope) and "repeat_interleave(video_grid_thw" in inspect.getsource(rope)
    seconds = next((k for k in ("second_per_grid_ts", "video_second_per_grid") if k in _params(type(model).forward)),
                   None)  # a video's seconds per temporal patch, where the forward takes them
    compress = "video_compression_mask" in _params(type(model).forward)  # a mask of the encoder's rows kept

    def video(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> tuple[dict[str, Any], list]:
        image = make(thw, g, dtype)
        keys = {"pixel_values_videos": image["pixel_values"], "video_grid_thw": image["image_grid_thw"]}
        if seconds:
            keys[seconds] = torch.tensor([1.0])
        if "video_merge_sizes" in encode:  # VideoLLaMA3: its video processor's merge size (its images': 1)
            keys["video_merge_sizes"] = torch.tensor([2])
        with torch.no_grad():
            given = {k: v for k, v in keys.items() if k in encode and k != "pixel_values_videos"}
            out = inner.get_video_features(pixel_values_videos=keys["pixel_values_videos"].to(model.dtype), **given,
                                           return_dict=True)
        feats = out.pooler_output
        n = feats.numel() // feats.shape[-1] if torch.is_tensor(feats) else sum(f.numel() // f.shape[-1] for f in feats)
        if compress:  # VideoLLaMA3's token compression: a later frame's unchanged rows dropped (here every other one)
            keep = torch.ones(n, dtype=torch.bool)
            keep[n // thw[0]::2] = False
            keys["video_compression_mask"] = keep
            n = int(keep.sum())
        frames = thw[0] if per_frame else 1
        return keys, [torch.full((n // frames,), token) for _ in range(frames)]

    video.shared = token == itoken  # type: ignore[attr-defined]  # a document holds a video or images, not both
    return video


def with_videos(config: Any, model: torch.nn.Module, docs: list[dict[str, Any]], *, frames: int = 2, every: int = 2,
                seed: int = 1, dtype: torch.dtype = torch.float64) -> list[dict[str, Any]]:
    """``docs`` with a video (``pixel_values_videos [1, frames, C, S, S]``) at the end of every ``every``-th one,
    its placeholders (``video_token_id``) as many as the model's ``get_video_features`` returns rows.

    Args:
        config: the family's tiny config; model: a model of it; docs: from :func:`documents`; frames: per video;
        every: which documents get a video; seed: the videos' pixels; dtype: of the pixels.

    Returns:
        New document dicts (the inputs are not modified).
    """
    c, size, _, _ = _geometry(config)
    token = next(getattr(config, n) for n in ("video_token_id", "video_token_index")
                 if isinstance(getattr(config, n, None), int))
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, doc in enumerate(docs):
        doc = dict(doc)
        if i % every == 0:
            video = torch.randn(1, frames, c, size, size, generator=g, dtype=dtype)
            with torch.no_grad():
                feats = feature_module(model).get_video_features(video.to(model.dtype), return_dict=True).pooler_output
            n = feats.numel() // feats.shape[-1]
            doc["pixel_values_videos"] = video
            doc["input_ids"] = torch.cat([doc["input_ids"], torch.full((n,), token), torch.tensor([5])])
            doc["labels"] = torch.cat([doc["labels"], torch.full((n,), -100), torch.tensor([5])])
            for key in ("token_type_ids", "mm_token_type_ids"):
                if key in doc:
                    doc[key] = (doc["input_ids"] == image_token_id(config)).to(torch.int64)
        out.append(doc)
    return out
