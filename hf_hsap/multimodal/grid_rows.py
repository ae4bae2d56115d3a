"""Grid families whose items do not take ``t * h * w / merge`` placeholders each, counted per item from the model.

A grid family's planner must know each item's placeholders before any encoder runs. Two kinds of grid families
break the fixed ``merge`` rule, both read from the model, not from a list of names:

- a merge size per item (VideoLLaMA3: ``get_image_features`` takes ``image_merge_sizes``, ``get_video_features``
  ``video_merge_sizes``, one entry per item, from the processor): the key is carried per item like the grid, and an
  item takes ``t * h * w / merge_size ** 2`` placeholders (:func:`merge_size_key`);
- rows of the encoder's own besides one per merge window (HunYuan-VL: a newline row after every merged row and a
  begin and end row per image; HY-V4-VL: a newline row per merged row of every frame): the encoder is asked on a few
  tiny grids of zero pixels once, when the spec is derived, and its rows fitted to
  ``t * (a * H * W + b * H + c * W + d) + e`` (``H, W``: the grid's merged height and width), which must then
  predict further probes exactly (:func:`fitted_rows`). A tower that takes single frames only (HunYuan-VL's
  merger) is fitted at ``t = 1`` and refuses an item of more frames, naming the document.

Every forward checks the counts against what the encoder returned
(:func:`hf_hsap.multimodal.select.select_rows`), so a count that disagreed with the model would stop training, never
train on misplaced features.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..data.vision import Modality

__all__ = ["RowFormula", "fitted_rows", "grid_counter", "merge_size_key", "vision_geometry"]

_METHODS = {"image": "get_image_features", "video": "get_video_features"}
_FIT = ((1, 2, 2), (1, 2, 3), (1, 3, 2), (1, 3, 3))  # (t, H, W) in merge windows: the fit's probes at t = 1
_CHECK = ((1, 4, 3), (1, 3, 5))  # further probes the fitted formula must predict


def vision_geometry(vision: Any) -> tuple[int, int | None, int, int]:
    """``(channels, image side or None, patch side, frames per temporal patch)`` of a vision config."""
    channels = int(getattr(vision, "num_channels", None) or getattr(vision, "in_channels", None)
                   or getattr(vision, "in_chans", None) or 3)
    size = getattr(vision, "image_size", None) or getattr(vision, "resolution", None)  # a VQ tokenizer's resolution
    if not size:  # a tower of towers (DeepSeek-OCR 2: SAM, then an encoder): the first tower's input size
        towers = [getattr(vision, n, None) for n in (getattr(vision, "sub_configs", None) or {})]
        size = next((t.image_size for t in towers if getattr(t, "image_size", None)), None)
    size = int(size[0] if isinstance(size, (list, tuple)) else size) if size else None
    patch = getattr(vision, "patch_size", None) or 1
    patch = int(patch[0] if isinstance(patch, (list, tuple)) else patch)
    frames = int(getattr(vision, "temporal_patch_size", None) or getattr(vision, "patch_temporal", None) or 1)
    return channels, size, patch, frames


def merge_size_key(inner: torch.nn.Module, name: str, forward: frozenset[str] | set[str]) -> str | None:
    """The per-item merge-size key of modality ``name`` (a parameter of its ``get_{name}_features`` ending in
    ``merge_sizes`` that the model's forward also takes), or ``None``."""
    method = getattr(type(inner), _METHODS.get(name, ""), None)
    if not callable(method):
        return None
    return next((k for k in inspect.signature(method).parameters if k.endswith("merge_sizes") and k in forward), None)


class RowFormula:
    """``rows(t, H, W) = t * (a * H * W + b * H + c * W + d) + e``, fitted from the encoder's rows.

    Attributes:
        coefficients: ``(a, b, c, d, e)``; merge: the spatial merge side (``H = h // merge``); frames: whether the
            encoder took a two-frame item (else items must have ``t = 1``).
    """

    def __init__(self, coefficients: tuple[int, ...], merge: int, frames: bool) -> None:
        self.coefficients, self.merge, self.frames = coefficients, merge, frames

    def __call__(self, t: int, h: int, w: int) -> int:
        """The rows of an item of grid ``[t, h, w]`` (in patches)."""
        a, b, c, d, e = self.coefficients
        big_h, big_w = h // self.merge, w // self.merge
        return t * (a * big_h * big_w + b * big_h + c * big_w + d) + e

    def __repr__(self) -> str:
        a, b, c, d, e = self.coefficients
        return f"t * ({a}*H*W + {b}*H + {c}*W + {d}) + {e}"


def _encoder_rows(inner: torch.nn.Module, name: str, pixel_shape: Callable[[int], tuple[int, ...]],
                  thw: tuple[int, int, int], merge: int, param: torch.Tensor) -> int:
    """The rows the model's ``get_{name}_features`` returns for zero pixels of grid ``thw`` (in merge windows)."""
    t, big_h, big_w = thw
    grid = torch.tensor([[t, big_h * merge, big_w * merge]], device=param.device)
    pixels = torch.zeros(pixel_shape(t * big_h * big_w * merge * merge), device=param.device, dtype=param.dtype)
    key = "pixel_values" if name == "image" else "pixel_values_videos"
    with torch.no_grad():
        out = getattr(inner, _METHODS[name])(**{key: pixels, f"{name}_grid_thw": grid}, return_dict=True).pooler_output
    if torch.is_tensor(out):
        return int(out.numel() // out.shape[-1])
    return int(sum(v.numel() // v.shape[-1] for v in out))


def fitted_rows(model: torch.nn.Module, inner: torch.nn.Module, name: str, *, merge: int) -> RowFormula | None:
    """The encoder's rows per item of modality ``name`` as a :class:`RowFormula`, or ``None`` where it returns one
    row per merge window (the fixed rule applies) or cannot be asked (a model on the meta device, a tower that takes
    no zero pixels of the grid layout, a merge window that is not a square: ``merge`` patches per placeholder).

    Raises:
        ValueError: the encoder's rows are not such a formula of the grid (a probe it does not predict).
    """
    param = next((p for p in inner.parameters() if p.is_floating_point()), None)
    side = math.isqrt(merge)
    if param is None or param.is_meta or side * side != merge:
        return None
    c, _, patch, frames = vision_geometry(model.config.vision_config)
    shapes = (lambda n: (n, c * frames * patch * patch), lambda n: (n, c, patch, patch))  # flattened or not
    devices = [param.device] if param.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # training's random streams stay as they were
        for shape in shapes:
            try:
                r22 = _encoder_rows(inner, name, shape, _FIT[0], side, param)
                break
            except Exception:  # noqa: BLE001 - this pixel shape is not the tower's; try the next
                continue
        else:
            return None
        if r22 == 4:  # one row per merge window at 2 x 2: the fixed rule (checked further by spec's probe)
            return None
        r23, r32, r33 = (_encoder_rows(inner, name, shape, thw, side, param) for thw in _FIT[1:])
        a = (r33 - r32) - (r23 - r22)
        c_ = (r23 - r22) - 2 * a
        b = (r32 - r22) - 2 * a
        k = r22 - 4 * a - 2 * b - 2 * c_
        try:
            two = _encoder_rows(inner, name, shape, (2, 2, 2), side, param)
            e, takes_frames = 2 * r22 - two, True
        except Exception:  # noqa: BLE001 - a tower that takes single frames only (HunYuan-VL's merger)
            e, takes_frames = 0, False
        formula = RowFormula((a, b, c_, k - e, e), side, takes_frames)
        checks = list(_CHECK) + ([(2, 3, 2)] if takes_frames else [])
        for thw in checks:
            got = _encoder_rows(inner, name, shape, thw, side, param)
            want = formula(thw[0], thw[1] * side, thw[2] * side)
            if got != want:
                raise ValueError(
                    f"its {name} encoder returns {got} rows for a grid of {thw[0]}x{thw[1]}x{thw[2]} merge windows, "
                    f"not the {want} of the rows it returned for smaller grids ({formula}): its rows per {name} are "
                    "not a formula of the grid the packed-row planner can count")
    return formula


def grid_counter(model: torch.nn.Module, inner: torch.nn.Module, mods: list[Modality],
                 forward: frozenset[str] | set[str], *, merge: int
                 ) -> tuple[list[Modality], dict[str, Rows], Callable[[Mapping[str, Any], int], dict[str, Any]] | None]:
    """The grid modalities with their per-item merge-size and keep-mask keys added, a placeholder counter for each
    modality whose items do not take ``t * h * w / merge`` placeholders, and the document transform that carries a
    keep mask per item (see the module docstring).

    Args:
        model: the model; inner: its module with the feature methods; mods: the grid modalities (image, video);
        forward: the forward's keywords; merge: patches per placeholder of the fixed rule.

    Returns:
        ``(modalities, {name: count(document) -> [placeholders of each item]}, document or None)``; ``document(example,
        n) -> example`` with each keep mask ``[rows of all items]`` as ``[n_items, most rows]`` (``False`` past an
        item's rows).

    Raises:
        ValueError: an encoder whose rows per item are no formula of the grid (:func:`fitted_rows`).
    """
    out, counters, keeps = [], {}, []
    for m in mods:
        key = merge_size_key(inner, m.name, forward)
        keep = f"{m.name}_compression_mask" if f"{m.name}_compression_mask" in forward else None
        formula = None if key is not None or m.name not in _METHODS else \
            fitted_rows(model, inner, m.name, merge=merge)
        rows = _merge_rows(m, key) if key is not None else _formula_rows(m, formula) if formula is not None \
            else _fixed_rows(m, merge)
        extra = tuple(k for k in (key, keep) if k is not None)
        out.append(dataclasses.replace(m, item_keys=(*m.item_keys, *extra), keep_key=keep,
                                       padded=(*m.padded, keep) if keep else m.padded))
        if keep is not None:
            keeps.append((m, keep, rows))
        if extra or formula is not None:
            counters[m.name] = _kept_count(m, keep, rows)
    return out, counters, (_keep_document(keeps) if keeps else None)


def _grid(m: Modality, ex: Mapping[str, Any]) -> torch.Tensor:
    return torch.as_tensor(ex[m.grid_key]).reshape(-1, 3).to("cpu", torch.int64)


Rows = Callable[[Mapping[str, Any]], list[int]]


def _fixed_rows(m: Modality, merge: int) -> Rows:
    def rows(ex: Mapping[str, Any]) -> list[int]:
        return (_grid(m, ex).prod(dim=1) // merge).tolist()
    return rows


def _merge_rows(m: Modality, key: str) -> Rows:
    def rows(ex: Mapping[str, Any]) -> list[int]:
        if ex.get(key) is None:
            raise ValueError(f"its {m.name}s have no {key} (the model merges each {m.name} by its own size); keep the "
                             f"processor's {key} with each document")
        sizes = torch.as_tensor(ex[key]).reshape(-1).to("cpu", torch.int64)
        grid = _grid(m, ex)
        if sizes.numel() != len(grid):
            raise ValueError(f"{key} has {sizes.numel()} entries for its {len(grid)} {m.name}(s); give one per "
                             f"{m.name}, as the processor does")
        return (grid.prod(dim=1) // sizes ** 2).tolist()
    return rows


def _formula_rows(m: Modality, formula: RowFormula) -> Rows:
    def rows(ex: Mapping[str, Any]) -> list[int]:
        grid = _grid(m, ex)
        if not formula.frames and bool((grid[:, 0] != 1).any()):
            raise ValueError(f"its {m.name} grids {grid.tolist()} have more than one frame, which the model's "
                             f"{m.name} encoder does not take (it merges single frames)")
        return [formula(*g) for g in grid.tolist()]
    return rows


def _kept_count(m: Modality, keep: str | None, rows: Rows) -> Rows:
    """Each item's placeholders: its encoder rows, or the rows its keep mask keeps (after :func:`_keep_document`)."""
    def count(ex: Mapping[str, Any]) -> list[int]:
        n_rows = rows(ex)
        if keep is None or ex.get(keep) is None:
            return n_rows
        mask = torch.as_tensor(ex[keep]).to(torch.bool)
        if mask.dim() != 2 or mask.shape[0] != len(n_rows) or any(bool(mask[i, r:].any()) for i, r in
                                                                  enumerate(n_rows)):
            raise ValueError(f"its {keep} of shape {tuple(mask.shape)} does not mark its {len(n_rows)} {m.name}s' "
                             f"{'+'.join(map(str, n_rows))} encoder rows; keep the processor's {keep} with each "
                             "document")
        return mask.sum(dim=1).tolist()
    return count


def _keep_document(keeps: list[tuple[Modality, str, Rows]]) -> Callable[[Mapping[str, Any], int], dict[str, Any]]:
    """``document(example, n)``: each keep mask over all the example's items' rows (the processor's ``[rows]``) as
    ``[n_items, most rows]``, so that it is carried and sliced per item like a grid."""
    def document(ex: Mapping[str, Any], n: int) -> dict[str, Any]:
        out = dict(ex)
        for m, keep, rows in keeps:
            if ex.get(keep) is None or ex.get(m.grid_key) is None:
                continue
            mask = torch.as_tensor(ex[keep]).to(torch.bool)
            if mask.dim() != 1:
                continue  # already per item
            try:
                n_rows = rows(ex)
            except ValueError as e:
                raise ValueError(f"example {n}: {e}") from e
            if mask.numel() != sum(n_rows):
                raise ValueError(f"example {n}: {keep} has {mask.numel()} entries but its {len(n_rows)} {m.name}s' "
                                 f"encoder rows are {'+'.join(map(str, n_rows))}; keep the processor's {keep} with "
                                 "each document")
            per_item = torch.zeros(len(n_rows), max(n_rows, default=0), dtype=torch.bool)
            for i, part in enumerate(mask.split(n_rows)):
                per_item[i, :part.numel()] = part
            out[keep] = per_item
        return out
    return document
