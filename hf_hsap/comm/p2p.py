"""The communication executor: batched point-to-point transfers, shared by forward and backward.

Forward moves KV rows from their owners into receivers' buffers; backward moves the gradients of
those rows back along the reverse of the same transfers. Both are one call of
:meth:`P2PExecutor.transfer` with the send and receive sides swapped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.distributed as dist

Splits = Sequence[tuple[int, int, int]]  # (peer, row offset, row count)


@dataclass
class CommStats:
    """Counters of what the executor really moved (for tests and benchmarks)."""

    messages: int = 0
    rows_sent: int = 0
    bytes_sent: int = 0
    rows_recv: int = 0
    bytes_recv: int = 0
    per_peer_bytes_sent: dict = field(default_factory=dict)
    a2a_bytes_sent: int = 0

    def reset(self) -> None:
        self.messages = self.rows_sent = self.bytes_sent = self.rows_recv = self.bytes_recv = 0
        self.a2a_bytes_sent = 0
        self.per_peer_bytes_sent = {}


class Pending:
    """In-flight transfers; :meth:`wait` returns the receive buffer."""

    def __init__(self, works: list, recv: torch.Tensor) -> None:
        self._works = works
        self._recv = recv

    def wait(self) -> torch.Tensor:
        for w in self._works:
            w.wait()
        self._works = []
        return self._recv


class P2PExecutor:
    """Runs batched ``isend``/``irecv`` among the peers of one process group.

    Args:
        group: the process group (the SP group); ``None`` for the default group.
        peer_to_global: global rank of every peer index used in the splits.
        stats: counters to update (kept on the caller's object, never module-global).
    """

    def __init__(self, group: dist.ProcessGroup | None, peer_to_global: Sequence[int],
                 stats: CommStats | None = None) -> None:
        self.group = group
        self.peer_to_global = tuple(int(r) for r in peer_to_global)
        self.stats = stats if stats is not None else CommStats()

    def transfer(self, send: torch.Tensor, send_splits: Splits, recv_rows: int, recv_splits: Splits) -> Pending:
        """Start sending ``send[off:off+n]`` to each peer and receiving into a new buffer.

        Args:
            send: ``[n_send, ...]`` rows grouped by peer as ``send_splits`` says.
            send_splits: ``(peer, offset, count)`` of each outgoing message.
            recv_rows: rows of the receive buffer.
            recv_splits: ``(peer, offset, count)`` of each incoming message.

        Returns:
            :class:`Pending`; its ``wait()`` gives the ``[recv_rows, ...]`` buffer (``send``'s dtype).
        """
        recv = torch.empty((recv_rows, *send.shape[1:]), dtype=send.dtype, device=send.device)
        ops = []
        row_bytes = send[:1].numel() * send.element_size() if send.shape[0] else 0
        for peer, off, n in send_splits:
            if n == 0:
                continue
            ops.append(dist.P2POp(dist.isend, send[off:off + n].contiguous(), self.peer_to_global[peer], self.group))
            self.stats.messages += 1
            self.stats.rows_sent += n
            self.stats.bytes_sent += n * row_bytes
            self.stats.per_peer_bytes_sent[peer] = self.stats.per_peer_bytes_sent.get(peer, 0) + n * row_bytes
        for peer, off, n in recv_splits:
            if n == 0:
                continue
            ops.append(dist.P2POp(dist.irecv, recv[off:off + n], self.peer_to_global[peer], self.group))
            self.stats.rows_recv += n
            self.stats.bytes_recv += n * recv[:1].numel() * recv.element_size()
        works = dist.batch_isend_irecv(ops) if ops else []
        return Pending(works, recv)
