"""Data loading under SP: every rank of an SP group trains on the same global batch.

An ordinary distributed loader (Accelerate's ``DataLoaderShard``, a ``DistributedSampler``) hands every
rank its own batches. :class:`SPDataLoader` keeps that, so samplers, shuffling and epoch bookkeeping stay
untouched, and turns it into SP steps: at each step the ``P`` ranks of an SP group all-gather their
batches and then process all ``P`` of them one after the other, each sharded over the group::

    inner loader, rank r of P:   b[r], b[P + r], b[2P + r], ...         (len = n)
    SPDataLoader, every rank:    shard(b[0]), shard(b[1]), ..., shard(b[P - 1]), shard(b[P]), ...  (len = n * P)

So an epoch still visits every sample once, and the order equals that of one process reading the whole
dataset when the inner loader interleaves batches by rank (as Accelerate does). With ``P == 1`` it only
shards (plans) each batch.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from .sharding import shard_batch

__all__ = ["SPDataLoader"]


def _to_cpu(batch: Any) -> Any:
    """The batch with every tensor on the CPU (what travels through ``all_gather_object``)."""
    if torch.is_tensor(batch):
        return batch.detach().cpu()
    if isinstance(batch, Mapping):
        return {k: _to_cpu(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_cpu(v) for v in batch)
    return batch


def _to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


class SPDataLoader:
    """Wrap a per-rank data loader so that each SP group trains on shared global batches.

    Args:
        dataloader: this rank's loader (iterable of packed-batch dicts, see :func:`~.sharding.shard_batch`).
        sp: the :class:`~hf_hsap.SPGroup`.
        placement: passed to the planner.
        keep_num_items: keep ``num_items_in_batch`` (the SP group's count) in the yielded batches; the HSAP
            trainers drop it because Transformers' Trainer computes the count over all ranks itself.
        verify: compare batch digests across the group at every step (the gather makes them equal already).

    Yields:
        local batches from :func:`~.sharding.shard_batch`, on the device this rank's batches came on.

    Every rank of the SP group must iterate the loader in step (it runs one collective per ``P`` batches).
    """

    def __init__(self, dataloader: Any, sp: Any, placement: str = "auto", keep_num_items: bool = True,
                 verify: bool = False) -> None:
        self.dataloader = dataloader
        self.sp = sp
        self.placement = placement
        self.keep_num_items = keep_num_items
        self.verify = verify

    def __len__(self) -> int:
        return len(self.dataloader) * int(self.sp.size)

    def set_epoch(self, epoch: int) -> None:
        """Forward to the inner loader (and its sampler), as Trainer / Accelerate expect."""
        if hasattr(self.dataloader, "set_epoch"):
            self.dataloader.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("dataloader")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)  # dataset, batch_size, sampler, ... of the inner loader

    def _local(self, batch: Mapping[str, Any], device: torch.device | None) -> dict[str, Any]:
        local = shard_batch(batch, self.sp, placement=self.placement, verify=self.verify)
        if not self.keep_num_items:
            local.pop("num_items_in_batch", None)
        return _to_device(local, device) if device is not None else local

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import torch.distributed as dist

        size = int(self.sp.size)
        iterator = iter(self.dataloader)
        while True:
            mine = next(iterator, None)
            if size == 1:
                if mine is None:
                    return
                yield self._local(mine, None)
                continue
            device = mine["input_ids"].device if mine is not None else None
            everyone: list[Any] = [None] * size
            dist.all_gather_object(everyone, _to_cpu(mine), group=self.sp.group)
            for batch in everyone:  # SP rank order: the order one process would have read them in
                if batch is not None:
                    yield self._local(batch, device)
            if any(batch is None for batch in everyone):
                return
