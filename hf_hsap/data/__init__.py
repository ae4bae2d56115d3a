"""Data utilities: the packing collator and loaders for the project's shipped corpus and SFT sets.

``PackingCollator`` and ``shift_labels_packed`` need only torch; the dataset helpers
(``load_pretrain_corpus``, ``load_sft_dataset``, ``tokenize_corpus``, ``DATA_DIR``) import the ``datasets``
library lazily, on first access.
"""

from __future__ import annotations

from typing import Any

from .packing import (
    IGNORE_INDEX,
    PackingCollator,
    best_fit_decreasing,
    shift_labels_global,
    shift_labels_packed,
)

_LAZY = {
    "DATA_DIR",
    "default_data_dir",
    "load_pretrain_corpus",
    "load_sft_dataset",
    "tokenize_corpus",
    "tokenizer_path",
}

__all__ = [
    "IGNORE_INDEX",
    "PackingCollator",
    "best_fit_decreasing",
    "shift_labels_global",
    "shift_labels_packed",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import datasets as _datasets

        return getattr(_datasets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
