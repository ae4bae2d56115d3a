"""The heads all-to-all mode of a recurrent kernel under SP ("Ulysses for recurrent layers").

Every rank of the SP group holds some tokens of one packed row, all heads. Per kernel call, :func:`run_heads`:

1. all-to-alls every token tensor from sequence shards to head shards (:func:`hf_hsap.comm.all_to_all.all_to_all`,
   uneven token counts; a tensor every rank needs whole goes the same way with its features repeated once per rank,
   so its backward sums every rank's gradient: an all-gather whose backward is a reduce-scatter);
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
from .ops import LAYOUT_KWARGS

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
    """The call of ``kernel`` with its layout keywords dropped (whole documents need none); raises ``ValueError``
    for an unknown kernel, a refused keyword, a tensor the spec does not place or a batch of several rows."""
    if kernel not in HEADS_SPECS:
        raise ValueError(f"hf_hsap heads mode: no shard spec for kernel {kernel!r}; known: {sorted(HEADS_SPECS)}")
    spec = HEADS_SPECS[kernel]
    kw = {k: v for k, v in kwargs.items() if k not in LAYOUT_KWARGS and not k.startswith("hsap_")}
    where: dict[str, int | str] = {n: i for n, i in zip(spec.names, range(len(args)))}
    where.update({k: k for k in kw})
    call = _Call(spec, list(args), kw, where)
    for name in spec.refused:
        if call.get(name) not in (None, False):
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


def _splits(call: _Call, name: str, shard: Shard, size: int) -> bool:
    """Whether the tensor ``name`` is split along ``shard.split`` (else it travels whole: ``whole``, or ``groups``
    that do not divide the group)."""
    if shard.kind == "whole":
        return False
    if shard.kind == "groups":
        return call.get(name).shape[shard.split] % size == 0
    return True


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


def _features(t: torch.Tensor, shard: Shard) -> int:
    """Elements per token of a one-row token tensor."""
    return t.numel() // max(t.shape[shard.tokens], 1)


def heads_bytes(kernel: str, args: tuple, kwargs: dict[str, Any], token_counts: Sequence[int], rank: int, *,
                out_dtype: torch.dtype | None = None) -> HeadsBytes:
    """Bytes this rank sends per call of :func:`run_heads` (``args`` / ``kwargs``: its local call).

    With ``U`` ranks, ``T_l = token_counts[rank]``, ``T_g = sum(token_counts)``, ``F`` a token tensor's elements per
    token and ``e`` its element size, the forward sends ``T_l (U - 1) F / U e`` per split tensor,
    ``T_l (U - 1) F e`` per tensor that travels whole and ``(T_g - T_l) F_out / U e_out`` of the output; the
    backward sends ``T_l (U - 1) F_out / U e_out`` of the output's gradient and, for each token tensor that
    requires a gradient, ``(T_g - T_l) F / U e`` (split) or ``(T_g - T_l) F e`` (whole).

    Args:
        out_dtype: the kernel's output dtype (default: that of the argument the output is shaped like; Transformers'
            torch Mamba2 scan returns float32 for a lower-precision input).
    """
    call = _bind(kernel, args, kwargs)
    size, t_l = len(token_counts), int(token_counts[rank])
    t_g = int(sum(token_counts))
    forward = backward = 0
    for name, shard in call.spec.shards.items():
        t = call.get(name)
        if t is None or shard.kind == "param":
            continue
        per = _features(t, shard) * t.element_size() // (size if _splits(call, name, shard, size) else 1)
        forward += t_l * (size - 1) * per
        backward += (t_g - t_l) * per if t.requires_grad else 0
    like = call.get(call.spec.out_like)
    e_out = torch.empty((), dtype=out_dtype or like.dtype).element_size()
    out_per = _features(like, call.spec.shards[call.spec.out_like]) // size * e_out
    return HeadsBytes(forward + (t_g - t_l) * out_per, backward + t_l * (size - 1) * out_per)


def _to_heads(t: torch.Tensor, shard: Shard, split: bool, route: HeadsRoute) -> torch.Tensor:
    """A local token tensor as this rank's part of the whole row, in global order.

    Shapes: ``[1, ..., T_l, ..., S, ...] -> [1, ..., T_g, ..., S / U, ...]`` (``split``: ``S`` at ``shard.split``),
    else the same features, all of them."""
    dims = [shard.tokens - 1] + ([shard.split - 1] if split else [])
    x = t.squeeze(0).movedim(dims, list(range(len(dims))))  # [T_l, (S,) ...]
    shape = list(x.shape[1:])
    flat = x.reshape(x.shape[0], -1)  # [T_l, F]: rank u's block of heads is the u-th of U column blocks
    if split:
        shape[0] //= route.size
    else:
        flat = flat.repeat(1, route.size)  # [T_l, U * F]: every rank gets every feature
    y = all_to_all(flat, "seq_to_head", route.group, route.token_counts, route.rank, route.stats)  # rank-major
    y = y.index_select(0, route.order.to(y.device)).reshape(-1, *shape)  # [T_g, ...] global order
    return y.movedim(list(range(len(dims))), dims).unsqueeze(0)


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
    moved = {}
    for name, shard in call.spec.shards.items():
        t = call.get(name)
        if t is None:
            continue
        if shard.kind == "param":
            n = t.shape[shard.split] // route.size
            moved[name] = t.narrow(shard.split, route.rank * n, n)
            continue
        if t.shape[shard.tokens] != mine:
            raise ValueError(f"hf_hsap heads mode: {kernel}'s {name} has {t.shape[shard.tokens]} tokens along dim "
                             f"{shard.tokens}, but this rank holds {mine}")
        split = _splits(call, name, shard, route.size)
        moved[name] = _to_heads(t, shard, split, route)
        if shard.kind == "groups" and not split:  # every group came: keep the group of each of this rank's heads
            index = _group_of_heads(call, shard, t.shape[shard.split], route).to(t.device)
            moved[name] = moved[name].index_select(shard.split, index)
    for name, value in moved.items():
        call.set(name, value)
    result = op(orig, tuple(call.args), call.kwargs, document_chain(route.cu_seqlens), None)
    if isinstance(result, (tuple, list)):  # (output, final state: None, refused above)
        return type(result)([_from_heads(result[0], call.spec.out, route), *result[1:]])
    return _from_heads(result, call.spec.out, route)
