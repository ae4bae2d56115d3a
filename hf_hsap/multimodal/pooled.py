"""Families whose placeholders each pool chosen patches of their image's crops (Molmo2), derived from the model:
``get_image_features(pixel_values, image_token_pooling, image_grids, image_num_crops)``.

An image is ``image_num_crops`` crops of patches (``pixel_values [crops, patches, D]``, the documents' crops in
document order along axis 0); it takes ``h_low * w_low + h_high * w_high`` placeholders (its ``image_grids`` row, the
model's own split of the pooled rows), and ``image_token_pooling`` gives each placeholder the patches it pools, as
indices into that image's own patches (the model offsets them per image by ``image_num_crops``). So the pooling rows
are carried per placeholder (:attr:`~hf_hsap.data.vision.Modality.token_rows`): concatenated in document order, and a
rank gets the rows of the images it encodes, still relative to each image.

Molmo2's image tokens (``mm_token_type_ids == 1``: placeholders and their markers) attend to each other
bidirectionally, all of a forward's in one set: on a packed row each document's run of image tokens is a block
(:attr:`~hf_hsap.data.vision.VisionLayout.type_blocks`); a document whose image tokens are several runs is refused.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec

__all__ = ["pooled_probe_inputs", "pooled_spec"]

_KEYS = ("image_grids", "image_num_crops", "image_token_pooling")


def _tokens(name: str, doc: Mapping[str, Any]) -> list[int]:
    """Placeholders of each image of one document: ``h_low * w_low + h_high * w_high`` of its ``image_grids`` row."""
    if name != "image":
        raise KeyError(name)
    grids = torch.as_tensor(doc["image_grids"]).reshape(-1, 4).to(torch.int64)
    return (grids[:, 0] * grids[:, 1] + grids[:, 2] * grids[:, 3]).tolist()


def pooled_spec(model: torch.nn.Module, inner: torch.nn.Module, image_token: int) -> VisionSpec | None:
    """The spec of a pooled-crops family, or ``None`` when ``inner.get_image_features`` does not take all of
    ``image_token_pooling``, ``image_grids`` and ``image_num_crops``.

    Args:
        model: the model; inner: its module with ``get_image_features``; image_token: the placeholder id.

    Returns:
        Images counted per item from their grids, crops per item from ``image_num_crops``, pooling rows per
        placeholder, one bidirectional block per document over ``mm_token_type_ids == 1``.
    """
    if not set(_KEYS) <= set(inspect.signature(inner.get_image_features).parameters):
        return None
    if "mm_token_type_ids" not in inspect.signature(type(model).forward).parameters:
        return None
    image = Modality("image", image_token, "pixel_values", item_keys=_KEYS, rows_key="image_num_crops",
                     token_rows=("image_token_pooling",))
    layout = VisionLayout(str(model.config.model_type), (image,), counted=("image",), type_blocks="mm_token_type_ids")
    return VisionSpec(layout, token_type_key="mm_token_type_ids", item_tokens=_tokens)


def pooled_probe_inputs(model: torch.nn.Module, spec: VisionSpec, device: torch.device, dtype: torch.dtype
                        ) -> dict[str, Any]:
    """``check_model``'s probe of a pooled-crops family: one crop of the tower's size and one placeholder pooling
    its first patch, between two text tokens, with its token types (Molmo2 requires them when training).

    Returns:
        ``model(**inputs)`` keyword arguments (zero pixels).
    """
    vision = model.config.vision_config
    size = vision.image_size
    h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]
    patch = int(vision.patch_size)
    channels = int(getattr(vision, "num_channels", 3))
    image = spec.layout.modalities[0]
    ids = torch.tensor([[1, image.token_id, 1]], device=device)
    return {"input_ids": ids, "pixel_values": torch.zeros(1, (h // patch) * (w // patch), channels * patch * patch,
                                                         device=device, dtype=dtype),
            "image_token_pooling": torch.zeros(1, 1, dtype=torch.int64, device=device),
            "image_grids": torch.tensor([[1, 1, 0, 0]], device=device),
            "image_num_crops": torch.tensor([1], device=device),
            "mm_token_type_ids": (ids == image.token_id).to(torch.int64)}
