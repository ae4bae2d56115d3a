"""Vision items' encoder work in the planner: who encodes which item, and what that adds to each part's time.

A vision-language row's items (images, videos, audios) are encoded by the ranks that hold their placeholders
(:mod:`hf_hsap.multimodal.exchange`): every holder encodes an item split across parts (``"holders"``), or one
owner does and sends the other holders their feature rows (``"once"``). A long video row is mostly encoder work, so
``placement="auto"`` weighs it: each part's step time is its decoder time (:func:`.cost.step_time`) plus the encoder
work of the items it encodes (:func:`encoder_per_part`), and ``auto``'s candidates include the greedy passes refined
with that work on their parts (:mod:`.candidates`), so the busiest part's encoder plus decoder work is balanced
within the token cap.

An item's work is ``patches * patch_work`` decoder tokens (``patch_work``: one patch through the tower, forward and
backward, in tokens through the decoder's layers, :func:`encoder_patch_work`). The planner's cost model prices one
layer, so it adds ``work * token_cost`` to each layer's part time: over the decoder's layers that is the encoder's
share of the step, in the cost model's unit (attention pairs), whatever layer count the planner was given.

The owners (:func:`assign_owners`) are the one rule of :mod:`hf_hsap.multimodal.exchange`: items held by one part are
encoded there; split items, largest first, by the holder with the least encoder work so far; a holder that would
encode no item of a modality also encodes its smallest split item of it. Under ``"auto"`` the planner charges the
cheaper of the two ways on the busiest part (the encoder work alone: the rows moved are not priced here).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ITEM_ENCODINGS", "ItemWork", "assign_owners", "encoder_patch_work", "encoder_per_part", "layer_params"]

ITEM_ENCODINGS = ("auto", "holders", "once")


@dataclass(frozen=True, eq=False)
class ItemWork:
    """The encoder work of one batch's vision items (what ``plan_sequence(..., items=...)`` weighs).

    Attributes:
        positions: ``[N]`` int64 global (flattened) position of every placeholder.
        item: ``[N]`` int64 the item of each placeholder (``0 .. n_items - 1``).
        work: ``[n_items]`` float64 encoder work of each item (forward + backward) in decoder tokens (a token
            through every decoder layer).
        group: ``[n_items]`` int64 the modality (one encoder call) of each item.
        encoding: how an item split across parts is encoded (:data:`ITEM_ENCODINGS`, ``HSAPConfig.vision_encoding``).
    """

    positions: np.ndarray
    item: np.ndarray
    work: np.ndarray
    group: np.ndarray
    encoding: str = "auto"

    def __post_init__(self) -> None:
        if self.encoding not in ITEM_ENCODINGS:
            raise ValueError(f"encoding={self.encoding!r}: use one of {ITEM_ENCODINGS}")
        n = self.work.shape[0]
        if self.positions.shape != self.item.shape or self.group.shape != (n,):
            raise ValueError(f"ItemWork: {self.positions.shape[0]} positions, {self.item.shape[0]} item indices, "
                             f"{n} works and {self.group.shape[0]} groups do not match")
        if self.item.size and (self.item.min() < 0 or self.item.max() >= n):
            raise ValueError(f"ItemWork: item indices outside 0..{n - 1}")
        if (self.work < 0).any() or not np.isfinite(self.work).all():
            raise ValueError("ItemWork: every item's work must be finite and >= 0")

    @staticmethod
    def of(positions: Any, item: Any, work: Any, group: Any = None, *, encoding: str = "auto") -> "ItemWork":
        """An :class:`ItemWork` from array-likes (``group`` default: one modality)."""
        w = np.asarray(work, dtype=np.float64).reshape(-1)
        g = np.zeros(w.shape[0], np.int64) if group is None else np.asarray(group, dtype=np.int64).reshape(-1)
        return ItemWork(np.asarray(positions, dtype=np.int64).reshape(-1), np.asarray(item, dtype=np.int64).reshape(-1),
                        w, g, encoding)

    @property
    def n_items(self) -> int:
        """Items."""
        return int(self.work.shape[0])

    @property
    def key(self) -> tuple[bytes, str]:
        """A digest of the contents (equal items, equal key: what the plan cache compares)."""
        h = hashlib.blake2b(digest_size=16)
        for a in (self.positions, self.item, self.work, self.group):
            h.update(np.ascontiguousarray(a).tobytes())
            h.update(b"|")
        return h.digest(), self.encoding

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ItemWork) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


def layer_params(hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int) -> int:
    """Parameters of one transformer layer by the planner's accounting: q, k, v and output projections and a
    three-matrix (gated) MLP, ``hidden * head_dim * (2 heads + 2 kv_heads) + 3 * hidden * ffn``. A token through it
    costs ``6 * params`` FLOPs forward + backward (:meth:`.cost.CostModel.from_shapes`)."""
    return hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * ffn


def _first(config: Any, *names: str) -> int | None:
    """The first of ``names`` that ``config`` has as a positive int (a field that raises on reading, as a
    heterogeneous config's per-layer ``head_dim`` does, counts as absent)."""
    for n in names:
        try:
            v = getattr(config, n, None)
        except Exception:  # noqa: BLE001 - e.g. AmbiguousGlobalPerLayerAttributeError: not a global size
            continue
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0:
            return int(v)
    return None


def _tower_params(config: Any) -> int | None:
    """Per-patch parameters of a tower config by :func:`layer_params` (layers x one layer), or None (unread)."""
    layers = _first(config, "depth", "num_hidden_layers", "num_layers", "encoder_layers")
    hidden = _first(config, "hidden_size", "embed_dim", "d_model", "width")
    if layers is None or hidden is None:
        return None
    heads = _first(config, "num_heads", "num_attention_heads", "encoder_attention_heads") or 1
    ffn = _first(config, "intermediate_size", "encoder_ffn_dim")
    if ffn is None:
        try:
            ratio = getattr(config, "mlp_ratio", None)
        except Exception:  # noqa: BLE001 - as in _first
            ratio = None
        ffn = int(hidden * ratio) if isinstance(ratio, (int, float)) and ratio > 0 else 4 * hidden
    return layers * layer_params(hidden, heads, heads, max(1, hidden // heads), ffn)


def encoder_patch_work(config: Any, tower: str = "vision_config") -> float:
    """One patch through a model's ``tower`` (forward + backward) in decoder tokens: the tower's parameters per
    patch over the decoder's per token (:func:`layer_params` of both: ``depth x (4 h^2 + 3 h ffn)`` against
    ``num_hidden_layers`` decoder layers'), FLOPs counted as the cost model counts the decoder's, ``6 x params`` per
    token (neither side's attention pairs, nor the tower's merger). Stated from the shapes, not measured (a GPU
    calibration has not tuned it).

    Args:
        config: a vision-language model's config. tower: the attribute of the tower's config (``"audio_config"``).

    Returns:
        The ratio; 0.0 where the tower's or the decoder's sizes cannot be read (the planner then weighs no encoder).
    """
    from ..model_shape import text_config

    try:
        sub = getattr(config, tower, None)
    except Exception:  # noqa: BLE001 - as in _first
        sub = None
    text = text_config(config)
    hidden = _first(text, "hidden_size")
    heads = _first(text, "num_attention_heads")
    tower_p = _tower_params(sub) if sub is not None else None
    if tower_p is None or hidden is None or heads is None:
        return 0.0
    kv = _first(text, "num_key_value_heads") or heads
    head_dim = _first(text, "head_dim") or max(1, hidden // heads)
    ffn = _first(text, "intermediate_size") or 4 * hidden
    layers = _first(text, "num_hidden_layers") or 1
    return float(tower_p) / float(layers * layer_params(hidden, heads, kv, head_dim, ffn))


def holdings(items: ItemWork, part_of: np.ndarray, n_parts: int) -> np.ndarray:
    """``[n_parts, n_items]`` placeholders of each item on each part (``part_of``: ``[N]`` each placeholder's part)."""
    flat = np.bincount(part_of * items.n_items + items.item, minlength=n_parts * items.n_items)
    return flat.reshape(n_parts, items.n_items)


def assign_owners(counts: np.ndarray, work: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``"once"`` rule (module docstring): ``(owner [n_items], encodes [parts, n_items] bool)``.

    Args:
        counts: ``[parts, n_items]`` placeholders of each item on each part (an item on no part: owner -1).
        work: ``[n_items]`` encoder work of each item. group: ``[n_items]`` its modality.
    """
    holds = counts > 0
    n_holders = holds.sum(axis=0)
    owner = np.where(n_holders == 1, holds.argmax(axis=0), -1)
    encodes = np.zeros_like(holds)
    one = np.flatnonzero(n_holders == 1)
    encodes[owner[one], one] = True
    load = np.zeros(counts.shape[0])
    np.add.at(load, owner[one], work[one].astype(float))
    split = np.flatnonzero(n_holders > 1)
    for i in split[np.argsort(-work[split], kind="stable")]:  # largest first (ties: item order)
        holders = np.flatnonzero(holds[:, i])
        r = min(holders, key=lambda r: (load[r], -counts[r, i], r))  # least loaded (ties: most rows, lowest)
        owner[i], encodes[r, i] = r, True
        load[r] += work[i]
    for g in np.unique(group):  # a holder encoding none of a modality's items encodes its smallest split item
        mine = group == g
        for r in np.flatnonzero((holds & mine).any(axis=1) & ~(encodes & mine).any(axis=1)):
            held = np.flatnonzero(holds[r] & mine)
            i = min(held, key=lambda i: (work[i], -counts[r, i], i))
            encodes[r, i] = True
    return owner, encodes


def encoder_per_part(items: ItemWork, part_of: np.ndarray, n_parts: int) -> np.ndarray:
    """``[n_parts]`` encoder work (decoder tokens) of the items each part encodes under ``items.encoding``
    (``"auto"``: the way whose busiest part has less; module docstring).

    Args:
        items: the items. part_of: ``[N]`` the part holding each placeholder. n_parts: P.
    """
    if items.n_items == 0:
        return np.zeros(n_parts)
    counts = holdings(items, part_of, n_parts)
    holders = (counts > 0).astype(np.float64) @ items.work
    if items.encoding == "holders":
        return holders
    once = assign_owners(counts, items.work, items.group)[1].astype(np.float64) @ items.work
    if items.encoding == "once":
        return once
    return once if once.max() < holders.max() else holders


def part_of_positions(start: np.ndarray, end: np.ndarray, part: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``[N]`` the part holding each of ``positions`` (segments ``[start, end)`` of ``part``, disjoint)."""
    order = np.argsort(start, kind="stable")
    idx = np.searchsorted(start[order], positions, side="right") - 1
    return part[order][idx]
