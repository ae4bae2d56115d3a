"""The communication executor: batched point-to-point transfers, shared by forward and backward.

Forward moves KV rows from their owners into receivers' buffers; backward moves the gradients of
those rows back along the reverse of the same transfers. Both are one call of
:meth:`P2PExecutor.transfer` with the send and receive sides swapped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.distributed as dist

Splits = Sequence[tuple[int, int, int]]  # (peer, row offset, row count)


class HSAPCommError(RuntimeError):
    """A peer did not answer in time (it died or stalled) or the transport failed."""


def raise_comm_error(err: Exception, what: str, peers: Sequence[int], timeout_s: float | None) -> None:
    """Re-raise a transport error with a message that names the peers and the fix."""
    limit = f"within the SP group timeout ({timeout_s:g} s)" if timeout_s else "(transport error)"
    raise HSAPCommError(
        f"hf_hsap {what}: no answer from global rank(s) {sorted(set(peers))} {limit}: a peer died, stalled "
        "or runs a different step. Check the other ranks' logs; raise timeout_s in "
        f"hf_hsap.init_sequence_parallel(..., timeout_s=...) only if steps are legitimately slow. [{err}]"
    ) from err


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
    max_recv_rows: int = 0  # largest receive buffer allocated (what the budget bounds)

    def reset(self) -> None:
        self.messages = self.rows_sent = self.bytes_sent = self.rows_recv = self.bytes_recv = 0
        self.a2a_bytes_sent = self.max_recv_rows = 0
        self.per_peer_bytes_sent = {}

    def count_send(self, peer: int, rows: int, row_bytes: int) -> None:
        """One message of ``rows`` rows to ``peer``."""
        self.messages += 1
        self.rows_sent += rows
        self.bytes_sent += rows * row_bytes
        self.per_peer_bytes_sent[peer] = self.per_peer_bytes_sent.get(peer, 0) + rows * row_bytes

    def count_recv(self, rows: int, row_bytes: int, buffer_rows: int) -> None:
        """``rows`` rows received into a buffer of ``buffer_rows`` rows."""
        self.rows_recv += rows
        self.bytes_recv += rows * row_bytes
        self.max_recv_rows = max(self.max_recv_rows, buffer_rows)


class Pending:
    """In-flight transfers; :meth:`wait` returns the receive buffer."""

    def __init__(self, works: list, recv: torch.Tensor, peers: Sequence[int] = (),
                 timeout_s: float | None = None) -> None:
        self._works = works
        self._recv = recv
        self._peers = peers
        self._timeout_s = timeout_s

    def wait(self) -> torch.Tensor:
        try:
            for w in self._works:
                w.wait()
        except RuntimeError as err:
            raise_comm_error(err, "point-to-point transfer", self._peers, self._timeout_s)
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
                 stats: CommStats | None = None, timeout_s: float | None = None) -> None:
        self.group = group
        self.peer_to_global = tuple(int(r) for r in peer_to_global)
        self.stats = stats if stats is not None else CommStats()
        self.timeout_s = timeout_s

    def transfer(self, send: torch.Tensor, send_splits: Splits, recv_rows: int, recv_splits: Splits,
                 tag: int = 0) -> Pending:
        """Start sending ``send[off:off+n]`` to each peer and receiving into a new buffer.

        Args:
            send: ``[n_send, ...]`` rows grouped by peer as ``send_splits`` says.
            send_splits: ``(peer, offset, count)`` of each outgoing message.
            recv_rows: rows of the receive buffer.
            recv_splits: ``(peer, offset, count)`` of each incoming message.
            tag: message tag; transfers that may be in flight at the same time use distinct tags (gloo
                matches by tag; NCCL by the order of calls, which every rank issues alike).

        Returns:
            :class:`Pending`; its ``wait()`` gives the ``[recv_rows, ...]`` buffer (``send``'s dtype).
        """
        recv = torch.empty((recv_rows, *send.shape[1:]), dtype=send.dtype, device=send.device)
        ops = []
        row_bytes = math.prod(send.shape[1:]) * send.element_size()
        for peer, off, n in send_splits:
            if n == 0:
                continue
            ops.append(dist.P2POp(dist.isend, send[off:off + n].contiguous(), self.peer_to_global[peer], self.group,
                                  tag))
            self.stats.count_send(peer, n, row_bytes)
        for peer, off, n in recv_splits:
            if n == 0:
                continue
            ops.append(dist.P2POp(dist.irecv, recv[off:off + n], self.peer_to_global[peer], self.group, tag))
        self.stats.count_recv(sum(n for _, _, n in recv_splits), row_bytes, recv_rows)
        peers = [self.peer_to_global[p] for p, _, n in (*send_splits, *recv_splits) if n]
        try:
            works = dist.batch_isend_irecv(ops) if ops else []
        except RuntimeError as err:
            raise_comm_error(err, "point-to-point transfer", peers, self.timeout_s)
        return Pending(works, recv, peers, self.timeout_s)
