"""Encode an image or video split across SP ranks once, and send its feature rows to the other holders.

:mod:`.shard` gives each rank the items (images, videos) with a placeholder on it. An item split across ranks can be
encoded two ways, chosen per batch by :func:`route_items` (the one rule, below):

- ``"holders"``: every holder encodes it whole and keeps the feature rows of its own placeholders (no
  communication; the SP group's gradient reduction sums the item's pieces);
- ``"once"``: its *owner* (one holder) encodes it and sends every other holder the feature rows of that holder's
  placeholders, in one differentiable exchange per modality inside the wrapped ``get_image_features`` /
  ``get_video_features`` (:func:`exchange_rows`); the backward sends the rows' gradients back to the owner, so the
  tower's parameter gradients are the same sums::

      item i0 (6 rows) | rank 0 holds rows 0-1, rank 1 holds rows 2-5, owner: rank 1
      rank 1: encodes i0 -> keeps rows 2-5, sends rows 0-1 to rank 0     (backward: receives their gradients)
      rank 0: receives 2 rows                                            (backward: sends their gradients)

The rule (:func:`route_items`, its owners by :func:`hf_hsap.plan.items.assign_owners`, which the planner also
prices): items held by one rank are encoded there. Split items, largest first, go to the holder with the least
encoder work so far (an item's encoder work: its patches, ``placeholders * merge``). A rank calls an encoder only for
a modality whose pixels it has, and only callers can take part in an exchange, so a holder that would encode no item
of a modality also encodes its smallest split item of it (and receives nothing for that one). The batch then runs ``"once"`` where it prices cheaper on the busiest rank::

    holders: max_r  patch_cost * patches held by r
    once:    max_r  patch_cost * patches encoded by r + row_cost * rows r sends or receives + round_cost * exchanges

Prices (:class:`VisionPrice`) are in the planner's unit (:class:`~hf_hsap.plan.cost.CostModel`, attention pairs):
a row moved is priced as the cost model prices a KV token moved, scaled by their widths; a patch as a number of
decoder tokens. These two constants are stated, not measured: a GPU calibration has not tuned them yet.

The exchange is point-to-point between the owners and the holders they send to (not a collective over the whole SP
group: a rank without pixels of a modality never calls that encoder), with
:class:`~hf_hsap.comm.p2p.P2PExecutor` (gloo and NCCL).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..comm.p2p import Splits
from ..config import VISION_ENCODINGS
from ..log import get_logger, log_once
from ..plan.cost import CostModel
from ..plan.items import assign_owners

__all__ = ["ENCODINGS", "Holdings", "RowExchange", "Route", "VisionPrice", "exchange_rows", "route_items"]

logger = get_logger(__name__)
ENCODINGS = VISION_ENCODINGS  # HSAPConfig.vision_encoding
# Stated, not calibrated (module docstring): a feature row is about twice a KV token's width (hidden size against
# 2 * kv_heads * head_dim, Llama-3-8B: 4096 / 2048); a patch through a ~0.6B-parameter vision tower costs about three
# decoder-layer tokens of an 8B model (Qwen2.5-VL's tower against Llama-3-8B's layer: ~3x the FLOPs per token).
ROW_PER_KV_TOKEN = 2.0
PATCH_PER_TOKEN = 3.0
_TAG = 7300  # point-to-point tag of the exchanges (gloo matches by tag): + 2 * modality, + 1 backward


@dataclass(frozen=True)
class VisionPrice:
    """What :func:`route_items` weighs, in attention pairs (the :class:`~hf_hsap.plan.cost.CostModel` unit).

    Attributes:
        patch_cost: one patch through the vision tower (forward + backward).
        row_cost: one feature row sent (forward) and its gradient returned (backward).
        round_cost: the latency of one exchange (forward + backward).
    """

    patch_cost: float
    row_cost: float
    round_cost: float

    @staticmethod
    def from_cost(cost: CostModel | None) -> "VisionPrice":
        """The price under a plan's cost model (``None``: :meth:`CostModel.default`), scaled by the stated constants
        :data:`PATCH_PER_TOKEN` and :data:`ROW_PER_KV_TOKEN`."""
        cost = cost or CostModel.default()
        return VisionPrice(patch_cost=PATCH_PER_TOKEN * cost.token_cost,
                           row_cost=ROW_PER_KV_TOKEN * cost.kv_token_cost, round_cost=cost.round_cost)


@dataclass(frozen=True)
class Holdings:
    """Where one modality's placeholders are.

    Attributes:
        name: the modality. tokens: ``[n_items]`` placeholders of each item. patches: ``[n_items]`` encoder work of
        each item. held: per SP rank, ``[n_local]`` global feature rows of its placeholders in local token order.
    """

    name: str
    tokens: np.ndarray
    patches: np.ndarray
    held: tuple[np.ndarray, ...]

    def item_of(self, rows: np.ndarray) -> np.ndarray:
        """The item of each global feature row."""
        return np.searchsorted(np.cumsum(self.tokens), rows, side="right")

    def counts(self) -> np.ndarray:
        """``[ranks, n_items]`` placeholders of each item on each rank."""
        return np.stack([np.bincount(self.item_of(h), minlength=self.tokens.size) for h in self.held])


@dataclass(frozen=True)
class RowExchange:
    """One rank's part of one modality's exchange (what :func:`exchange_rows` runs).

    Attributes:
        send_index: ``[n_send]`` rows of this rank's encoded features to send, grouped by peer as ``send_splits``.
        send_splits / recv_splits: ``(peer, offset, rows)`` of each message (peer: SP rank).
        recv_rows: rows received (appended after this rank's own encoded rows).
        executor: the SP group's point-to-point executor (peer index = SP rank). tag: the messages' tag.
    """

    send_index: torch.Tensor
    send_splits: Splits
    recv_splits: Splits
    recv_rows: int
    executor: Any
    tag: int


@dataclass(frozen=True)
class Route:
    """One modality on this rank.

    Attributes:
        items: ``[n_enc]`` the items this rank encodes (document order). rows: ``[n_local]`` for each local
        placeholder, its row of ``cat(encoded features, received rows)``. exchange: this rank's sends and
        receives, or ``None`` (nothing moves).
    """

    items: np.ndarray
    rows: np.ndarray
    exchange: RowExchange | None


def _owners(mods: Sequence[Holdings], size: int, price: VisionPrice) -> tuple[list[np.ndarray], list[np.ndarray],
                                                                               float, float, int]:
    """The rule's "once" assignment: ``(owner [n_items] per modality, encodes [ranks, n_items] per modality,
    busiest price once, busiest price holders, rows moved)``."""
    if not mods:
        return [], [], 0.0, 0.0, 0
    counts = [h.counts() for h in mods]
    sizes = [h.tokens.size for h in mods]
    owner, encode = assign_owners(np.concatenate(counts, axis=1), np.concatenate([h.patches for h in mods]),
                                  np.repeat(np.arange(len(mods)), sizes))
    cut = np.cumsum(sizes)[:-1]
    owners, encodes = np.split(owner, cut), np.split(encode, cut, axis=1)
    load = sum(e.astype(float) @ h.patches.astype(float) for e, h in zip(encodes, mods))
    held_load = sum((c > 0).astype(float) @ h.patches.astype(float) for c, h in zip(counts, mods))
    moved = np.zeros(size)
    rounds = np.zeros(size)
    for k in range(len(mods)):
        recv = np.where(encodes[k], 0, counts[k])  # [ranks, items] rows each holder receives
        sent = np.zeros(size)
        np.add.at(sent, owners[k], recv.sum(axis=0))
        moved += recv.sum(axis=1) + sent
        rounds += (recv.sum(axis=1) + sent) > 0
    once = float(np.max(price.patch_cost * load + price.row_cost * moved + price.round_cost * rounds))
    holders = float(np.max(price.patch_cost * held_load))
    return owners, encodes, once, holders, int(moved.sum() // 2)


def route_items(mods: Sequence[Holdings], size: int, rank: int, *, encoding: str = "auto",
                price: VisionPrice | None = None, executor: Any = None) -> dict[str, Route]:
    """This rank's items to encode and rows to keep, send and receive (the module docstring's rule).

    Every rank computes the same assignment from the same global batch, so no coordination is needed.

    Args:
        mods: every modality's holdings (of every SP rank). size: the SP size. rank: this rank.
        encoding: ``"auto"`` (the cheaper on the busiest rank), ``"holders"`` or ``"once"``.
        price: the prices (default :meth:`VisionPrice.from_cost` of the default cost model).
        executor: the SP group's :class:`~hf_hsap.comm.p2p.P2PExecutor` (needed where rows move).

    Returns:
        ``{modality: Route}`` for the modalities with a placeholder on this rank.
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"vision_encoding={encoding!r}: use one of {ENCODINGS}")
    owners, encodes, once, holders, moved = _owners(mods, size, price or VisionPrice.from_cost(None))
    use_once = moved > 0 and (encoding == "once" or (encoding == "auto" and once < holders))
    if size > 1 and moved > 0:  # the first batch of each choice at info, every batch at debug
        choice = "encoded once, rows sent" if use_once else "encoded by every holder"
        msg = ("vision items split across ranks: %s (busiest rank's price: holders %.3g, once %.3g moving %d rows; "
               "vision_encoding=%s; the prices' constants are stated, not calibrated)")
        if not log_once(logger, logging.INFO, ("vision encoding", choice, encoding), msg, choice, holders, once,
                        moved, encoding):
            logger.debug(msg, choice, holders, once, moved, encoding)
    out = {}
    for k, h in enumerate(mods):
        mine = h.held[rank]
        if mine.size == 0:
            continue
        item = h.item_of(mine)
        start = np.concatenate([[0], np.cumsum(h.tokens)[:-1]])
        enc = encodes[k][rank] if use_once else np.isin(np.arange(h.tokens.size), item)
        items = np.flatnonzero(enc)
        new_start = np.zeros(h.tokens.size, dtype=np.int64)
        new_start[items] = np.concatenate([[0], np.cumsum(h.tokens[items])[:-1]])
        rows = np.where(enc[item], new_start[item] + mine - start[item], -1).astype(np.int64)
        if not use_once:
            out[h.name] = Route(items, rows, None)
            continue
        recv_splits, send_parts, send_splits = [], [], []
        recv = np.flatnonzero(rows < 0)  # local placeholders received: by owner, then global row
        recv = recv[np.lexsort((mine[recv], owners[k][item[recv]]))]
        rows[recv] = int(h.tokens[items].sum()) + np.arange(recv.size)
        offset = 0
        for p in range(size):
            n = int((owners[k][item[recv]] == p).sum())
            if n:
                recv_splits.append((p, offset, n))
                offset += n
            if p == rank:
                continue
            theirs = h.held[p]
            it = h.item_of(theirs)
            want = (owners[k][it] == rank) & ~encodes[k][p][it]
            if want.any():
                g = np.sort(theirs[want])
                gi = h.item_of(g)
                send_splits.append((p, sum(len(s) for s in send_parts), g.size))
                send_parts.append(new_start[gi] + g - start[gi])
        exchange = None
        if recv_splits or send_splits:
            if executor is None:
                raise ValueError("route_items: rows move between ranks but no executor was given")
            index = torch.from_numpy(np.concatenate(send_parts) if send_parts else np.zeros(0, dtype=np.int64))
            exchange = RowExchange(index, tuple(send_splits), tuple(recv_splits), int(recv.size), executor,
                                   _TAG + 2 * k)
        out[h.name] = Route(items, rows, exchange)
    return out


class _SendRows(torch.autograd.Function):
    """``x [n, D] -> cat(x, rows received) [n + n_recv, D]``; backward returns the received rows' gradients to their
    owners and adds the sent rows' gradients, received from their holders."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ex: RowExchange) -> torch.Tensor:
        ctx.ex, ctx.n = ex, x.shape[0]
        send = x.index_select(0, ex.send_index.to(x.device))
        recv = ex.executor.transfer(send, ex.send_splits, ex.recv_rows, ex.recv_splits, tag=ex.tag).wait()
        return torch.cat([x, recv])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ex, n = ctx.ex, ctx.n
        back = ex.executor.transfer(grad[n:].contiguous(), ex.recv_splits, int(ex.send_index.numel()),
                                    ex.send_splits, tag=ex.tag + 1).wait()
        return grad[:n].index_add(0, ex.send_index.to(grad.device), back), None


def _leaves(value: Any) -> list[torch.Tensor]:
    """The ``[N, D]`` feature rows of an encoder output field (the containers :func:`.select._select` takes)."""
    if torch.is_tensor(value):
        return [value.reshape(-1, value.shape[-1])]
    if isinstance(value, (list, tuple)) and value and all(torch.is_tensor(v) for v in value):
        return [torch.cat([v.reshape(-1, v.shape[-1]) for v in value])]
    if isinstance(value, (list, tuple)):  # per layer (deepstack)
        return [leaf for v in value for leaf in _leaves(v)]
    return []


def _rebuild(value: Any, leaves: list[torch.Tensor]) -> Any:
    """``value``'s container around the next of ``leaves`` (consumed), in the shape :func:`.select._select` cuts."""
    if torch.is_tensor(value):
        flat = leaves.pop(0)
        return flat.unsqueeze(0) if value.dim() == 3 else flat
    if isinstance(value, (list, tuple)) and value and all(torch.is_tensor(v) for v in value):
        return type(value)([leaves.pop(0)])
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuild(v, leaves) for v in value)
    return value


def exchange_rows(output: Any, ex: RowExchange, fields: Sequence[str]) -> Any:
    """Append the rows this rank receives to an encoder output's ``fields`` (and send the rows others need).

    The fields' rows travel together, one exchange (one per dtype where they differ).

    Args:
        output: the encoder's output (this rank's encoded items, in item order). ex: this rank's exchange.
        fields: the fields holding per-placeholder rows (``pooler_output``, ``deepstack_features``).

    Returns:
        ``output`` with each field's rows ``cat(own, received)`` (the same object).

    Shapes:
        each field ``[N_own, D] -> [N_own + ex.recv_rows, D]`` (a per-item field: one item of those rows).
    """
    present = [(f, getattr(output, f)) for f in fields if getattr(output, f, None) is not None]
    leaves = [leaf for _, v in present for leaf in _leaves(v)]
    out: list[torch.Tensor | None] = [None] * len(leaves)
    for dtype in dict.fromkeys(leaf.dtype for leaf in leaves):
        idx = [i for i, leaf in enumerate(leaves) if leaf.dtype == dtype]
        widths = [leaves[i].shape[-1] for i in idx]
        moved = _SendRows.apply(torch.cat([leaves[i] for i in idx], dim=-1), ex)
        for i, part in zip(idx, moved.split(widths, dim=-1)):
            out[i] = part
    rest = list(out)
    for f, v in present:
        setattr(output, f, _rebuild(v, rest))
    return output
