"""The encoder asked, once per model, for a minimal image of the layout :func:`~.spec.vision_spec` derived: which
pixel shape it takes, how many rows it returns and how wide (one row per merge window and the text's width, or a
refusal naming what it returned), and the image it took, kept for ``check_model``'s probe (:mod:`.probe`).
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import torch

from ..data.vision import VisionSpec
from .grid_rows import vision_geometry
from .structure import refusal

__all__ = ["check_encoder_rows", "feature_rows", "minimal_images", "taken_image"]

_TAKEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (pixels, inputs, rows) its encoder took


def taken_image(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, Any], int] | None:
    """``(pixels, other get_image_features inputs, rows)`` of the image :func:`check_encoder_rows` found the
    model's encoder takes, or ``None`` when it was not asked (counted items, a model on the meta device)."""
    return _TAKEN.get(model)


def check_encoder_rows(model: torch.nn.Module, inner: torch.nn.Module, spec: VisionSpec) -> VisionSpec:
    """Ask the encoder for a minimal image of the derived layout (a grid of 2 x 2 merge windows, or one image of
    the tower's size) and refuse a family whose encoder takes none of the layout's pixel shapes, returns rows of
    another width than the text's embeddings, or (grid) other than one row per merge window: an item's placeholders
    are derived from that. Skipped for a model on the meta device and for counted items (asked per image).

    Args:
        model: the model; inner: its :func:`~.structure.inner_vlm`; spec: the spec derived from its forward.

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
    for pixels, extra, expect, merge in minimal_images(model, spec, param.device):
        try:
            with torch.random.fork_rng(devices=devices):  # training's random streams stay as they were
                rows, width = feature_rows(inner, pixels.to(param.device, param.dtype), **extra)
            _TAKEN[model] = pixels, extra, rows
            if merge != spec.layout.merge:
                spec = dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, merge=merge))
            break
        except Exception as e:  # noqa: BLE001 - any failure of the encoder on the layout's pixels
            errors.append(f"{tuple(pixels.shape)}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    else:
        raise refusal(model, "encoder layout", (
            f"its get_image_features takes none of the pixel shapes of the layout derived from its forward "
            f"({'; '.join(errors)})" if errors else
            "its vision config gives no image size (vision_config.image_size) nor patch size to derive one image's "
            "pixels from"))
    hidden = getattr(model.config.get_text_config(), "hidden_size", None)
    if hidden is not None and width != hidden:
        raise refusal(model, "encoder layout", (
            f"its get_image_features returns rows {width} wide where its text embeddings are {hidden}: its forward "
            "does not place them as one row per placeholder"))
    if expect is not None and rows != expect:
        raise refusal(model, "encoder layout", (
            f"its encoder returns {rows} rows for a grid of {expect} merge windows (rows of its own besides one per "
            "window), which the packed-row planner does not count yet"))
    return spec


def minimal_images(model: torch.nn.Module, spec: VisionSpec, device: torch.device
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


def feature_rows(inner: torch.nn.Module, pixels: torch.Tensor, **extra: Any) -> tuple[int, int]:
    """``(rows, width)`` of the placeholder rows the model's encoder makes of ``pixels`` (asked, not derived from
    the config)."""
    with torch.no_grad():
        out = inner.get_image_features(pixel_values=pixels, return_dict=True, **extra).pooler_output
    if torch.is_tensor(out):
        return int(out.numel() // out.shape[-1]), int(out.shape[-1])
    return int(sum(v.numel() // v.shape[-1] for v in out)), int(out[0].shape[-1])
