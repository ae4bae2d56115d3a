"""Vision-language models on packed image / video + text rows, under sequence parallelism.

- :func:`vision_spec` (:mod:`.spec`): what the packing collator needs of a model, derived from the model itself
  (:mod:`.structure`: its forward's keys, encoders and placeholders), or a refusal naming the structure.
- :func:`shard_vision` (:mod:`.shard`): each rank's images, called by :func:`hf_hsap.shard_batch`; an image or video
  split across ranks encoded by every holder or once, its rows sent (:mod:`.exchange`, chosen per batch by price);
  :func:`item_work`: the items' encoder work, which the SP planner balances with the decoder's
  (:mod:`hf_hsap.plan.items`).
- :func:`prepare_vision` (:mod:`.select`): the model keeps only its rank's feature rows; called by
  :func:`hf_hsap.prepare_model`.
"""
from .select import prepare_vision, select_rows
from .shard import ROWS_KEY, batch_blocks, image_blocks, item_work, shard_vision, vision_keys
from .spec import VisionRefusal, accepted_families, inner_vlm, is_vlm, vision_spec
from .structure import REFUSAL_KINDS

__all__ = ["REFUSAL_KINDS", "ROWS_KEY", "VisionRefusal", "accepted_families", "batch_blocks", "image_blocks",
           "inner_vlm", "is_vlm", "item_work", "prepare_vision", "select_rows", "shard_vision", "vision_keys", "vision_spec"]
