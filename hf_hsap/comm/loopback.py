"""An in-process transport: the parts of one plan run as threads of one process on one device.

:class:`LoopbackHub` hands every part an executor with the interface of
:class:`~hf_hsap.comm.p2p.P2PExecutor` (``transfer`` -> pending -> ``wait``), so the runtime's
``sap_forward`` / ``sap_backward`` run unchanged while the messages go through queues instead of a
process group (:func:`hf_hsap.loopback.run_plan_loopback` runs a whole plan that way). It exists to check the runtime and the kernels
of a whole plan where there is one device and no process group (one lent GPU, a notebook); it is not a
training transport: the parts share one device and run one after another on its stream.

Why by hand: ``torch.distributed`` needs one process per rank, and NCCL one GPU per rank.
"""
from __future__ import annotations

import math
import threading
from collections import defaultdict, deque
from typing import Any, Callable, Sequence

import torch

from .p2p import CommStats, HSAPCommError, Splits


class LoopbackHub:
    """Queues between ``n_parts`` in-process parts.

    Args:
        n_parts: number of parts (threads).
        timeout_s: a ``wait`` that gets no message for this long raises :class:`HSAPCommError`
            (a part that failed or runs a different schedule), so a broken check never hangs.
    """

    def __init__(self, n_parts: int, timeout_s: float = 60.0) -> None:
        self.n_parts = n_parts
        self.timeout_s = timeout_s
        self._boxes: dict[tuple[int, int, int], deque] = defaultdict(deque)  # (src, dst, tag) -> tensors
        self._cv = threading.Condition()

    def executor(self, part: int, stats: CommStats | None = None) -> "LoopbackExecutor":
        """The executor of ``part`` (its counters in ``stats``, a fresh :class:`CommStats` by default)."""
        return LoopbackExecutor(self, part, stats if stats is not None else CommStats())

    def run(self, fn: Callable[[int], Any]) -> list[Any]:
        """Run ``fn(part)`` for every part, one thread each; results in part order.

        Raises:
            The first exception of any part (the others then time out waiting on it, or finish).
        """
        results: list[Any] = [None] * self.n_parts
        errors: list[BaseException] = []

        def body(p: int) -> None:
            try:
                results[p] = fn(p)
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller below
                errors.append(err)

        threads = [threading.Thread(target=body, args=(p,), name=f"hsap-part-{p}") for p in range(self.n_parts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results

    def _post(self, src: int, dst: int, tag: int, x: torch.Tensor) -> None:
        with self._cv:
            self._boxes[(src, dst, tag)].append(x)
            self._cv.notify_all()

    def _take(self, src: int, dst: int, tag: int) -> torch.Tensor:
        key = (src, dst, tag)
        with self._cv:
            if not self._cv.wait_for(lambda: len(self._boxes[key]) > 0, timeout=self.timeout_s):
                raise HSAPCommError(f"loopback: part {dst} got no message from part {src} (tag {tag}) within "
                                    f"{self.timeout_s:g} s: that part failed or runs a different schedule")
            return self._boxes[key].popleft()


class _LoopbackPending:
    """Messages to collect; :meth:`wait` blocks until each has arrived and returns the receive buffer."""

    def __init__(self, hub: LoopbackHub, part: int, recv: torch.Tensor, recv_splits: Splits, tag: int) -> None:
        self._hub, self._part, self._recv, self._splits, self._tag = hub, part, recv, recv_splits, tag

    def wait(self) -> torch.Tensor:
        for peer, off, n in self._splits:
            if n:
                self._recv[off:off + n].copy_(self._hub._take(peer, self._part, self._tag))
        self._splits = ()
        return self._recv


class LoopbackExecutor:
    """:class:`~hf_hsap.comm.p2p.P2PExecutor`'s interface over a :class:`LoopbackHub` (peers = parts)."""

    def __init__(self, hub: LoopbackHub, part: int, stats: CommStats) -> None:
        self.hub, self.part, self.stats = hub, part, stats

    def transfer(self, send: torch.Tensor, send_splits: Splits, recv_rows: int, recv_splits: Splits,
                 tag: int = 0) -> _LoopbackPending:
        """As :meth:`hf_hsap.comm.p2p.P2PExecutor.transfer`: post ``send[off:off+n]`` to each peer (copied:
        the sender may reuse its buffer) and return the pending receive of ``recv_rows`` rows."""
        row_bytes = math.prod(send.shape[1:]) * send.element_size()
        for peer, off, n in send_splits:
            if n:
                self.hub._post(self.part, peer, tag, send[off:off + n].clone())
                self.stats.count_send(peer, n, row_bytes)
        recv = torch.empty((recv_rows, *send.shape[1:]), dtype=send.dtype, device=send.device)
        self.stats.count_recv(sum(n for _, _, n in recv_splits), row_bytes, recv_rows)
        return _LoopbackPending(self.hub, self.part, recv, recv_splits, tag)


__all__: Sequence[str] = ("LoopbackHub", "LoopbackExecutor")
