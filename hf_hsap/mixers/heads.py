"""The heads all-to-all mode of a recurrent kernel under SP ("Ulysses for recurrent layers").

Every rank of the SP group holds some tokens of one packed row, all heads. Per kernel call, :func:`run_heads`:

1. all-to-alls every token tensor from sequence shards to head shards (:func:`hf_hsap.comm.all_to_all.all_to_all`,
   uneven token counts; the tensors of one dtype in one all-to-all, and the backward as many, in the same order on
   every rank since every rank builds the same graph). A tensor every rank needs whole goes the same way with its features
   repeated once per rank, so its backward sums every rank's gradient: an all-gather whose backward is a
   reduce-scatter;
2. puts the group's tokens in the row's order (:attr:`HeadsRoute.order`) and slices the per-head parameters;
3. runs the kernel's document-cut op (:data:`.ops.OPS`) on the whole row for this rank's heads: every document from
   the zero state, in one process (``document_chain``), so no state crosses ranks;
4. puts the output back in rank-major order and all-to-alls it back to the local tokens, all heads.

Exact by construction (the same per-document kernels), at the price of the row's tokens once per rank per call.
:data:`.heads_specs.HEADS_SPECS` says how each kernel's arguments are sharded; :func:`heads_fit` whether the heads
divide the group; :func:`heads_bytes` what a call sends.

Written by hand: the all-to-all itself is hf_hsap's (PyTorch's ``all_to_all_single``); no library shards
Transformers' recurrent kernels by heads over packed rows whose documents lie on arbitrary ranks (Megatron's
Mamba context parallelism shards its own layer's tensors over contiguous shards, fla's context parallelism hands
states over instead).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from ..comm.all_to_all import all_to_all
from ..plan.chain import document_chain
from .heads_specs import HEADS_SPECS, KernelSpec, Shard
from .calls import LAYOUT_KWARGS, MODEL_KWARGS

__all__ = ["HeadsBytes", "HeadsRoute", "heads_bytes", "heads_fit", "heads_route", "run_heads"]


@dataclass(frozen=True, eq=False)
class HeadsRoute:
    """Where the group's tokens are, for the all-to-alls of :func:`run_heads`.

    Attributes:
        group: the SP process group (``None``: the default group).
        rank: this rank's index in the group. size: ``U``, the group's ranks.
        token_counts: ``[U]`` every rank's local token count.
        order: ``[T_group]`` int64: ``rank_major[order]`` is the row in global order, where ``rank_major`` is the
            concatenation of every rank's local tokens in rank order.
        source: ``[T_group]`` int64: the global position of every rank-major token (``order``'s inverse).
        cu_seqlens: ``[n_docs + 1]`` the row's document boundaries (global positions).
        stats: the group's counters (``a2a_bytes_sent``), or ``None``.
    """

    group: Any
    rank: int
    size: int
    token_counts: tuple[int, ...]
    order: torch.Tensor
    source: torch.Tensor
    cu_seqlens: np.ndarray
    stats: Any = None

    @classmethod
    def of(cls, rank_tokens: Sequence[torch.Tensor | np.ndarray], cu_seqlens: Sequence[int] | np.ndarray, *,
           group: Any, rank: int, stats: Any = None) -> "HeadsRoute":
        """The route of a group whose rank ``r`` holds the global positions ``rank_tokens[r]`` (in local order) of
        the row ``cu_seqlens``; raises ``ValueError`` unless they cover the row once."""
        source = torch.cat([torch.as_tensor(np.asarray(t), dtype=torch.int64) for t in rank_tokens])
        cu = np.asarray(cu_seqlens, dtype=np.int64)
        total = int(cu[-1])
        if source.numel() != total or not torch.equal(torch.sort(source).values, torch.arange(total)):
            raise ValueError(f"hf_hsap heads mode: the ranks' tokens ({source.numel()}) must cover the row's "
                             f"{total} tokens once each")
        return cls(group, int(rank), len(rank_tokens), tuple(int(len(t)) for t in rank_tokens),
                   torch.argsort(source), source, cu, stats)


def heads_route(plan: Any, sp_group: Any) -> HeadsRoute:
    """The :class:`HeadsRoute` of a plan's row over its SP group (``plan.local_token_indices(r)``, the layout's
    ``cu_seqlens``; ``sp_group``'s process group, rank and ``comm_stats``). An offline plan (no rank) is read at
    ``sp_group.rank``."""
    if plan.size != sp_group.size or plan.rank not in (None, sp_group.rank):
        raise ValueError(f"hf_hsap heads mode: the plan (rank {plan.rank} of {plan.size}) is not this SP group's "
                         f"(rank {sp_group.rank} of {sp_group.size})")
    tokens = [plan.local_token_indices(r) for r in range(plan.size)]
    return HeadsRoute.of(tokens, plan.layout.cu_seqlens, group=sp_group.group, rank=sp_group.rank,
                         stats=sp_group.comm_stats)


class HeadsBytes(NamedTuple):
    """Bytes one rank sends per kernel call (what ``CommStats.a2a_bytes_sent`` grows by).

    Attributes:
        forward: the forward's all-to-alls.
        backward: the backward's, when the output's gradient flows back and the token tensors that require a
            gradient get theirs.
    """

    forward: int
    backward: int


@dataclass
class _Call:
    """A kernel call bound to its spec's names: where each named value is (a positional index or a keyword)."""

    spec: KernelSpec
    args: list[Any]
    kwargs: dict[str, Any]
    where: dict[str, int | str]

    def get(self, name: str) -> Any:
        at = self.where.get(name)
        return None if at is None else (self.args[at] if isinstance(at, int) else self.kwargs[at])

    def set(self, name: str, value: Any) -> None:
        at = self.where[name]
        if isinstance(at, int):
            self.args[at] = value
        else:
            self.kwargs[at] = value


def _bind(kernel: str, args: tuple, kwargs: dict[str, Any]) -> _Call:
    """The call of ``kernel`` with its layout keywords (whole documents need none) and the model's own inputs dropped
    (:data:`.calls.MODEL_KWARGS`); raises ``ValueError``
    for an unknown kernel, a refused keyword, a tensor the spec does not place or a batch of several rows."""
    if kernel not in HEADS_SPECS:
        raise ValueError(f"hf_hsap heads mode: no shard spec for kernel {kernel!r}; known: {sorted(HEADS_SPECS)}")
    spec = HEADS_SPECS[kernel]
    kw = {k: v for k, v in kwargs.items()
          if k not in LAYOUT_KWARGS and k not in MODEL_KWARGS and not k.startswith("hsap_")}
    where: dict[str, int | str] = dict(zip(spec.names, range(len(args))))
    where.update({k: k for k in kw})
    call = _Call(spec, list(args), kw, where)
    for name in spec.refused:
        value = call.get(name)
        if value is not None and (torch.is_tensor(value) or bool(value)):
            raise ValueError(f"hf_hsap heads mode: {kernel} got {name}; a cached state in or a final state out "
                             "continues one document, not a packed row under SP: train with use_cache=False")
    for name in where:
        value = call.get(name)
        if torch.is_tensor(value) and name not in spec.shards:
            raise ValueError(f"hf_hsap heads mode: {kernel} got a tensor {name!r} that its shard spec does not place")
        shard = spec.shards.get(name)
        if torch.is_tensor(value) and shard is not None and shard.kind != "param" and value.shape[0] != 1:
            raise ValueError(f"hf_hsap heads mode: {kernel}'s {name} has {value.shape[0]} rows; under SP a batch is "
                             "one packed row (B == 1)")
    return call


@dataclass(frozen=True)
class _Move:
    """One token tensor's trip from the sequence shards to the head shards.

    Attributes:
        name: the argument. tensor: its local value ``[1, ...]``. shard: its spec.
        split: whether it is split along ``shard.split`` (else it travels whole: ``whole``, or ``groups`` that do
            not divide the group).
    """

    name: str
    tensor: torch.Tensor
    shard: Shard
    split: bool

    @property
    def dims(self) -> list[int]:
        """The dimensions (of the row, batch dimension dropped) moved to the front: tokens, then the split one."""
        return [self.shard.tokens - 1] + ([self.shard.split - 1] if self.split else [])

    def rows(self) -> torch.Tensor:
        """``[T_l, (S,) ...]``: the tokens first, the split dimension next."""
        return self.tensor.squeeze(0).movedim(self.dims, list(range(len(self.dims))))

    def width(self, size: int) -> int:
        """Elements per token each rank gets: ``F / U`` split, ``F`` whole."""
        t = self.tensor
        return t.numel() // max(t.shape[self.shard.tokens], 1) // (size if self.split else 1)


def _moves(call: _Call, size: int) -> list[_Move]:
    """The token tensors of ``call`` (its parameters left out), in the spec's order."""
    out = []
    for name, shard in call.spec.shards.items():
        t = call.get(name)
        if t is None or shard.kind == "param":
            continue
        split = shard.kind == "heads" or (shard.kind == "groups" and t.shape[shard.split] % size == 0)
        out.append(_Move(name, t, shard, split))
    return out


def _by_dtype(moves: list[_Move]) -> list[list[_Move]]:
    """The moves that share one all-to-all: one per dtype, in the order of first use (the same on every rank)."""
    return [[m for m in moves if m.tensor.dtype == d] for d in dict.fromkeys(m.tensor.dtype for m in moves)]


def _misfit(call: _Call, size: int) -> str | None:
    """Why the heads (channels) of ``call`` do not divide a group of ``size`` ranks (``None``: they do)."""
    for name, shard in call.spec.shards.items():
        t = call.get(name)
        if t is None or shard.kind in ("whole", "groups"):
            continue
        if t.shape[shard.split] % size:
            return f"{name} has {t.shape[shard.split]} heads / channels along dim {shard.split}"
    return None


def heads_fit(kernel: str, args: tuple, kwargs: dict[str, Any], size: int) -> bool:
    """Whether a call of ``kernel`` can run in the heads mode over ``size`` ranks: every split dimension of its
    token tensors and parameters divides ``size`` (Mamba2's groups need not: they are then replicated)."""
    return _misfit(_bind(kernel, args, kwargs), size) is None


def heads_bytes(kernel: str, args: tuple, kwargs: dict[str, Any], token_counts: Sequence[int], rank: int, *,
                out_dtype: torch.dtype | None = None) -> HeadsBytes:
    """Bytes this rank sends per call of :func:`run_heads` (``args`` / ``kwargs``: its local call).

    With ``U`` ranks, ``T_l = token_counts[rank]``, ``T_g = sum(token_counts)`` and ``W`` the bytes per token that
    each rank gets of the token tensors of one dtype (``F e / U`` per split tensor of ``F`` elements a token of
    ``e`` bytes, ``F e`` per tensor that travels whole), the forward sends ``T_l (U - 1) W`` per dtype and
    ``(T_g - T_l) F_out e_out / U`` of the output; the backward sends ``T_l (U - 1) F_out e_out / U`` of the
    output's gradient and ``(T_g - T_l) W`` per dtype whose tensors include one that requires a gradient.

    Args:
        out_dtype: the kernel's output dtype (default: that of the argument the output is shaped like; Transformers'
            torch Mamba2 scan returns float32 for a lower-precision input).
    """
    call = _bind(kernel, args, kwargs)
    size, t_l = len(token_counts), int(token_counts[rank])
    t_g = int(sum(token_counts))
    forward = backward = 0
    for group in _by_dtype(_moves(call, size)):
        width = sum(m.width(size) for m in group) * group[0].tensor.element_size()
        forward += t_l * (size - 1) * width
        backward += (t_g - t_l) * width if any(m.tensor.requires_grad for m in group) else 0
    like = call.get(call.spec.out_like)
    out = _Move(call.spec.out_like, like, call.spec.out, True).width(size)
    out *= torch.empty((), dtype=out_dtype or like.dtype).element_size()
    return HeadsBytes(forward + (t_g - t_l) * out, backward + t_l * (size - 1) * out)


def _to_heads(moves: list[_Move], route: HeadsRoute) -> dict[str, torch.Tensor]:
    """The local token tensors as this rank's part of the whole row, in global order: one all-to-all per dtype.

    Shapes: ``[1, ..., T_l, ..., S, ...] -> [1, ..., T_g, ..., S / U, ...]`` (split along ``S``), else the same
    features, all of them. A tensor that travels whole is sent to every rank (its features repeated ``U`` times),
    so its backward sums every rank's gradient."""
    size, mine = route.size, route.token_counts[route.rank]
    out = {}
    for group in _by_dtype(moves):
        blocks, shapes = [], []
        for m in group:
            x = m.rows()  # [T_l, (S,) ...]
            shape = list(x.shape[1:])
            if m.split:
                shape[0] //= size
                blocks.append(x.reshape(mine, size, m.width(size)))  # rank u's heads: the u-th block
            else:
                blocks.append(x.reshape(mine, 1, m.width(size)).expand(mine, size, m.width(size)))
            shapes.append(shape)
        send = torch.cat(blocks, dim=2).reshape(mine, -1)  # [T_l, U * W]
        got = all_to_all(send, "seq_to_head", route.group, route.token_counts, route.rank, route.stats)  # [T_g, W]
        got = got.index_select(0, route.order.to(got.device))  # rank-major -> global order
        for m, shape, piece in zip(group, shapes, got.split([m.width(size) for m in group], dim=1)):
            out[m.name] = piece.reshape(-1, *shape).movedim(list(range(len(m.dims))), m.dims).unsqueeze(0)
    return out


def _from_heads(y: torch.Tensor, shard: Shard, route: HeadsRoute) -> torch.Tensor:
    """The inverse of :func:`_to_heads` for the output.

    Shapes: ``[1, ..., T_g, ..., H / U, ...] -> [1, ..., T_l, ..., H, ...]``."""
    dims = [shard.tokens - 1, shard.split - 1]
    x = y.squeeze(0).movedim(dims, [0, 1])  # [T_g, H / U, ...] global order
    shape = list(x.shape[1:])
    flat = x.index_select(0, route.source.to(x.device)).reshape(x.shape[0], -1)  # rank-major
    back = all_to_all(flat, "head_to_seq", route.group, route.token_counts, route.rank, route.stats)  # [T_l, U * F]
    shape[0] *= route.size
    return back.reshape(back.shape[0], *shape).movedim([0, 1], dims).unsqueeze(0)


def _group_of_heads(call: _Call, shard: Shard, groups: int, route: HeadsRoute) -> torch.Tensor:
    """``[H / U]`` the group of every head of this rank (heads ``h`` read group ``h // (H / G)``)."""
    like = call.get(shard.heads_of)
    heads = like.shape[call.spec.shards[shard.heads_of].split]
    local = heads // route.size
    return torch.arange(route.rank * local, (route.rank + 1) * local) // (heads // groups)


def run_heads(kernel: str, op: Callable[..., Any], orig: Callable[..., Any], args: tuple, kwargs: dict[str, Any], *,
              route: HeadsRoute) -> Any:
    """A kernel call over this rank's local tokens, computed in the heads mode (module docstring).

    Args:
        kernel: the kernel's name in :data:`~.heads_specs.HEADS_SPECS` (an :data:`.ops.OPS` name).
        op: the kernel's document-cut op (``OPS[kernel]``). orig: the original kernel (what ``op`` calls).
        args, kwargs: the call, with this rank's local tokens (one row: ``B == 1``).
        route: the group's tokens (:func:`heads_route`).

    Returns:
        What the original kernel returns, for the local tokens and every head.

    Raises:
        ValueError: the heads do not divide the group, several rows, a cached / final state asked for, a tensor the
            spec does not place, or local tensors whose token count is not the route's.
    """
    call = _bind(kernel, args, kwargs)
    why = _misfit(call, route.size)
    if why is not None:
        raise ValueError(f"hf_hsap heads mode: {kernel} over {route.size} ranks: {why}, not a multiple of {route.size}")
    mine = route.token_counts[route.rank]
    moves = _moves(call, route.size)
    for m in moves:
        if m.tensor.shape[m.shard.tokens] != mine:
            raise ValueError(f"hf_hsap heads mode: {kernel}'s {m.name} has {m.tensor.shape[m.shard.tokens]} tokens "
                             f"along dim {m.shard.tokens}, but this rank holds {mine}")
    moved = _to_heads(moves, route)
    for m in moves:
        if m.shard.kind == "groups" and not m.split:  # every group came: keep the group of each of this rank's heads
            index = _group_of_heads(call, m.shard, m.tensor.shape[m.shard.split], route).to(m.tensor.device)
            moved[m.name] = moved[m.name].index_select(m.shard.split, index)
    for name, shard in call.spec.shards.items():
        t = call.get(name)
        if t is not None and shard.kind == "param":
            n = t.shape[shard.split] // route.size
            moved[name] = t.narrow(shard.split, route.rank * n, n)
    for name, value in moved.items():
        call.set(name, value)
    result = op(orig, tuple(call.args), call.kwargs, document_chain(route.cu_seqlens), None)
    if isinstance(result, (tuple, list)):  # (output, final state: None, refused above)
        return type(result)([_from_heads(result[0], call.spec.out, route), *result[1:]])
    return _from_heads(result, call.spec.out, route)
