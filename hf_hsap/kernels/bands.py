"""Cutting one varlen segment into calls of PyTorch's CPU flash op (used by :mod:`hf_hsap.kernels.cpu`).

The op runs full attention or a *top-left* aligned causal mask (query ``i`` sees keys ``j <= i`` of the
call). A segment's mask (bottom-right causal, flash-attn's left window) is cut into calls of three kinds,
each a rectangle of query rows x key rows relative to the segment:

* ``FULL``: every query of the rectangle sees every key;
* ``CAUSAL``: a square, query ``i`` sees key ``j <= i`` (the op's own causal mask);
* ``ANTI``: a square, query ``i`` sees key ``j >= i`` (the op's causal mask on row-flipped q and k/v).

Calls that share query rows are merged by log-sum-exp; every visible (query, key) pair is in exactly one
call and no hidden one in any (the unit tests check it pair by pair). Queries that see nothing are in no
call and no call has zero rows or zero keys (the op crashes on zero-length keys).

Unwindowed segments (and windows that hide nothing in the segment, see :func:`effective_window`) are cut by
:func:`plain_calls`: a full part plus one causal square. Windowed ones by :func:`band_calls`, with positions
``p = i + Lk - Lq`` (the key a query is aligned with) and window ``w``:

* non-causal: queries with ``p < w`` see every key (one full rectangle); the others see ``[p - w, Lk)``: one
  anti square (the staircase ``[p - w, ...)``) plus one full rectangle of the last ``w`` keys;
* causal: queries with ``p < w`` see ``[0, p]`` (a bottom-right causal part, cut like an unwindowed segment);
  the others, in blocks ``[p0, p1)`` of ``w`` positions, see ``[p - w, p]``: a causal square on keys
  ``[p0, p1)``, an anti square on keys ``[p0 - w, p1 - w)`` and, for a last block shorter than ``w``, a full
  rectangle on keys ``[p1 - w, p0)``.

Squares of either kind are halved down to ``block`` rows where asked (``kind(n) = kind(n/2) + full + kind(n/2)``),
see :func:`halve` and the module docstring of :mod:`hf_hsap.kernels.cpu` for why.
"""
from __future__ import annotations

FULL, CAUSAL, ANTI = 0, 1, 2  # call kinds (FULL == False and CAUSAL == True: plain calls use bools)

Call = tuple[int, int, int, int, int]  # (q_lo, q_hi, k_lo, k_hi, kind), relative to the segment


def effective_window(lk: int, window_left: int | None) -> int | None:
    """``window_left``, or ``None`` when it hides nothing in a segment of ``lk`` keys (``window_left >= lk - 1``:
    every query's window starts at or before key 0)."""
    return None if window_left is None or window_left >= lk - 1 else window_left


def halve(q0: int, k0: int, n: int, block: int, out: list[Call], kind: int = CAUSAL) -> None:
    """Append the calls of the ``kind`` (CAUSAL or ANTI) square ``q[q0:q0+n] x k[k0:k0+n]``, halved down to
    ``block`` rows (``block <= 0``: one call). CAUSAL: ``causal(h)`` + the full lower-left rectangle +
    ``causal(n - h)``; ANTI: ``anti(h)`` + the full upper-right rectangle + ``anti(n - h)``."""
    if block <= 0 or n <= block:
        out.append((q0, q0 + n, k0, k0 + n, True if kind == CAUSAL else kind))
        return
    h = n // 2
    halve(q0, k0, h, block, out, kind)
    if kind == CAUSAL:
        out.append((q0 + h, q0 + n, k0, k0 + h, False))
    else:
        out.append((q0, q0 + h, k0 + h, k0 + n, FULL))
    halve(q0 + h, k0 + h, n - h, block, out, kind)


def plain_calls(lq: int, lk: int, causal: bool, block: int = 0) -> list[Call]:
    """Split one bottom-right causal (or full) segment into calls the top-left causal op can run.

    Args:
        lq, lk: queries and keys of the segment.
        causal: bottom-right aligned causal mask, else full attention.
        block: halve causal squares down to this many rows (0: one call per square).

    Returns:
        ``(q_lo, q_hi, k_lo, k_hi, causal)`` relative to the segment (kind as a bool: False = FULL,
        True = CAUSAL). Queries that see no key (``lq > lk``: the first ``lq - lk``) are in no call.
    """
    if lq == 0 or lk == 0:
        return []
    if not causal:
        return [(0, lq, 0, lk, False)]
    off = lk - lq  # query i sees keys j <= i + off
    calls: list[Call] = [(0, lq, 0, off, False)] if off > 0 else []
    halve(max(0, -off), max(0, off), min(lq, lk), block, calls)
    return calls


def band_calls(lq: int, lk: int, causal: bool, window_left: int, block: int = 0) -> list[Call]:
    """Split one segment with a left window into FULL / CAUSAL / ANTI calls (see the module docstring).

    Args:
        lq, lk: queries and keys of the segment.
        causal: bottom-right aligned causal mask, else full attention (on the window's side only).
        window_left: ``w >= 0``: query ``i`` sees keys ``j >= i + lk - lq - w``.
        block: halve CAUSAL and ANTI squares down to this many rows (0: one call per square).

    Returns:
        ``(q_lo, q_hi, k_lo, k_hi, kind)`` relative to the segment, queries that see nothing in no call.
        A causal window of ``w`` keys costs about ``2 * lk / w`` calls (before halving).
    """
    w = window_left
    if w < 0:
        raise ValueError(f"window_left must be >= 0, got {w}")
    if lq == 0 or lk == 0:
        return []
    if effective_window(lk, w) is None:  # the window hides nothing
        return plain_calls(lq, lk, causal, block)
    off = lk - lq  # query i is at position p = i + off
    calls: list[Call] = []
    if not causal:  # query i sees keys [max(0, p - w), lk)
        r0 = min(lq, max(0, w - off))  # rows [0, r0) have p < w: every key
        if r0:
            calls.append((0, r0, 0, lk, FULL))
        if r0 < lq:
            halve(r0, r0 + off - w, lq - r0, block, calls, ANTI)  # keys [p(r0) - w, lk - w)
            if w:
                calls.append((r0, lq, lk - w, lk, FULL))
        return calls
    i_s = max(0, -off)  # first query that sees a key (p >= 0)
    p_s = i_s + off
    if p_s < w:  # head: positions [p_s, w) see keys [0, p], a bottom-right causal w-key segment
        for ql, qh, kl, kh, kind in plain_calls(w - p_s, w, True, block):
            calls.append((i_s + ql, i_s + qh, kl, kh, kind))
    step = max(w, 1)
    for p0 in range(max(w, p_s), lk, step):
        p1 = min(p0 + step, lk)
        b, i0 = p1 - p0, p0 - off
        halve(i0, p0, b, block, calls, CAUSAL)  # keys [p0, p]
        if w:
            if b < w:
                calls.append((i0, i0 + b, p1 - w, p0, FULL))  # keys [p1 - w, p0): seen by every row
            halve(i0, p0 - w, b, block, calls, ANTI)  # keys [p - w, p1 - w)
    return calls
