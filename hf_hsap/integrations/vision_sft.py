"""Packed vision datasets in ``HSAPSFTTrainer`` (TRL's ``SFTTrainer`` refuses ``packing=True`` for them).

TRL turns a vision example (``images`` + ``messages`` or ``prompt`` / ``completion``) into model inputs on the fly
with its ``DataCollatorForVisionLanguageModeling``: the processor's chat template, the image placeholders, the
labels (completion-only or assistant-only loss where TRL supports them). :class:`VisionPackingCollator` runs that
collator on each example alone (one document, no padding, no truncation) and packs the documents with
:class:`~hf_hsap.data.PackingCollator` and the model's :func:`~hf_hsap.multimodal.vision_spec`: pixels in
document order, per-document positions, document boundaries. TRL's own processing is reused unchanged.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..data import PackingCollator
from ..log import get_logger
from ..multimodal import vision_spec

__all__ = ["VisionPackingCollator", "is_vision_dataset"]

logger = get_logger(__name__)
_TOKEN_KEYS = ("input_ids", "labels", "mm_token_type_ids", "token_type_ids", "completion_mask", "assistant_masks")


def is_vision_dataset(dataset: Any) -> bool:
    """Whether a dataset's first example has images (TRL's own test: an ``image`` or ``images`` key)."""
    if dataset is None:
        return False
    try:
        sample = next(iter(dataset))
    except (StopIteration, TypeError):
        return False
    return isinstance(sample, Mapping) and ("image" in sample or "images" in sample)


class VisionPackingCollator:
    """Process each vision example alone with TRL's collator, then pack them.

    Args:
        process: TRL's ``DataCollatorForVisionLanguageModeling`` (its ``max_length`` is turned off here: a
            vision document is never cut, the packer refuses one longer than a row).
        model: the vision-language model (its :func:`~hf_hsap.multimodal.vision_spec`).
        max_length: tokens per packed row. pad_to_multiple_of: row length rounding.
    """

    def __init__(self, process: Any, model: Any, max_length: int, pad_to_multiple_of: int | None = None) -> None:
        if max_length is None:
            raise ValueError("HSAPSFTTrainer packs vision datasets into rows of max_length tokens: set max_length")
        if getattr(process, "max_length", None) is not None:
            process.max_length = None
        self.process = process
        self.packer = PackingCollator(int(max_length), pad_to_multiple_of=pad_to_multiple_of or 1,
                                      pad_token_id=_pad_id(process), vision=vision_spec(model))
        logger.info("HSAPSFTTrainer: vision examples processed one by one by TRL's %s, packed into rows of %d tokens",
                    type(process).__name__, self.packer.row_length)

    def documents(self, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """One processed document per example (``[n]`` token keys, the processor's pixels and items)."""
        docs = []
        for ex in examples:
            batch = self.process([ex])
            docs.append({k: (v[0] if k in _TOKEN_KEYS else v) for k, v in batch.items() if k != "attention_mask"})
        return docs

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The packed batch (see :class:`~hf_hsap.data.PackingCollator`, "Vision examples")."""
        return self.packer(self.documents(examples))


def _pad_id(process: Any) -> int:
    tok = getattr(getattr(process, "processor", None), "tokenizer", None)
    pad = getattr(tok, "pad_token_id", None)
    return int(pad) if pad is not None else 0
