"""Vision-language models on packed image / video + text rows, under sequence parallelism.

- :func:`vision_spec` (:mod:`.spec`): what the packing collator needs of a model, for the families made exact.
- :func:`shard_vision` (:mod:`.shard`): each rank's images, called by :func:`hf_hsap.shard_batch`; an image or video
  split across ranks encoded by every holder or once, its rows sent (:mod:`.exchange`, chosen per batch by price).
- :func:`prepare_vision` (:mod:`.select`): the model keeps only its rank's feature rows; called by
  :func:`hf_hsap.prepare_model`.
"""
from .select import prepare_vision, select_rows
from .shard import ROWS_KEY, image_blocks, shard_vision, vision_keys
from .spec import (ANYRES_FAMILIES, GRID_FAMILIES, GRID_IMAGE_FAMILIES, PER_ROW_FAMILIES, SIZED_FAMILIES,
                   UNIFORM_FAMILIES, accepted_families, inner_vlm, is_vlm, vision_spec)

__all__ = ["ANYRES_FAMILIES", "GRID_FAMILIES", "GRID_IMAGE_FAMILIES", "PER_ROW_FAMILIES", "ROWS_KEY", "SIZED_FAMILIES",
           "UNIFORM_FAMILIES", "accepted_families", "image_blocks", "inner_vlm", "is_vlm", "prepare_vision",
           "select_rows", "shard_vision", "vision_keys", "vision_spec"]
