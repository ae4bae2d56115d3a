"""Baseline sequence-parallel attention schedules over hf_hsap's own CPU kernel (for measurement only).

Every baseline runs document-masked causal attention of one packed row over the default process
group, forward and backward by explicit calls (no autograd), and every kernel call is a
:class:`~hf_hsap.kernels.TorchCPUFlashKernel` varlen call with a :class:`~hf_hsap.kernels.VarlenSpec`,
the kernel hf_hsap uses, so a measured ratio shows the schedule, not the kernel.

* :class:`RingAttention`: contiguous shards; every KV block travels the ring ``P - 1`` steps (batched
  ``isend``/``irecv``, the next block in flight during the current step's compute); per step the
  document-masked pairs of that block; LSE merge in fp32. Backward: K/V travel the ring again with a
  dK/dV accumulator that returns to its owner after ``P`` hops (as ring-flash-attention).
* :class:`AllGatherKV` (Llama 3): row zigzag shards (``2P`` chunks, chunk ``i`` and ``2P-1-i`` on rank
  ``i``); all-gather of K, V; one varlen call of the local queries against the keys of their documents
  up to themselves; backward reduce-scatters dK, dV (an all-to-all then a local sum: gloo has no
  reduce-scatter). The gathered K, V are kept for the backward (no second all-gather).
* :class:`UlyssesAttention` (DeepSpeed): contiguous shards; one all-to-all of Q, K, V from sequence to
  heads (key/value heads repeated to a multiple of ``P`` when needed), the whole row's varlen attention
  for ``H / P`` heads, all-to-all back; backward the mirror image.

Each object counts the bytes it receives from other ranks (``bytes_recv``) per forward + backward.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist

from hf_hsap.comm.all_to_all import head_to_seq, seq_to_head
from hf_hsap.kernels import TorchCPUFlashKernel, VarlenSpec, merge_partial

Item = tuple[VarlenSpec, torch.Tensor, torch.Tensor]  # spec, query rows, key rows


def _ranges(starts: list[int], ends: list[int]) -> torch.Tensor:
    """Concatenated ``arange(s, e)``. Shapes: ``[m], [m] -> [sum(e - s)]`` int64."""
    if not starts:
        return torch.zeros(0, dtype=torch.int64)
    return torch.cat([torch.arange(s, e, dtype=torch.int64) for s, e in zip(starts, ends)])


def _doc_cuts(cu: np.ndarray, lo: int, hi: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut at document boundaries: ``[(start, end), ...]`` in global positions."""
    inner = cu[(cu > lo) & (cu < hi)].tolist()
    b = [lo] + inner + [hi]
    return list(zip(b[:-1], b[1:]))


def _nbytes(t: torch.Tensor, rows: int) -> int:
    """Bytes of ``rows`` rows of ``t``."""
    return rows * (t[0].numel() if t.shape[0] else 0) * t.element_size()


class RingAttention:
    """Ring attention on contiguous shards (see the module docstring).

    Args:
        cu: ``[n_docs + 1]`` document boundaries of the row; rank, world: this rank and the ring size.
        kernel: the varlen kernel; scale: softmax scale.
    """

    def __init__(self, cu: np.ndarray, rank: int, world: int, kernel: TorchCPUFlashKernel, scale: float) -> None:
        T = int(cu[-1])
        self.cu, self.rank, self.P, self.kernel, self.scale = cu, rank, world, kernel, scale
        self.bounds = (np.arange(world + 1) * T) // world  # [P + 1] block b = [bounds[b], bounds[b+1])
        self.lo, self.hi = int(self.bounds[rank]), int(self.bounds[rank + 1])
        self.items = [self._item(s) for s in range(world)]
        self.bytes_recv = 0

    def local_indices(self) -> torch.Tensor:
        """Global positions of this rank's tokens. ``[n_local]``."""
        return torch.arange(self.lo, self.hi, dtype=torch.int64)

    def _block(self, s: int) -> int:
        return (self.rank - s) % self.P

    def _item(self, s: int) -> Item | None:
        """The work of step ``s`` (block ``rank - s``): causal over the own block at ``s = 0``; full
        attention of the local part of each document against the block's part of it for an earlier
        block; nothing for a later block."""
        b = self._block(s)
        blo, bhi = int(self.bounds[b]), int(self.bounds[b + 1])
        if s == 0:
            cuts = _doc_cuts(self.cu, self.lo, self.hi)
            cu_l = tuple([0] + [e - self.lo for _, e in cuts])
            n = self.hi - self.lo
            return VarlenSpec(cu_l, cu_l, True), torch.arange(n), torch.arange(n)
        if b > self.rank:
            return None
        qs, qe, ks, ke = [], [], [], []
        for a, e in zip(self.cu[:-1].tolist(), self.cu[1:].tolist()):
            if a < bhi and e > self.lo:  # the document overlaps the block and this rank
                qs.append(max(a, self.lo) - self.lo), qe.append(min(e, self.hi) - self.lo)
                ks.append(max(a, blo) - blo), ke.append(min(e, bhi) - blo)
        if not qs:
            return None
        spec = VarlenSpec.from_lengths([e - s for s, e in zip(qs, qe)], [e - s for s, e in zip(ks, ke)], False)
        return spec, _ranges(qs, qe), _ranges(ks, ke)

    def _exchange(self, send: torch.Tensor, recv_rows: int, tag: int) -> tuple[list, torch.Tensor]:
        """Post ``send`` to the successor and a receive of ``recv_rows`` rows from the predecessor."""
        recv = torch.empty((recv_rows, *send.shape[1:]), dtype=send.dtype)
        nxt, prv = (self.rank + 1) % self.P, (self.rank - 1) % self.P
        ops = [dist.P2POp(dist.isend, send, nxt, tag=tag), dist.P2POp(dist.irecv, recv, prv, tag=tag)]
        self.bytes_recv += _nbytes(recv, recv_rows)
        return dist.batch_isend_irecv(ops), recv

    def _rows(self, b: int) -> int:
        return int(self.bounds[b + 1] - self.bounds[b])

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes: q ``[n, Hq, D]``, k/v ``[n, Hkv, D]`` -> out ``[n, Hq, D]``, lse ``[n, Hq]`` fp32."""
        hkv = k.shape[1]
        cur = torch.cat([k, v], dim=1)  # [n, 2*Hkv, D]
        out = torch.zeros(q.shape, dtype=torch.float32)
        lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32)
        for s in range(self.P):
            works, nxt = self._exchange(cur, self._rows(self._block(s + 1)), 1) if s < self.P - 1 else ([], None)
            item = self.items[s]
            if item is not None:
                spec, qi, ki = item
                kv = cur.index_select(0, ki)  # [n_k, 2*Hkv, D]
                o, l = self.kernel.forward(q.index_select(0, qi), kv[:, :hkv], kv[:, hkv:], spec, self.scale)
                m_o, m_l = merge_partial(out.index_select(0, qi), lse.index_select(0, qi), o, l)
                out.index_copy_(0, qi, m_o)
                lse.index_copy_(0, qi, m_l)
            for w in works:
                w.wait()
            cur = nxt if nxt is not None else cur
        return out.to(q.dtype), lse

    def backward(self, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Gradients from the final ``out`` / ``lse``. Returns dq ``[n, Hq, D]``, dk, dv ``[n, Hkv, D]``."""
        hkv = k.shape[1]
        dq = torch.zeros(q.shape, dtype=torch.float32)
        cur = torch.cat([k, v], dim=1)  # [n, 2*Hkv, D]
        dcur = torch.zeros(cur.shape, dtype=torch.float32)  # dK/dV accumulator of the block in hand
        for s in range(self.P):
            nb = self._block(s + 1)
            kv_works, nxt = self._exchange(cur, self._rows(nb), 1) if s < self.P - 1 else ([], None)
            item = self.items[s]
            if item is not None:
                spec, qi, ki = item
                kv = cur.index_select(0, ki)
                gq, gk, gv = self.kernel.backward(dout.index_select(0, qi), q.index_select(0, qi), kv[:, :hkv],
                                                  kv[:, hkv:], out.index_select(0, qi), lse.index_select(0, qi),
                                                  spec=spec, scale=self.scale)
                dq.index_add_(0, qi, gq.float())
                dcur.index_add_(0, ki, torch.cat([gk, gv], dim=1).float())
            d_works, dnxt = self._exchange(dcur, self._rows(nb), 2)  # the accumulator moves on (home at the end)
            for w in kv_works + d_works:
                w.wait()
            cur = nxt if nxt is not None else cur
            dcur = dnxt
        return dq.to(q.dtype), dcur[:, :hkv].to(k.dtype), dcur[:, hkv:].to(v.dtype)


class AllGatherKV:
    """Llama 3 style all-gather of K, V on row zigzag shards (see the module docstring)."""

    def __init__(self, cu: np.ndarray, rank: int, world: int, kernel: TorchCPUFlashKernel, scale: float) -> None:
        T = int(cu[-1])
        self.rank, self.P, self.kernel, self.scale = rank, world, kernel, scale
        c = (np.arange(2 * world + 1) * T) // (2 * world)  # [2P + 1] chunk bounds
        self.chunks = [[(int(c[i]), int(c[i + 1])), (int(c[2 * world - 1 - i]), int(c[2 * world - i]))]
                       for i in range(world)]
        self.sizes = [sum(e - s for s, e in ch) for ch in self.chunks]
        self.perm = torch.cat([self._indices(r) for r in range(world)])  # [T] global row of each gathered row
        q_lens, k_lens, k_s, k_e = [], [], [], []
        for lo, hi in self.chunks[rank]:
            for a, e in _doc_cuts(cu, lo, hi):
                d0 = int(cu[np.searchsorted(cu, a, side="right") - 1])  # start of the document of a
                q_lens.append(e - a), k_lens.append(e - d0), k_s.append(d0), k_e.append(e)
        self.spec = VarlenSpec.from_lengths(q_lens, k_lens, True)  # bottom-right causal
        self.k_index = _ranges(k_s, k_e)  # [sum k_lens] global key rows (repeated for the 2nd chunk)
        self.bytes_recv = 0

    def _indices(self, r: int) -> torch.Tensor:
        return _ranges([s for s, _ in self.chunks[r]], [e for _, e in self.chunks[r]])

    def local_indices(self) -> torch.Tensor:
        """Global positions of this rank's tokens (its two chunks). ``[n_local]``."""
        return self._indices(self.rank)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns out ``[n, Hq, D]``, lse ``[n, Hq]`` and the gathered KV ``[T, 2*Hkv, D]`` (kept for backward)."""
        hkv = k.shape[1]
        kv = torch.cat([k, v], dim=1)  # [n, 2*Hkv, D]
        n_max = max(self.sizes)  # gloo's all-gather takes equal sizes: pad to the largest shard
        send = kv if kv.shape[0] == n_max else torch.cat([kv, kv.new_zeros((n_max - kv.shape[0], *kv.shape[1:]))])
        parts = [torch.empty_like(send) for _ in self.sizes]  # P x [n_max, 2*Hkv, D]
        dist.all_gather(parts, send)
        self.bytes_recv += _nbytes(kv, sum(self.sizes) - self.sizes[self.rank])
        glob = torch.empty((sum(self.sizes), *kv.shape[1:]), dtype=kv.dtype)
        glob[self.perm] = torch.cat([p[:n] for p, n in zip(parts, self.sizes)])  # [T, 2*Hkv, D] global order
        kvi = glob.index_select(0, self.k_index)
        out, lse = self.kernel.forward(q, kvi[:, :hkv], kvi[:, hkv:], self.spec, self.scale)
        return out, lse, glob

    def backward(self, dout: torch.Tensor, q: torch.Tensor, glob: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns dq ``[n, Hq, D]``, dk, dv ``[n, Hkv, D]`` (dK/dV reduce-scattered to their owners)."""
        hkv = glob.shape[1] // 2
        kvi = glob.index_select(0, self.k_index)
        dq, gk, gv = self.kernel.backward(dout, q, kvi[:, :hkv], kvi[:, hkv:], out, lse, spec=self.spec,
                                          scale=self.scale)
        dglob = torch.zeros(glob.shape, dtype=torch.float32)
        dglob.index_add_(0, self.k_index, torch.cat([gk, gv], dim=1).float())  # [T, 2*Hkv, D]
        send = dglob.index_select(0, self.perm)  # rows grouped by owner rank
        n = self.sizes[self.rank]
        recv = torch.empty((self.P * n, *glob.shape[1:]), dtype=torch.float32)  # [P * n, 2*Hkv, D]
        dist.all_to_all_single(recv, send, output_split_sizes=[n] * self.P, input_split_sizes=self.sizes)
        self.bytes_recv += _nbytes(recv, (self.P - 1) * n)
        dkv = recv.view(self.P, n, *glob.shape[1:]).sum(0)  # [P, n, 2*Hkv, D] -> [n, 2*Hkv, D]
        return dq, dkv[:, :hkv].to(glob.dtype), dkv[:, hkv:].to(glob.dtype)


class UlyssesAttention:
    """DeepSpeed-Ulysses over the default group (see the module docstring)."""

    def __init__(self, cu: np.ndarray, rank: int, world: int, kernel: TorchCPUFlashKernel, scale: float) -> None:
        T = int(cu[-1])
        self.rank, self.P, self.kernel, self.scale = rank, world, kernel, scale
        b = (np.arange(world + 1) * T) // world
        self.pieces = tuple(int(x) for x in np.diff(b))
        self.lo, self.hi = int(b[rank]), int(b[rank + 1])
        cut = tuple(int(x) for x in cu)
        self.spec = VarlenSpec(cut, cut, True)
        self.bytes_recv = 0

    def local_indices(self) -> torch.Tensor:
        """Global positions of this rank's tokens. ``[n_local]``."""
        return torch.arange(self.lo, self.hi, dtype=torch.int64)

    def _count_s2h(self, feat: int, x: torch.Tensor) -> None:
        self.bytes_recv += (sum(self.pieces) - self.pieces[self.rank]) * feat * x.element_size()

    def _count_h2s(self, feat: int, x: torch.Tensor) -> None:
        self.bytes_recv += (self.P - 1) * self.pieces[self.rank] * feat * x.element_size()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """Returns out ``[n, Hq, D]`` and what backward needs (head-sharded q, k, v, out, lse)."""
        t, hq, d = q.shape
        hkv = k.shape[1]
        rep = math.lcm(hkv, self.P) // hkv if hkv % self.P else 1
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # [t, Hkv*rep, D]
        U = self.P
        packed = torch.cat([q.reshape(t, U, -1), k.reshape(t, U, -1), v.reshape(t, U, -1)], dim=2)  # [t, U, F]
        heads = seq_to_head(packed.reshape(t, -1), None, self.pieces, self.rank)  # [T, F]
        self._count_s2h(heads.shape[1], heads)
        fq, fk = hq // U * d, k.shape[1] // U * d
        T = heads.shape[0]
        qh = heads[:, :fq].reshape(T, hq // U, d)  # [T, Hq/U, D]
        kh = heads[:, fq:fq + fk].reshape(T, k.shape[1] // U, d)  # [T, Hkv'/U, D]
        vh = heads[:, fq + fk:].reshape(T, k.shape[1] // U, d)
        oh, lh = self.kernel.forward(qh, kh, vh, self.spec, self.scale)
        out = head_to_seq(oh.reshape(T, -1), None, self.pieces, self.rank)  # [t, U * Hq/U * D]
        self._count_h2s(oh.shape[1] * d, oh)
        return out.reshape(t, hq, d), (qh, kh, vh, oh, lh, rep, hkv)

    def backward(self, dout: torch.Tensor, saved: tuple) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns dq ``[n, Hq, D]``, dk, dv ``[n, Hkv, D]`` (repeated key/value heads summed back)."""
        qh, kh, vh, oh, lh, rep, hkv = saved
        t, hq, d = dout.shape
        U = self.P
        doh = seq_to_head(dout.reshape(t, -1), None, self.pieces, self.rank)  # [T, Hq/U * D]
        self._count_s2h(doh.shape[1], doh)
        T = doh.shape[0]
        gq, gk, gv = self.kernel.backward(doh.reshape(T, hq // U, d), qh, kh, vh, oh, lh, spec=self.spec,
                                          scale=self.scale)
        packed = torch.cat([gq.reshape(T, -1), gk.reshape(T, -1), gv.reshape(T, -1)], dim=1)  # [T, F]
        back = head_to_seq(packed, None, self.pieces, self.rank).reshape(t, U, -1)  # [t, U, F]
        self._count_h2s(packed.shape[1], packed)
        fq, fk = gq.shape[1] * d, gk.shape[1] * d
        dq = back[:, :, :fq].reshape(t, hq, d)
        dk = back[:, :, fq:fq + fk].reshape(t, hkv * rep, d)  # [t, Hkv*rep, D]
        dv = back[:, :, fq + fk:].reshape(t, hkv * rep, d)
        if rep > 1:
            dk = dk.reshape(t, hkv, rep, d).sum(2)  # [t, Hkv, rep, D] -> [t, Hkv, D]
            dv = dv.reshape(t, hkv, rep, d).sum(2)
        return dq, dk, dv
