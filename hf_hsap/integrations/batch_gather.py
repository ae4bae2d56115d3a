"""All-gather of the SP group's per-rank batches as tensors (no pickling).

Each rank of an SP group holds a different batch (dict of tensors) of possibly different lengths; every rank
needs all of them. ``torch.distributed.all_gather_object`` would pickle every batch each step (and on NCCL
round-trip through host memory twice). Here the batches travel as bytes in two collectives: a fixed-size
int64 header (key digest, dtypes, shapes) and one uint8 buffer per rank, padded to the longest::

    header[r] = [present, key digest, n, has non-tensors, (dtype, ndim, d0, .., d5) x n]       int64 [HEADER]
    data[r]   = concat(t.view(uint8) for t in tensors of rank r), padded        uint8 [max bytes]

The few non-tensor values a collator may add (e.g. ``max_length_q``) take one small object gather, only on
steps where there are any.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["collective_device", "gather_batches"]

_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.float64,
           torch.float32, torch.float16, torch.bfloat16)
_MAX_KEYS, _MAX_DIMS = 32, 6  # 6 dims: Mllama's pixels [batch, images, tiles, channels, height, width]
_HEADER = 4 + _MAX_KEYS * (2 + _MAX_DIMS)


def collective_device(group: Any) -> torch.device:
    """Where a collective's tensors must live: this rank's GPU for an NCCL group, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")


def _digest(keys: list[str], dtypes: list[torch.dtype]) -> int:
    h = hashlib.blake2b(("|".join(f"{k}:{d}" for k, d in zip(keys, dtypes))).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little") >> 1


def _header(batch: Mapping[str, Any] | None) -> tuple[torch.Tensor, list[str], list[torch.Tensor]]:
    head = torch.zeros(_HEADER, dtype=torch.int64)
    if batch is None:
        return head, [], []
    keys = sorted(k for k, v in batch.items() if torch.is_tensor(v))
    tensors = [batch[k].detach() for k in keys]
    if len(keys) > _MAX_KEYS or any(t.dim() > _MAX_DIMS or t.dtype not in _DTYPES for t in tensors):
        raise ValueError(f"SPDataLoader gathers at most {_MAX_KEYS} tensors of at most {_MAX_DIMS} dims in "
                         f"{[str(d) for d in _DTYPES]}; got {[(k, tuple(t.shape), t.dtype) for k, t in zip(keys, tensors)]}")
    head[0], head[1], head[2] = 1, _digest(keys, [t.dtype for t in tensors]), len(keys)
    head[3] = int(any(not torch.is_tensor(v) for v in batch.values()))
    for i, t in enumerate(tensors):
        base = 4 + i * (2 + _MAX_DIMS)
        head[base], head[base + 1] = _DTYPES.index(t.dtype), t.dim()
        head[base + 2: base + 2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    return head, keys, tensors


def gather_batches(batch: Mapping[str, Any] | None, group: Any, size: int) -> list[dict[str, Any] | None]:
    """Every SP rank's batch, in SP rank order, on every rank (collective over ``group``).

    Args:
        batch: this rank's batch (tensors, plus optional non-tensor values), or None when its loader is
            exhausted.
        group: the SP process group.
        size: its number of ranks.

    Returns:
        ``size`` batches (None for exhausted ranks) whose tensors are on the device of the group's backend
        (CPU for gloo, this rank's GPU for NCCL).

    Raises:
        ValueError: ranks whose batches have different keys or dtypes.
    """
    device = collective_device(group)
    try:
        head, keys, tensors = _header(batch)
        problem = None
    except ValueError as err:  # say so in the header, so that every rank raises instead of waiting
        head, keys, tensors, problem = torch.zeros(_HEADER, dtype=torch.int64), [], [], err
        head[0] = -1
    heads = [torch.empty_like(head, device=device) for _ in range(size)]
    dist.all_gather(heads, head.to(device), group=group)
    heads = [h.cpu() for h in heads]
    bad = [r for r, h in enumerate(heads) if int(h[0]) < 0]
    if bad:
        raise problem or ValueError(f"SP ranks {bad} could not send their batch (see their error)")
    digests = {int(h[1]) for h in heads if int(h[0])}
    if len(digests) > 1:
        raise ValueError("the ranks of an SP group loaded batches with different keys or dtypes; every rank's data "
                         "loader must use the same collator")
    data = torch.cat([t.to(device).contiguous().reshape(-1).view(torch.uint8) for t in tensors]) if tensors else \
        torch.empty(0, dtype=torch.uint8, device=device)
    lengths = [_nbytes(h) for h in heads]
    longest = max(lengths)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: data.numel()] = data
    bufs = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(size)]
    dist.all_gather(bufs, padded, group=group)
    extras = _gather_extras(batch, heads, group, size)
    present = [bool(int(h[0])) for h in heads]
    if any(present) and not all(present):  # an exhausted rank learns the key names from the others
        names: list[Any] = [None] * size
        dist.all_gather_object(names, keys if batch is not None else None, group=group)
        keys = next(n for n in names if n is not None)
    out: list[dict[str, Any] | None] = []
    for r, (h, buf) in enumerate(zip(heads, bufs)):
        if not int(h[0]):
            out.append(None)
            continue
        out.append({**_unpack(h, buf, keys), **extras[r]})
    return out


def _shapes(head: torch.Tensor) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    specs = []
    for i in range(int(head[2])):
        base = 4 + i * (2 + _MAX_DIMS)
        ndim = int(head[base + 1])
        specs.append((_DTYPES[int(head[base])], tuple(int(d) for d in head[base + 2: base + 2 + ndim])))
    return specs


def _nbytes(head: torch.Tensor) -> int:
    return sum(torch.Size(shape).numel() * dtype.itemsize for dtype, shape in _shapes(head))


def _unpack(head: torch.Tensor, buf: torch.Tensor, keys: list[str]) -> dict[str, torch.Tensor]:
    out, offset = {}, 0
    for key, (dtype, shape) in zip(keys, _shapes(head)):
        n = torch.Size(shape).numel() * dtype.itemsize
        out[key] = buf[offset: offset + n].clone().view(dtype).reshape(shape)  # bytes -> [*shape]
        offset += n
    return out


def _gather_extras(batch: Mapping[str, Any] | None, heads: list[torch.Tensor], group: Any,
                   size: int) -> list[dict[str, Any]]:
    """Non-tensor values of the batches: one object gather, only on steps where some rank has any."""
    if not any(int(h[3]) for h in heads):
        return [{} for _ in range(size)]
    from accelerate.utils import send_to_device

    everyone: list[Any] = [None] * size
    mine = send_to_device({k: v for k, v in (batch or {}).items() if not torch.is_tensor(v)}, "cpu")
    dist.all_gather_object(everyone, mine, group=group)  # tensors inside them travel from the CPU
    return [e or {} for e in everyone]
