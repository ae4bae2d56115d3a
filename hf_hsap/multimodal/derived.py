"""The families whose image encoder takes per-item inputs besides the pixels, each read from its model
(:func:`derived_spec`, asked by :func:`~hf_hsap.multimodal.spec.vision_spec` before its own layouts).

- NaViT crops (:mod:`.navit`: MiniCPM-V / MiniCPM-OCR's ``target_sizes``);
- NaFlex patches (:mod:`.naflex`: LFM2-VL's ``spatial_shapes`` and ``pixel_attention_mask``);
- a second pixel view (:mod:`.paired`: DeepSeek-VL-Hybrid's ``high_res_pixel_values``);
- a Q-Former's queries and prompt (:mod:`.qformer`: BLIP-2, InstructBLIP);
- a linear patch embedding without a tower (:mod:`.patches`: Fuyu);
- images placed by a per-token mask, no placeholder id (:mod:`.marked`: Kosmos-2, Kosmos-2.5);
- videos queried frame by frame by a Q-Former (:mod:`.qformer`: InstructBLIP-Video, whose placeholder is its video
  token).
- crops whose placeholders pool chosen patches (:mod:`.pooled`: Molmo2's ``image_token_pooling``).
- flattened patches with an ``(h, w)`` grid per image (:mod:`.hwgrid`: Nemotron-H Omni's ``image_grid_hw``).

Each is exact in the multimodal zoo in every mode; the encoder's rows per item are checked against the
placeholders every forward (:mod:`.select`).
"""
from __future__ import annotations

import torch

from ..data.vision import VisionSpec
from .hwgrid import hw_grid_spec
from .naflex import naflex_spec
from .navit import navit_spec
from .marked import marked_spec
from .paired import paired_spec
from .patches import patches_spec
from .pooled import pooled_spec
from .qformer import qformer_spec, video_qformer_spec
from .structure import token

__all__ = ["derived_spec"]

_RULES = (navit_spec, naflex_spec, paired_spec, qformer_spec, patches_spec, pooled_spec, hw_grid_spec)
_UNPLACED = (marked_spec, video_qformer_spec)  # rules for models without an image placeholder id


def derived_spec(model: torch.nn.Module, inner: torch.nn.Module) -> VisionSpec | None:
    """The spec of a family whose encoder takes per-item inputs besides the pixels, or ``None`` for any other.

    Args:
        model: the model; inner: its module with ``get_image_features``.

    Returns:
        The first rule's spec that reads the model (see the module docstring), or ``None``.
    """
    for unplaced in _UNPLACED:
        spec = unplaced(model, inner)
        if spec is not None:
            return spec
    image = token(model.config, "image_token_id", "image_token_index")
    if image is None:
        return None
    for rule in _RULES:
        spec = rule(model, inner, image)
        if spec is not None:
            return spec
    return None
