"""Worker functions for tests/model/test_vlm_exchange.py: a packed image / video row under SP with every split item
encoded by every holder or encoded once and its rows sent (``HSAPConfig.vision_encoding``), against each document
alone (:mod:`workers.vlm`)."""
from __future__ import annotations

from typing import Any

import torch

import hf_hsap
from hf_hsap.multimodal import ROWS_KEY
from workers import vlm as W


def _shapes(shapes: list | None) -> Any:
    """Set :mod:`workers.vlm`'s document shapes (image and video) to ``shapes``; returns the previous ones."""
    saved = W.SHAPES, W.VIDEO_SHAPES
    if shapes is not None:
        W.SHAPES = W.VIDEO_SHAPES = [(a, tuple(g) if g else None, b) for a, g, b in shapes]
    return saved


def reference(family: str, video: bool, shapes: list | None = None) -> dict[str, Any]:
    """:func:`workers.vlm.documents_alone` of ``shapes`` (default: :mod:`workers.vlm`'s)."""
    saved = _shapes(shapes)
    try:
        return W.documents_alone(family, video)
    finally:
        W.SHAPES, W.VIDEO_SHAPES = saved


def exchange_run(family: str, sp_size: int, ulysses: int, video: bool, encoding: str,
                 shapes: list | None = None) -> dict[str, Any]:
    """:func:`workers.vlm.vlm_forward_backward` with ``vision_encoding=encoding``, plus what this rank encoded and
    moved: ``{"encoded": {modality: placeholders encoded}, "sent", "received": rows}``."""
    sp = W.get_sp(sp_size, ulysses)
    sp.config = sp.config.replace(vision_encoding=encoding)
    saved = _shapes(shapes)
    seen: dict[str, Any] = {}
    real_shard = hf_hsap.shard_batch

    def spy(*args: Any, **kwargs: Any) -> dict[str, Any]:
        local = real_shard(*args, **kwargs)
        seen.update(local[ROWS_KEY])
        return local

    hf_hsap.shard_batch = spy
    try:
        res = W.vlm_forward_backward(family, sp_size, ulysses, "auto", video)
    finally:
        hf_hsap.shard_batch = real_shard
        W.SHAPES, W.VIDEO_SHAPES = saved
        sp.config = sp.config.replace(vision_encoding="auto")
    ex = [v for k, v in seen.items() if k.endswith(":exchange")]
    res["encoded"] = {k.split(":")[0]: int(v.sum()) for k, v in seen.items() if k.endswith(":items")}
    res["sent"] = sum(int(e.send_index.numel()) for e in ex)
    res["received"] = sum(e.recv_rows for e in ex)
    return res
