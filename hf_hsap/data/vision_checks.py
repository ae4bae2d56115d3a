"""Per-document checks of vision examples (``PackingCollator``'s, before any compute): each refusal names the
example (its index in the batch) and what disagrees, with the fix.

An example's pixels, per-item keys, token types and placeholders must agree with each other (a grid's rows and
placeholders, the model's count of each image's placeholders, the same placeholders per item for uniform families)
and with the batch's earlier examples (what the packed batch concatenates must stack).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from .vision import Modality, VisionSpec

__all__ = ["check_vision_example"]


def check_vision_example(ex: Mapping[str, Any], n: int, ids: np.ndarray, *, spec: VisionSpec, max_length: int,
                         seen: dict[str, tuple[int, Any]]) -> None:
    """Refuse a vision document the packed batch could not carry exactly, before any compute: one longer than a row
    or pre-packed (its image would be cut), or whose pixels, per-item keys, token types and placeholders disagree.

    Args:
        ex: the example; n: its index in the batch; ids: its ``input_ids [n_tokens]``; spec: the model's
        :class:`VisionSpec`; max_length: the collator's row length before rounding; seen: what the batch's earlier
        examples fixed (the batch concatenates their pixels and per-item keys), filled here: ``key -> (example,
        value)``.

    Raises:
        ValueError: naming the example and what disagrees, with the fix.
    """
    if ex.get("seq_lengths") is not None:
        raise ValueError(f"example {n} is pre-packed (seq_lengths) but has vision inputs; pass one document per "
                         "example (TRL's packing=False datasets), PackingCollator packs them")
    if ids.size > max_length:
        raise ValueError(f"example {n} has {ids.size} tokens, more than max_length={max_length}, and a vision "
                         "document is never split (its image would be cut); raise max_length or drop such examples, "
                         f"e.g. dataset.filter(lambda e: len(e['input_ids']) <= {max_length})")
    key = spec.token_type_key
    types = None if not key or ex.get(key) is None else torch.as_tensor(ex[key])
    if types is not None and types.numel() != ids.size:
        raise ValueError(f"example {n}: {key} has {types.numel()} entries for {ids.size} input_ids; give one per "
                         f"token (the processor's {key}) or leave it out (the collator fills it)")
    for extra in spec.token_keys:
        given = ex.get(extra)
        if given is not None and torch.as_tensor(given).numel() != ids.size:
            raise ValueError(f"example {n}: {extra} has {torch.as_tensor(given).numel()} entries for {ids.size} "
                             f"input_ids; give one per token (the processor's {extra}) or leave it out (the collator "
                             "fills it)")
    for m in spec.layout.modalities:
        placeholders = int(m.placeholders(ids, ex).sum())
        if m.grid_key is not None:
            items = _grid_items(m, spec, ex, n, placeholders)
        elif spec.counts(m.name):
            items = _counted_items(m, spec, ex, n, placeholders)
        elif m.token_id < 0:  # no placeholder (Idefics: its per-token image mask says which tokens see which image)
            items = _n_items(m, ex, n)
        else:
            items = _uniform_items(m, ex, n, placeholders, seen)
        if not items:
            continue
        missing = [k for k in m.required if ex.get(k) is None]
        if missing:
            raise ValueError(f"example {n}: its {m.name}s have {m.pixel_key} but no {', '.join(missing)} (the "
                             f"model's encoder needs it for each {m.name}); keep the processor's "
                             f"{', '.join(missing)} with each document")
        for key in (m.pixel_key, *m.item_keys):
            if key == m.grid_key or ex.get(key) is None:
                continue
            value = torch.as_tensor(ex[key])
            axis = m.axis(key)
            if key in m.token_rows:  # one entry per placeholder (Molmo2's pooling indices)
                _check_entries(m, key, value, n, placeholders, per="placeholder")
            elif key != m.pixel_key:
                _check_entries(m, key, value, n, items)
            rest = tuple(d for i, d in enumerate(value.shape) if i != axis)
            what = len(rest) if key in m.padded else rest  # padded keys: only their number of dimensions
            _same_in_batch(seen, f"{key} shape", n, what,
                           lambda first, k: f"example {n}: its {key} rows are {_shape(what)} where example {k}'s "
                                            f"are {_shape(first)}; give every document pixels from the same "
                                            "processor")
        for item_key in m.item_keys:
            if item_key == m.grid_key:
                continue
            given = ex.get(item_key) is not None
            _same_in_batch(seen, f"{item_key} given", n, given,
                           lambda first, k: f"example {n} {'gives' if given else 'has no'} {item_key} "
                                            f"for its {m.name}s where example {k} "
                                            f"{'gives it' if first else 'has none'}; give it for every {m.name} of "
                                            "the batch or for none")


def _shape(what: Any) -> str:
    """``3x8x8`` (a shape) or ``4-D`` (a padded key's number of dimensions)."""
    return f"{what}-D" if isinstance(what, int) else _dims(what)


def _dims(shape: tuple[int, ...]) -> str:
    """``3x8x8``."""
    return "x".join(map(str, shape))


def _same_in_batch(seen: dict[str, tuple[int, Any]], what: str, n: int, value: Any,
                   message: Callable[[Any, int], str]) -> None:
    """Refuse ``value`` of example ``n`` where an earlier example of the batch fixed another one for ``what``."""
    k, first = seen.setdefault(what, (n, value))
    if first != value:
        raise ValueError(message(first, k))


def _grid_items(m: Modality, spec: VisionSpec, ex: Mapping[str, Any], n: int, placeholders: int) -> int:
    """The items of a grid modality in one example, after checking its grid against its pixels and placeholders
    (``t * h * w / merge`` per item, or the model's count where :attr:`VisionSpec.item_tokens` counts them)."""
    layout = spec.layout
    pixels, grid = ex.get(m.pixel_key), ex.get(m.grid_key)
    if pixels is None and grid is None:
        if placeholders:
            raise ValueError(f"example {n} holds {placeholders} {m.name} placeholder tokens ({m.marker}) but no "
                             f"{m.pixel_key}; keep the processor's pixels with each document")
        return 0
    if grid is None:
        raise ValueError(f"example {n}: {m.grid_key} is missing (the {m.name}'s pixels need their grid); keep the "
                         f"processor's {m.grid_key} with each document")
    if pixels is None:
        raise ValueError(f"example {n} has {m.grid_key} but no {m.pixel_key}; keep the processor's pixels with each "
                         "document")
    grid = torch.as_tensor(grid).to(torch.int64)
    if grid.dim() != 2 or grid.shape[1] != m.grid_dims:
        what = "t, h, w" if m.grid_dims == 3 else "h, w"
        raise ValueError(f"example {n}: {m.grid_key} has shape {tuple(grid.shape)}, expected [n_{m.name}s, "
                         f"{m.grid_dims}] ({what} per item, as the processor gives it)")
    cells = m.grid_cells(grid)
    shape = torch.as_tensor(pixels).shape
    n_rows = int(shape[m.pixel_axis]) if len(shape) > m.pixel_axis else 0
    if n_rows != int(cells.sum()) * m.cell_size:
        unit = "rows" if m.cell_size == 1 else f"entries along axis {m.pixel_axis} ({m.cell_size} per cell)"
        raise ValueError(f"example {n}: {m.pixel_key} holds {n_rows} {unit} but its {m.name} grids ask for "
                         f"{int(cells.sum()) * m.cell_size} ({'*'.join('thw'[-m.grid_dims:])} of {_grids(grid)}); "
                         "keep each document's pixels with its own grid")
    if spec.counts(m.name):
        return _counted_grid(m, spec, ex, n, placeholders, grid)
    tokens = int(cells.sum()) // (layout.merge * m.time_merge)
    if placeholders != tokens:
        side = int(round(layout.merge ** 0.5))
        side = f"{side}x{side}" + (f"x{m.time_merge} (temporal)" if m.time_merge > 1 else "")
        its = f"its {m.name} has a {_grids(grid)} grid" if len(cells) == 1 else \
            f"its {len(cells)} {m.name}s have {_grids(grid)} grids"
        raise ValueError(f"example {n}: {its} ({tokens} placeholders after the {side} "
                         f"merge) but the document holds {placeholders} {m.name} placeholder tokens ({m.marker}); "
                         "tokenize each document with the model's processor and keep its pixels with it")
    return len(cells)


def _counted_grid(m: Modality, spec: VisionSpec, ex: Mapping[str, Any], n: int, placeholders: int,
                  grid: torch.Tensor) -> int:
    """The items of a grid modality whose placeholders the model counts per item (VideoLLaMA3's per-item merge
    sizes, HunYuan-VL's row separators), after checking the counts against the document's placeholders."""
    for key in m.item_keys:
        if key != m.grid_key and ex.get(key) is not None:
            _check_entries(m, key, torch.as_tensor(ex[key]), n, len(grid))
    try:
        counts = [int(c) for c in spec.item_tokens(m.name, ex)]
    except (ValueError, IndexError, RuntimeError) as e:
        raise ValueError(f"example {n}: {e}") from e
    if len(counts) != len(grid) or sum(counts) != placeholders:
        its = f"its {m.name} ({_grids(grid)}) takes" if len(grid) == 1 else \
            f"its {len(grid)} {m.name}s ({_grids(grid)}) take"
        raise ValueError(f"example {n}: {its} {'+'.join(map(str, counts))} placeholders by the model's count but the "
                         f"document holds {placeholders} {m.name} placeholder tokens (id {m.token_id}); tokenize each "
                         "document with the model's processor and keep its pixels with it")
    return len(grid)


def _grids(grid: torch.Tensor) -> str:
    """``1x4x4, 1x8x4``: the ``t x h x w`` of each item."""
    return ", ".join("x".join(str(int(v)) for v in g) for g in grid)


def _uniform_items(m: Modality, ex: Mapping[str, Any], n: int, placeholders: int,
                   seen: dict[str, tuple[int, Any]]) -> int:
    """The items of a one-row-per-item modality in one example, after checking its placeholders split evenly, the
    same number per item as the batch's earlier examples."""
    items = _items_with_pixels(m, ex, n, placeholders)
    if items == 0:
        return 0
    if placeholders == 0:
        raise ValueError(f"example {n} has {items} {m.pixel_key} item(s) but no {m.name} placeholder tokens ("
                         f"{m.marker}); tokenize each document with the model's processor and keep its pixels with "
                         "it")
    if placeholders % items:
        raise ValueError(f"example {n} holds {placeholders} {m.name} placeholder tokens ({m.marker}) for its "
                         f"{items} {m.pixel_key} item(s): not the same number for each; give each {m.name} its "
                         "processor's placeholders")
    _same_in_batch(seen, f"{m.name} placeholders", n, placeholders // items,
                   lambda first, k: f"example {n} holds {placeholders // items} placeholder tokens ({m.marker}) "
                                    f"per {m.name} where example {k} holds {first}; every {m.name} of this family has "
                                    "the same number: give each its processor's placeholders")
    return items


def _items_with_pixels(m: Modality, ex: Mapping[str, Any], n: int, placeholders: int) -> int:
    """:func:`_n_items`, after refusing placeholders without pixels."""
    items = _n_items(m, ex, n)
    if items == 0 and placeholders:
        raise ValueError(f"example {n} holds {placeholders} {m.name} placeholder tokens ({m.marker}) but no "
                         f"{m.pixel_key}; keep the processor's pixels with each document")
    return items


def _n_items(m: Modality, ex: Mapping[str, Any], n: int) -> int:
    """The items of a modality without a grid in one example (entries of its pixels along the item axis, or of
    its ``rows_key`` where an item has several: Molmo2's crops)."""
    pixels = ex.get(m.pixel_key)
    if pixels is None:
        return 0
    shape = torch.as_tensor(pixels).shape
    if len(shape) <= m.item_axis:
        raise ValueError(f"example {n}: {m.pixel_key} has shape {tuple(shape)}, no item axis {m.item_axis}; keep the "
                         "processor's pixels with each document")
    if m.rows_key is None:
        return int(shape[m.item_axis])
    if ex.get(m.rows_key) is None:
        raise ValueError(f"example {n}: its {m.name}s have {m.pixel_key} but no {m.rows_key} (each {m.name}'s "
                         f"entries of {m.pixel_key}); keep the processor's {m.rows_key} with each document")
    rows = torch.as_tensor(ex[m.rows_key]).reshape(-1)
    if int(rows.sum()) != int(shape[m.item_axis]):
        raise ValueError(f"example {n}: {m.pixel_key} holds {int(shape[m.item_axis])} entries along axis "
                         f"{m.item_axis} but its {m.rows_key} ask for {int(rows.sum())}; keep each document's pixels "
                         "with its own processor outputs")
    return int(rows.numel())


def _counted_items(m: Modality, spec: VisionSpec, ex: Mapping[str, Any], n: int, placeholders: int) -> int:
    """The items of a counted modality in one example, after checking that the model's count of each item's
    placeholders (:attr:`VisionSpec.item_tokens`) adds up to the document's placeholders."""
    items = _items_with_pixels(m, ex, n, placeholders)
    if items == 0:
        return 0
    missing = [k for k in m.item_keys if ex.get(k) is None]
    if missing:
        raise ValueError(f"example {n}: its {m.name}s have {m.pixel_key} but no {', '.join(missing)} (the model "
                         f"needs it to place each {m.name}); keep the processor's {', '.join(missing)} with each "
                         "document")
    for key in m.item_keys:
        if key not in m.token_rows:
            _check_entries(m, key, torch.as_tensor(ex[key]), n, items)
    try:
        counts = [int(c) for c in spec.item_tokens(m.name, ex)]
    except (ValueError, IndexError, RuntimeError) as e:
        raise ValueError(f"example {n}: {e}") from e
    if len(counts) != items or sum(counts) != placeholders:
        its = f"its {m.name} takes" if items == 1 else f"its {items} {m.name}s take"
        raise ValueError(f"example {n}: {its} {'+'.join(map(str, counts))} placeholders by the model's count (from "
                         f"{', '.join((m.pixel_key, *m.item_keys))}) but the document holds {placeholders} {m.name} "
                         f"placeholder tokens ({m.marker}); tokenize each document with the model's processor "
                         "and keep its pixels with it")
    return items


def _check_entries(m: Modality, key: str, value: torch.Tensor, n: int, items: int, per: str = "") -> None:
    """Refuse a per-item key of example ``n`` without one entry per item (``per``: per placeholder) along the
    modality's item axis."""
    axis = 0 if per else m.axis(key)
    what = f"{m.name} {per}".strip()
    entries = int(value.shape[axis]) if value.dim() > axis else value.numel()
    if entries != items:
        raise ValueError(f"example {n}: {key} has {entries} entries for its {items} {what}(s); give one per "
                         f"{what} (along axis {axis}), as the processor does")
