"""Families that place each image's feature rows by a per-token mask instead of a placeholder id (Kosmos-2,
Kosmos-2.5: ``image_embeds_position_mask``, :data:`.structure.MARK_KEYS`), derived from the model.

The mask is the placeholder: its entries equal to 1 are an image's rows, in document order
(:attr:`~hf_hsap.data.vision.Modality.mark_key`). The collator carries it per token like ``input_ids`` (the spec's
``token_type_key``: a document without one gets zeros, as its model reads no mask as none), ``shard_batch`` slices
it per rank with the tokens, and the image modality's placeholders are counted from it, so each rank keeps the
feature rows of its own marked positions (:mod:`.shard`, :mod:`.select`). Other entries travel with it (Kosmos-2.5
reads its nonzero entries, -1 on an image's start and end tokens, as a segment embedding).

- Rows per image: the image-to-text projection's learned queries (``config.latent_query_num``), the same for every
  image: a counted modality, so a document whose mask disagrees with its images is refused by the collator.
- Positions: these models add sinusoidal positions that count from their table's ``padding_idx + 1`` for a
  document called alone; each packed document restarts there (``VisionLayout.position_start``).
- Pixels required: a forward that refuses a call without pixels (Kosmos-2) gets, on a rank holding no image, the
  batch's cheapest image and keeps none of its rows (``VisionLayout.empty_items``).
- Attention: Kosmos-2's text transformer builds a dense ``[B, 1, L, L]`` causal mask itself
  (``_prepare_decoder_attention_mask``, not Transformers' mask factories), which ``attn_implementation="hsap"``
  refuses; :func:`drop_dense_masks` (``prepare_model``) makes it build none, the documents coming from the plan.
  Its image-to-text projection attends from learned queries to one image's features with a text-config attention
  layer (not causal): :func:`mark_image_path_layers` flags it as an encoder's layer (bidirectional, per item).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..data.vision import Modality, VisionLayout, VisionSpec
from ..model_state import ENCODER_PART, ModelChanges
from .structure import MARK_KEYS, forward_keys, inner_vlm, param_names, required

__all__ = ["drop_dense_masks", "mark_image_path_layers", "marked_probe_inputs", "marked_spec"]

_PER_IMAGE = ("width", "height")  # Kosmos-2.5's forward takes each image's size (returned with its output)


class _Seen(Exception):
    """Raised by a pre-hook to stop a probe call at the text model's entrance."""


def marked_spec(model: torch.nn.Module, inner: torch.nn.Module) -> VisionSpec | None:
    """The spec of a family whose forward takes a per-token image mask, or ``None`` (none of
    :data:`.structure.MARK_KEYS`, or no ``config.latent_query_num``).

    Args:
        model: the model; inner: its module with ``get_image_features``.

    Returns:
        One image modality (the pixels ``get_image_features`` requires, counted at ``latent_query_num`` rows each,
        placed by the mask), the mask as the per-token key, 1-D positions from the model's first position.
    """
    keys = forward_keys(model)
    mark = next((k for k in MARK_KEYS if k in keys), None)
    queries = getattr(model.config, "latent_query_num", None)
    encode = getattr(type(inner), "get_image_features", None)
    if mark is None or not isinstance(queries, int) or not callable(encode):
        return None
    needed = required(encode)
    pixel_key = needed[0] if needed else "pixel_values"
    if pixel_key not in keys:
        return None
    items = tuple(k for k in _PER_IMAGE if k in keys and k not in param_names(encode))
    image = Modality("image", -1, pixel_key, item_keys=items, mark_key=mark)
    layout = VisionLayout(str(model.config.model_type), (image,), counted=("image",),
                          position_start=first_position(model), empty_items=needs_pixels(model, inner))

    def count(name: str, ex: Mapping[str, Any]) -> list[int]:
        if name != "image":
            raise KeyError(name)
        return [queries] * int(torch.as_tensor(ex[pixel_key]).shape[0])

    return VisionSpec(layout, token_type_key=mark, item_tokens=count)


def first_position(model: torch.nn.Module) -> int:
    """The first position the model's sinusoidal table gives a document called without ``position_ids``:
    ``padding_idx + 1`` of the module that makes positions from the input ids (0 where it has none)."""
    for m in model.modules():
        if callable(getattr(m, "create_position_ids_from_input_ids", None)) and \
                isinstance(getattr(m, "padding_idx", None), int):
            return int(m.padding_idx) + 1
    return 0


def needs_pixels(model: torch.nn.Module, inner: torch.nn.Module) -> bool:
    """Whether the forward refuses a call without pixels, asked with a two-token call stopped at its text model's
    entrance (``True`` where it cannot be asked: weights on the meta device, no text model)."""
    text = getattr(inner, "text_model", None) or getattr(inner, "language_model", None)
    params = list(model.parameters())
    if text is None or not params or any(p.is_meta for p in params):
        return True

    def stop(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        raise _Seen

    handle = text.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=torch.full((1, 2), 3, dtype=torch.long, device=params[0].device), use_cache=False)
    except _Seen:
        return False
    except (ValueError, TypeError):
        return True
    finally:
        handle.remove()
    return False


def marked_probe_inputs(model: torch.nn.Module, spec: VisionSpec, device: torch.device, dtype: torch.dtype
                        ) -> dict[str, Any] | None:
    """``check_model``'s probe inputs for a marked family: one image of the tower's size (``pixel_values``), its
    rows marked between two text tokens; ``None`` for other pixel keys (the probe then runs text only)."""
    image = spec.layout.modalities[0]
    vision = getattr(model.config, "vision_config", None)
    size = getattr(vision, "image_size", None)
    if image.pixel_key != "pixel_values" or not isinstance(size, int):
        return None
    pixels = torch.zeros(1, int(getattr(vision, "num_channels", 3)), size, size, device=device, dtype=dtype)
    n = spec.item_tokens("image", {image.pixel_key: pixels})[0]
    mark = torch.tensor([[0] + [1] * n + [0]], device=device)
    return {"input_ids": torch.full(mark.shape, 3, dtype=torch.long, device=device), image.pixel_key: pixels,
            image.mark_key: mark}


def _no_dense_mask(attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> None:
    """``_prepare_decoder_attention_mask`` under ``"hsap"``: no dense mask (the plan or the positions give the
    documents); a padding mask with zeros is refused."""
    if attention_mask is not None and not bool(attention_mask.bool().all()):
        raise ValueError("attn_implementation='hsap' takes no padding inside a row: pack the documents with "
                         "hf_hsap.PackingCollator (no attention_mask) instead of padding them")
    return None


def drop_dense_masks(model: torch.nn.Module, changes: ModelChanges) -> int:
    """Make every text module of ``model`` that builds its own dense causal mask (``_prepare_decoder_attention_mask``:
    Kosmos-2's text transformer) build none where its attention is ``"hsap"`` (undone with the journal).

    Args:
        model: the model; changes: ``prepare_model``'s journal.

    Returns:
        How many modules were changed.
    """
    n = 0
    for m in model.modules():
        config = getattr(m, "config", None)
        if callable(getattr(m, "_prepare_decoder_attention_mask", None)) and \
                getattr(config, "_attn_implementation", None) == "hsap":
            changes.set(m, "_prepare_decoder_attention_mask", _no_dense_mask)
            n += 1
    return n


def mark_image_path_layers(model: torch.nn.Module, changes: ModelChanges) -> int:
    """Flag the non-causal attention layers of a vision-language model's image path that run under a text config
    (outside its language model: Kosmos-2's image-to-text projection, learned queries attending to one image's
    features) as encoder layers, so that ``"hsap"`` serves them per item as SDPA does (undone with the journal).

    Args:
        model: the model; changes: ``prepare_model``'s journal.

    Returns:
        How many layers were flagged.
    """
    inner = inner_vlm(model)
    text = None if inner is None else getattr(inner, "text_model", None) or getattr(inner, "language_model", None)
    if text is None:
        return 0
    decoder = {id(m) for m in text.modules()}
    n = 0
    for m in inner.modules():
        if id(m) not in decoder and getattr(m, "is_causal", None) is False and \
                getattr(getattr(m, "config", None), "_attn_implementation", None) == "hsap" and \
                callable(getattr(m, "q_proj", None)):
            changes.put(m, ENCODER_PART, True)
            n += 1
    return n
