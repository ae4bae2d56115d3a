"""Tiled attention: any :class:`~.base.AttentionKernel` run over query tiles of a packed row, so that its backward's
working set is one tile's instead of the whole row's (the ``tiled_attention`` memory lever).

A varlen call's queries (the packed row) are cut into tiles of ``tile_tokens`` rows. A tile's queries attend the
keys of their documents up to the tile's end, bottom-right aligned as in the whole call (:mod:`.base`): document
``(qa, qb, ka, kb)`` with ``off = Lk - Lq`` gives the tile's rows ``[i0, i1)`` of it (relative) the keys
``[lo, i1 + off)``, and the kernel's bottom-right mask on that sub-segment is the document's own, for any ``lo``.

* **forward**: one kernel call per tile with every key its rows see (a flash forward's memory does not grow with
  the keys): ``out`` and ``lse`` of the tile's rows, written into the whole ``out`` / ``lse``. Nothing is merged.
* **backward**: per tile, the *near* call (the keys from the tile's first diagonal position on, and the window's
  keys before it: causal, window as the call's) and the *far* rounds (the keys before the first diagonal position,
  which every query of the tile sees: full attention, in chunks of ``tile_tokens`` keys; round ``r`` holds chunk
  ``r`` of every document of the tile). Each call gets the final ``out`` / ``lse`` of its rows (the kernel
  contract: the partial gradients add up); ``dQ`` of the tile is summed in float32 and cast into the whole ``dq``,
  ``dK`` / ``dV`` are summed in float32 over the whole row and cast back at the end. So the kernel's own backward
  buffers (flash's float32 ``dQ`` accumulator, its ``dQ|dK|dV``, under GQA ``dK|dV`` over the query heads) exist
  for one tile of queries and at most ``tile_tokens`` keys (plus the window) at a time.

Exact: the same scores, split into disjoint (query, key) blocks; only the summation order of the gradients changes.
Sliding windows are exact for causal calls (a tile sees at most ``tile_tokens + window`` keys, so no far rounds);
soft-capping is per score; sinks are applied by the caller to the final ``out`` / ``lse`` (:mod:`.sinks`) as without
tiles. A bidirectional call with a window is refused (its window is aligned to the document's last key, which a
tile's sub-segment does not end at).

Why by hand: flash-attn and PyTorch run a varlen backward over the whole call in one launch (its buffers scale with
the row); ring / zigzag attention libraries tile across ranks, not within one, and bring their own kernels. This
wrapper reuses whichever kernel :func:`~.select.select_kernel` picks (CPU and CUDA alike).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .base import AttentionKernel, VarlenSpec, check_shapes, lse_dtype

__all__ = ["TiledKernel", "TilePlan", "plan_tiles"]

Piece = tuple[int, int, int, int]  # (q_lo, q_hi, k_lo, k_hi): absolute rows of q and of k / v


@dataclass(frozen=True)
class TileCall:
    """One kernel call of a tile: its pieces (in query order) and its mask."""

    pieces: tuple[Piece, ...]
    causal: bool
    window_left: int | None

    def spec(self) -> VarlenSpec:
        """The varlen spec of the call's packed (gathered) rows."""
        return VarlenSpec.from_lengths([b - a for a, b, _, _ in self.pieces], [d - c for _, _, c, d in self.pieces],
                                       self.causal, self.window_left)


@dataclass(frozen=True)
class TilePlan:
    """The calls of one query tile ``[q_lo, q_hi)``: ``forward`` (``None``: no row of the tile sees a key) and
    ``backward`` (near call first, then the far rounds)."""

    q_lo: int
    q_hi: int
    forward: TileCall | None
    backward: tuple[TileCall, ...]


def _chunks(lo: int, hi: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, hi)) for a in range(lo, hi, size)]


def plan_tiles(spec: VarlenSpec, tile_tokens: int) -> list[TilePlan]:
    """The calls of every query tile of ``spec`` (module docstring).

    Args:
        spec: the whole call. tile_tokens: query rows per tile (and keys per far chunk), ``>= 1``.

    Returns:
        One :class:`TilePlan` per tile, in order; a (query, key) pair the spec's mask shows is in exactly one backward
        call and in the forward call of its query's tile, a hidden pair in none (a window's edge is the kernel's).

    Raises:
        ValueError: a bidirectional call with a window, or ``tile_tokens < 1``.
    """
    if tile_tokens < 1:
        raise ValueError(f"tile_tokens must be >= 1, got {tile_tokens}")
    w = spec.window_left
    if w is not None and not spec.causal:
        raise ValueError("tiled attention runs causal windows and full bidirectional attention, not a bidirectional "
                         "sliding window: turn MemoryLevers.tiled_attention off (--hsap_tiled_attention / "
                         "--tiled_attention) for this model")
    segs = spec.segments()
    plans, s0 = [], 0
    for t0 in range(0, spec.total_q, tile_tokens):
        t1 = min(t0 + tile_tokens, spec.total_q)
        while s0 < len(segs) and segs[s0][1] <= t0:
            s0 += 1
        fwd: list[Piece] = []
        near: list[Piece] = []
        far: list[list[Piece]] = []  # far[p]: the chunks of piece p
        for qa, qb, ka, kb in segs[s0:]:
            if qa >= t1:
                break
            i0, i1 = max(qa, t0) - qa, min(qb, t1) - qa
            if i1 <= i0:
                continue
            lk = kb - ka
            if not spec.causal:  # every key, far chunks only
                if lk:
                    fwd.append((qa + i0, qa + i1, ka, kb))
                    far.append([(qa + i0, qa + i1, ka + a, ka + b) for a, b in _chunks(0, lk, tile_tokens)])
                continue
            hi = i1 + lk - (qb - qa)  # keys [.., hi) of the tile's rows
            if hi <= 0:
                continue  # the rows see no key: output 0, lse -inf
            d = i0 + lk - (qb - qa)  # the tile's first diagonal key
            lo_near = max(0, d if w is None else d - w)
            fwd.append((qa + i0, qa + i1, ka + (0 if w is None else lo_near), ka + hi))
            near.append((qa + i0, qa + i1, ka + lo_near, ka + hi))
            if w is None and d > 0:
                far.append([(qa + i0, qa + i1, ka + a, ka + b) for a, b in _chunks(0, d, tile_tokens)])
        calls = [TileCall(tuple(near), True, w)] if near else []
        rounds = max((len(f) for f in far), default=0)
        calls += [TileCall(tuple(f[r] for f in far if r < len(f)), False, None) for r in range(rounds)]
        plans.append(TilePlan(t0, t1, TileCall(tuple(fwd), spec.causal, w) if fwd else None, tuple(calls)))
    return plans


def _consecutive(ranges: Sequence[tuple[int, int]]) -> bool:
    return all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def _take(x: torch.Tensor, ranges: Sequence[tuple[int, int]]) -> torch.Tensor:
    """The rows of ``ranges`` of ``x [N, ...]`` packed in order: a view when they are consecutive, else a copy."""
    if _consecutive(ranges):
        return x[ranges[0][0]:ranges[-1][1]]
    return torch.cat([x[a:b] for a, b in ranges])


def _add(acc: torch.Tensor, ranges: Sequence[tuple[int, int]], part: torch.Tensor, *, base: int = 0) -> None:
    """``acc[a - base:b - base] += `` the rows of ``part`` packed as :func:`_take` packs ``ranges`` (in place)."""
    if _consecutive(ranges):
        acc[ranges[0][0] - base:ranges[-1][1] - base] += part
        return
    pos = 0
    for a, b in ranges:
        acc[a - base:b - base] += part[pos:pos + b - a]
        pos += b - a


def _put(dst: torch.Tensor, ranges: Sequence[tuple[int, int]], part: torch.Tensor) -> None:
    """``dst[a:b] = `` the rows of ``part`` packed as :func:`_take` packs ``ranges`` (in place)."""
    pos = 0
    for a, b in ranges:
        dst[a:b] = part[pos:pos + b - a]
        pos += b - a


def _cap_kw(softcap: float | None) -> dict:
    return {} if softcap is None else {"softcap": softcap}


class TiledKernel:
    """An :class:`~.base.AttentionKernel` that runs ``inner`` over query tiles of ``tile_tokens`` (module docstring).

    Args:
        inner: the kernel that runs each tile's calls (e.g. :func:`~.select.select_kernel`'s).
        tile_tokens: query rows per tile and keys per far chunk of the backward.
    """

    def __init__(self, inner: AttentionKernel, tile_tokens: int) -> None:
        if tile_tokens < 1:
            raise ValueError(f"tile_tokens must be >= 1, got {tile_tokens}")
        self.inner, self.tile_tokens = inner, int(tile_tokens)
        self.name = f"tiled {getattr(inner, 'name', type(inner).__name__)}"
        self.supports_window = getattr(inner, "supports_window", False)
        self.supports_softcap = getattr(inner, "supports_softcap", False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: VarlenSpec, scale: float, *,
                softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """See :class:`~.base.AttentionKernel`. Shapes: q ``[Nq, Hq, D]``, k/v ``[Nk, Hkv, D]`` -> out ``[Nq, Hq, D]``
        (q's dtype), lse ``[Nq, Hq]`` (:func:`~.base.lse_dtype`)."""
        check_shapes(q, k, v, spec)
        plans = plan_tiles(spec, self.tile_tokens)
        out = torch.zeros_like(q)  # rows that see no key: 0 / -inf
        lse = torch.full(q.shape[:2], float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
        for plan in plans:
            call = plan.forward
            if call is None:
                continue
            qr, kr = [(a, b) for a, b, _, _ in call.pieces], [(c, d) for _, _, c, d in call.pieces]
            ks, vs = _take(k, kr), _take(v, kr)
            o, l = self.inner.forward(_take(q, qr), ks, vs, call.spec(), scale, **_cap_kw(softcap))
            _put(out, qr, o)
            _put(lse, qr, l.to(lse.dtype))
        return out, lse

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, *, spec: VarlenSpec, scale: float,
                 softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """See :class:`~.base.AttentionKernel`; ``out`` / ``lse`` are the final values. Returns dq ``[Nq, Hq, D]``,
        dk/dv ``[Nk, Hkv, D]`` in the inputs' dtypes (dK|dV summed over the tiles in float32, float64 for float64)."""
        acc = lse_dtype(q.dtype)
        dq = torch.zeros_like(q)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        for plan in plan_tiles(spec, self.tile_tokens):
            if not plan.backward:
                continue
            dq_tile = torch.zeros((plan.q_hi - plan.q_lo, *q.shape[1:]), dtype=acc, device=q.device)
            for call in plan.backward:
                qr, kr = [(a, b) for a, b, _, _ in call.pieces], [(c, d) for _, _, c, d in call.pieces]
                gq, gk, gv = self.inner.backward(_take(dout, qr), _take(q, qr), _take(k, kr), _take(v, kr),
                                                 _take(out, qr), _take(lse, qr), spec=call.spec(), scale=scale,
                                                 **_cap_kw(softcap))
                _add(dq_tile, qr, gq, base=plan.q_lo)
                del gq
                _add(dk, kr, gk)
                del gk
                _add(dv, kr, gv)
                del gv
            dq[plan.q_lo:plan.q_hi] = dq_tile
            del dq_tile
        dk_out = dk.to(k.dtype)
        del dk
        return dq, dk_out, dv.to(v.dtype)
