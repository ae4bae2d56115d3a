"""One image's inputs for a tiny vision-language model of the multimodal zoo (``vlm_zoo_configs.py``), made for the
family's input kind and asked of its own ``get_image_features``: the input kinds tried in order (one ``[1, C, S, S]``
image, any-resolution tiles, Pixtral's own sizes, Idefics' rows with a pixel mask, Gemma 4's patches with positions,
Qwen-VL-like flattened patches with a grid, Molmo2's pooled crops, ...), the first one the model accepts, and how many
feature rows (placeholders) one image becomes. ``vlm_zoo_docs.py`` builds the documents with them.
"""
from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

from workers.vlm_zoo_configs import NotBuildable, first_line

__all__ = ["Maker", "feature_module", "feature_rows", "image_maker", "image_token_id", "input_kinds",
           "signature_params", "tower_geometry"]

PATCH = 2  # pixels per patch side where the vision config names none


def image_token_id(config: Any) -> int | None:
    """The image placeholder id of a config (``image_token_id`` / ``image_token_index``), or ``None``."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def signature_params(fn: Any) -> dict[str, inspect.Parameter]:
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


def tower_geometry(config: Any) -> tuple[int, int, int, int]:
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


def input_kinds(config: Any, model: torch.nn.Module) -> list[tuple[str, Maker]]:
    """The input kinds to try, in order: ``(name, make(grid, generator, dtype) -> one image's inputs)``."""
    c, size, patch, tp = tower_geometry(config)
    params = signature_params(feature_module(model).get_image_features)
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


def feature_rows(model: torch.nn.Module, image: dict[str, Any]) -> int:
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
    required = [n for n, p in signature_params(feature_module(model).get_image_features).items()
                if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD and n not in known]
    if required:
        raise NotBuildable(f"get_image_features needs {', '.join(required)} (not made here)")
    errors = []
    for kind, make in input_kinds(config, model):
        try:
            feature_rows(model, make((1, 4, 4), torch.Generator().manual_seed(0), torch.float32))
            return kind, make
        except Exception as e:  # noqa: BLE001
            errors.append(f"{kind}: {first_line(e)}")
    raise NotBuildable("get_image_features refuses the tiny image (" + "; ".join(errors)[:300] + ")")
