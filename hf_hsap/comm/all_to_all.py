"""All-to-all between sequence sharding and head sharding inside an intra (Ulysses) group.

Each of the ``U`` ranks of an intra group holds ``T_u`` consecutive tokens of the group's ``T_group``
tokens with all heads. The all-to-all gives every rank all ``T_group`` tokens for ``H / U`` heads
(rank ``u`` gets heads ``[u*H/U, (u+1)*H/U)``). Its backward is the inverse all-to-all.
Token counts may differ by rank (``all_to_all_single`` with split sizes).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Sequence

import torch
import torch.distributed as dist

from .p2p import raise_comm_error


def _all_to_all(recv: torch.Tensor, send: torch.Tensor, out_splits: list[int], in_splits: list[int],
                group: Any) -> None:
    """``all_to_all_single`` with transport errors re-raised as :class:`HSAPCommError`."""
    try:
        dist.all_to_all_single(recv, send, output_split_sizes=out_splits, input_split_sizes=in_splits, group=group)
    except RuntimeError as err:
        raise_comm_error(err, "intra-group all-to-all", dist.get_process_group_ranks(group), None)


def _count(stats: Any, rows_to_others: int, row_elems: int, x: torch.Tensor) -> None:
    if stats is not None:
        stats.a2a_bytes_sent += rows_to_others * row_elems * x.element_size()


def seq_to_head(x: torch.Tensor, group: Any, token_counts: Sequence[int], rank: int = 0,
                stats: Any = None) -> torch.Tensor:
    """``[T_u, U * F] -> [T_group, F]`` where ``F`` is this rank's feature shard (no autograd).
    ``stats.a2a_bytes_sent`` (if given) grows by the bytes sent to the other ranks."""
    U = len(token_counts)
    t_local = x.shape[0]
    _count(stats, t_local * (U - 1), x.shape[1] // U, x)
    send = x.reshape(t_local, U, -1).transpose(0, 1).contiguous()  # [T_u, U, F] -> [U, T_u, F]
    send = send.reshape(U * t_local, -1)  # [U * T_u, F]
    recv = torch.empty((sum(token_counts), send.shape[1]), dtype=x.dtype, device=x.device)  # [T_group, F]
    _all_to_all(recv, send, list(token_counts), [t_local] * U, group)
    return recv


def head_to_seq(x: torch.Tensor, group: Any, token_counts: Sequence[int], rank: int,
                stats: Any = None) -> torch.Tensor:
    """``[T_group, F] -> [T_u, U * F]``: the inverse of :func:`seq_to_head` (no autograd)."""
    U = len(token_counts)
    t_local = token_counts[rank]
    _count(stats, sum(token_counts) - t_local, x.shape[1], x)
    recv = torch.empty((U * t_local, x.shape[1]), dtype=x.dtype, device=x.device)  # [U * T_u, F]
    _all_to_all(recv, x.contiguous(), [t_local] * U, list(token_counts), group)
    return recv.reshape(U, t_local, -1).transpose(0, 1).reshape(t_local, -1)  # [U, T_u, F] -> [T_u, U*F]


_OPS = MappingProxyType({"seq_to_head": seq_to_head, "head_to_seq": head_to_seq})
_REVERSE = MappingProxyType({"seq_to_head": "head_to_seq", "head_to_seq": "seq_to_head"})


@dataclass(frozen=True)
class _Route:
    """Whom an :class:`AllToAll` exchanges rows with (one object: autograd takes no keywords).

    Attributes:
        group: the intra process group. token_counts: the ``U`` ranks' token counts. rank: this rank's index in
        the group. stats: counters to update (``a2a_bytes_sent``), or None.
    """

    group: Any
    token_counts: tuple[int, ...]
    rank: int
    stats: Any = None


class AllToAll(torch.autograd.Function):
    """Differentiable :func:`seq_to_head` / :func:`head_to_seq` (``direction``) over a :class:`_Route`; the backward
    is the same all-to-all in the reverse direction. Shapes as the two functions."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, direction: str, route: _Route) -> torch.Tensor:
        """The all-to-all in ``direction`` (the arguments of :func:`all_to_all`)."""
        ctx.direction, ctx.route = direction, route
        return _OPS[direction](x, route.group, route.token_counts, route.rank, route.stats)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """The same all-to-all reversed: the gradient goes back to the ranks its rows came from."""
        r = ctx.route
        back = _OPS[_REVERSE[ctx.direction]](grad, r.group, r.token_counts, r.rank, r.stats)
        return back, None, None


def all_to_all(x: torch.Tensor, direction: str, group: Any, token_counts: Sequence[int], rank: int,
               stats: Any = None) -> torch.Tensor:
    """The differentiable intra-group all-to-all (:class:`AllToAll`).

    Args:
        x: ``[T_u, U * F]`` (``seq_to_head``) or ``[T_group, F]`` (``head_to_seq``).
        direction: ``"seq_to_head"`` or ``"head_to_seq"``.
        group: the intra process group. token_counts: the ``U`` ranks' token counts. rank: this rank's
            index in the group. stats: counters to update (``a2a_bytes_sent``), or None.

    Returns:
        ``[T_group, F]`` (``seq_to_head``) or ``[T_u, U * F]`` (``head_to_seq``).
    """
    if direction not in _OPS:
        raise ValueError(f"unknown all-to-all direction {direction!r}; use 'seq_to_head' or 'head_to_seq'")
    return AllToAll.apply(x, direction, _Route(group, tuple(token_counts), rank, stats))
