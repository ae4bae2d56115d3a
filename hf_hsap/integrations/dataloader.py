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

Resuming: skip with :meth:`SPDataLoader.skip_first_batches`, never with Accelerate's ``skip_first_batches``
function. That one rebuilds a plain ``DataLoader`` from the wrapped loader's ``dataset`` / ``batch_sampler``:
it would drop the SP wrapping (no gather, no sharding) and count skipped batches per rank instead of per SP
step. The wrapper therefore does not forward ``sampler`` / ``batch_sampler``, so that path fails loudly.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from typing import Any

import torch

from accelerate.utils import send_to_device

from ..log import get_logger
from .batch_gather import gather_batches
from .sharding import LAYOUT_KEYS, shard_batch

__all__ = ["SPDataLoader"]

logger = get_logger(__name__)

# Attributes of the inner loader that must not be reached through the wrapper (see the module docstring).
_NOT_FORWARDED = ("sampler", "batch_sampler")


class SPDataLoader:
    """Wrap a per-rank data loader so that each SP group trains on shared global batches.

    Args:
        dataloader: this rank's loader (iterable of packed-batch dicts, see :func:`~.sharding.shard_batch`).
        sp: the :class:`~hf_hsap.SPGroup`.
        placement: overrides the config's placement.
        config: the :class:`~hf_hsap.HSAPConfig` to plan with (default the group's ``sp.config``).
        keep_num_items: keep ``num_items_in_batch`` (the SP group's count) in the yielded batches; the HSAP
            trainers drop it because Transformers' Trainer computes the count over all ranks itself.
        verify: compare batch digests across the group at every step (the gather makes them equal already).
        skip_batches: SP batches (yielded batches, not per-rank ones) to leave out at the start of an
            iteration; set it with :meth:`skip_first_batches`.
        skip_first_pass_only: apply ``skip_batches`` to the first iteration only (a resumed epoch), and report
            the length of a full pass.
        check_previous: passed to :func:`~.sharding.shard_batch`: each batch checks that the forward of the
            one before it consumed its plan in every attention layer. A caller that runs ahead of the forward
            (e.g. Trainer's gradient accumulation) passes ``False`` and calls
            :func:`~.plan_use.check_plan_used` after each forward instead.

    Yields:
        local (dict[str, Any]): local batches from :func:`~.sharding.shard_batch`, on the device this rank's
            batches came on.

    Every rank of the SP group must iterate the loader in step (it runs one collective per ``P`` batches), and
    the inner loaders should have equal lengths (Accelerate's default ``even_batches=True``): ``len()`` is
    ``len(inner) * P`` on each rank, and with uneven inner loaders an epoch ends when the first rank's loader
    does (after the other ranks' batches of that round).
    """

    def __init__(self, dataloader: Any, sp: Any, placement: str | None = None, *, keep_num_items: bool = True,
                 verify: bool = False, skip_batches: int = 0, skip_first_pass_only: bool = False,
                 check_previous: bool = True, config: Any = None) -> None:
        from ..config import HSAPConfig

        if skip_batches < 0:
            raise ValueError(f"skip_batches must be >= 0, got {skip_batches}")
        self.dataloader = dataloader
        self.sp = sp
        base = config or getattr(sp, "config", None) or HSAPConfig()
        self.config = base.replace(placement=placement) if placement is not None else base
        self.check_previous = check_previous
        self.keep_num_items = keep_num_items
        self.verify = verify
        self.skip_batches = int(skip_batches)
        self.skip_first_pass_only = skip_first_pass_only

    def __len__(self) -> int:
        full = len(self.dataloader) * int(self.sp.size)
        return full if self.skip_first_pass_only else max(0, full - self.skip_batches)

    def skip_first_batches(self, num_batches: int, first_pass_only: bool = False) -> SPDataLoader:
        """A loader over the same data that leaves out its first ``num_batches`` SP batches (for resuming).

        Whole rounds of ``P`` batches are skipped in the inner loader without loading them (Accelerate's
        ``skip_first_batches`` on its ``DataLoaderShard``, whose batch sampler then skips this rank's batches);
        the remaining ``num_batches % P`` are gathered and dropped without being sharded.

        Args:
            num_batches: batches of *this* loader (``SP steps x micro-batches``), e.g. Trainer's
                ``steps_trained_in_current_epoch``.
            first_pass_only: skip on the first iteration only and keep the full length, for a loader that is
                iterated again in later epochs.

        Returns:
            A new :class:`SPDataLoader` (this one is unchanged).
        """
        size = int(self.sp.size)
        total = self.skip_batches + int(num_batches)
        logger.info("SPDataLoader: skipping the first %d SP batches%s: %d whole rounds of %d in the inner loader, "
                    "then %d gathered and dropped", total, " of the first pass" if first_pass_only else "",
                    total // size, size, total % size)
        return SPDataLoader(self.dataloader, self.sp, config=self.config, keep_num_items=self.keep_num_items,
                            verify=self.verify, skip_batches=self.skip_batches + int(num_batches),
                            skip_first_pass_only=first_pass_only,
                            check_previous=self.check_previous)

    def set_epoch(self, epoch: int) -> None:
        """Forward to the inner loader and to a batch sampler that Accelerate wrapped (it does not forward)."""
        if hasattr(self.dataloader, "set_epoch"):
            self.dataloader.set_epoch(epoch)
        wrapped = getattr(getattr(self.dataloader, "batch_sampler", None), "batch_sampler", None)
        if hasattr(wrapped, "set_epoch"):
            wrapped.set_epoch(epoch)

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("dataloader")
        if inner is None:
            raise AttributeError(name)
        if name in _NOT_FORWARDED:
            raise AttributeError(
                f"SPDataLoader does not expose the inner loader's {name}: a loader rebuilt from it (e.g. by "
                "accelerate.skip_first_batches) would yield this rank's unsharded batches; to skip batches when "
                "resuming use SPDataLoader.skip_first_batches(n)"
            )
        return getattr(inner, name)  # dataset, batch_size, collate_fn, ... of the inner loader

    def _local(self, batch: Mapping[str, Any], device: torch.device | None) -> dict[str, Any]:
        local = shard_batch(batch, self.sp, verify=self.verify, config=self.config,
                            check_previous=self.check_previous)
        if not self.keep_num_items:
            local.pop("num_items_in_batch", None)
        return send_to_device(local, device) if device is not None else local

    def __iter__(self) -> Iterator[dict[str, Any]]:
        size = int(self.sp.size)
        rounds, drop = divmod(self.skip_batches, size)  # whole inner rounds, then batches of the next round
        if self.skip_first_pass_only:
            self.skip_batches = 0
        iterator = iter(_skip_inner(self.dataloader, rounds))
        while True:
            mine = next(iterator, None)
            if size == 1:
                if mine is None:
                    return
                yield self._local(mine, None)
                continue
            device = mine["input_ids"].device if mine is not None else None
            if mine is not None:  # derived layout values (max_length_q, ...) are rebuilt by the plan
                mine = {k: v for k, v in mine.items() if torch.is_tensor(v) or k not in LAYOUT_KEYS}
            everyone = gather_batches(mine, self.sp.group, size)  # tensors, not pickles
            for batch in everyone[drop:]:  # SP rank order: the order one process would have read them in
                if batch is not None:
                    yield self._local(batch, device)
            drop = 0
            if any(batch is None for batch in everyone):
                if any(batch is not None for batch in everyone):
                    logger.warning("SPDataLoader: the inner loaders of the SP group have different lengths (SP "
                                   "ranks %s ran out first); the epoch ends here and the longer loaders' remaining "
                                   "batches are not trained on; use equal lengths (Accelerate's even_batches=True)",
                                   [r for r, batch in enumerate(everyone) if batch is None])
                return


class _SkippedIterable:
    """An iterable without its first ``n`` items (for inner loaders that Accelerate cannot skip)."""

    def __init__(self, inner: Iterable[Any], n: int) -> None:
        self.inner, self.n = inner, n

    def __iter__(self) -> Iterator[Any]:
        return islice(iter(self.inner), self.n, None)

    def __len__(self) -> int:
        return max(0, len(self.inner) - self.n)  # type: ignore[arg-type]


def _skip_inner(loader: Any, n: int) -> Any:
    """``loader`` without its first ``n`` batches of this rank; an Accelerate loader skips without loading them."""
    if n <= 0:
        return loader
    try:
        from accelerate.data_loader import DataLoaderDispatcher, DataLoaderShard
    except ImportError:  # pragma: no cover - accelerate is a dependency
        DataLoaderShard = DataLoaderDispatcher = ()  # type: ignore[assignment,misc]
    if isinstance(loader, (DataLoaderShard, DataLoaderDispatcher)):
        from accelerate import skip_first_batches

        return skip_first_batches(loader, n)
    logger.info("SPDataLoader: the inner loader is a %s, not an Accelerate loader: its first %d batches are loaded "
                "and dropped to skip them", type(loader).__name__, n)
    return _SkippedIterable(loader, n)
