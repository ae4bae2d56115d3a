"""Exact per-rank counts of every sequence-parallel attention scheme on one packed layout (no clock).

One attention layer, document-masked causal attention; ``P`` GPUs, GPU ``g`` on node
``g // gpus_per_node``. Every scheme returns a :class:`SchemeStats` with ``[P]`` arrays:

| field         | meaning                                                                                |
| ------------- | -------------------------------------------------------------------------------------- |
| `tokens`      | tokens held outside attention (activation memory); TE counts its padding               |
| `work`        | (query, key) pairs computed, *head-normalised*: a pair over all q heads counts 1, so a |
|               | Ulysses rank holding ``H/U`` heads of a pair counts ``1/U``                            |
| `recv_kv`     | KV tokens received in the forward pass, in full-KV units (K and V of all kv heads = 1) |
| `bytes_intra` | bytes received per layer, forward + backward, over NVLink (same node)                  |
| `bytes_inter` | the same over InfiniBand (other node)                                                  |

Counting rules (assumptions):

* Kernel: every scheme runs a varlen kernel that computes exactly the pairs of the document-masked
  causal mask on the pieces it is given (tile-level waste is not counted). A query at offset ``x``
  of its document therefore costs ``x + 1`` pairs. ``torch_cp`` is plain causal over the whole row
  (query at global position ``g`` costs ``g + 1``) and is only correct on a one-document layout.
* Ring P2P (``ring``, ``zigzag_ring``, ``torch_cp``, ``te_p2p`` and the ring stage of ``usp`` /
  ``te_a2a_p2p``): every KV shard travels the whole ring whether needed or not; all traffic comes
  from the ring predecessor. Forward: ``S-1`` KV shards. Backward (as ring-flash-attention): K/V
  circulate again (``S-1`` shards) and the dK/dV accumulator travels ``S`` hops back to its owner.
  Gradients are counted in the model dtype (an fp32 accumulator would double the dK/dV term).
* All-gather / reduce-scatter (``allgather_kv``): node-hierarchical (NCCL with one ring per NIC): data
  from another node crosses InfiniBand once per node, spread over the node's NICs, so a GPU
  receives ``(T - T_node) / gpus_in_node`` tokens over IB and the rest of ``T - n_r`` over NVLink.
  K/V are all-gathered again in backward (not kept for every layer) and dK/dV are reduce-scattered.
* All-to-all (Ulysses stage): attributed to the source GPU's node. Forward: Q, K, V (sequence →
  heads) and O (heads → sequence); backward: dO, then dQ, dK, dV. When the degree ``U`` exceeds
  the kv heads, kv heads are replicated to ``U`` (``U`` must divide ``q_heads`` and be a multiple
  of ``kv_heads``); otherwise ``U`` must divide both head counts. ``feasible=False`` if not.
* ``te_*``: TransformerEngine THD needs every document length to be a multiple of ``2P``; each
  document is padded at its end and padded tokens are held and computed like real ones.
* Ulysses / USP groups are ``U`` consecutive GPUs (inside a node when ``U <= gpus_per_node``); the
  ring of USP links GPU ``g`` to ``g - U``. USP shards the row zigzag at the ring level (``2R``
  chunks, group ``j`` holds chunks ``j`` and ``2R-1-j``), as yunchang does.
* Sliding windows (``window=W``, every scheme; ``None`` = full causal attention): a query at ``i`` keeps
  the keys ``j`` of its document with ``j <= i < j + W``. Traffic does not change (ring shards still
  travel the whole ring, Ulysses still moves every head's sequence, all-gather still gathers all KV),
  but ``work`` (and the ring's ``step_work``) counts only the kept pairs: generous to the baselines,
  whose kernels are assumed to skip masked pairs. Exact per rank from each scheme's token placement
  (closed forms per pair of segments, :func:`benchmarks.analytic.window_pairs.window_pairs`).
"""
from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass, field

import numpy as np

from hf_hsap.model_shape import MODEL_SHAPES, ModelShape

from .distributions import pair_matrix, per_doc_chunk_matrix, row_chunk_matrix, zigzag_owner
from .window_pairs import (doc_chunk_segments, row_segments, segment_pair_matrix, window_rows_work,
                           window_useful_pairs)


LLAMA2_7B_SHAPE = MODEL_SHAPES["llama2-7b"]  # the schemes count bytes with its heads (ModelShape.kv_token_bytes, ...)
LLAMA3_8B_SHAPE = MODEL_SHAPES["llama3-8b"]


@dataclass
class CommPhase:
    """One collective / P2P pattern of one layer. ``overlap``: ``none`` (exposed) or ``local``
    (hidden behind the rank's work that needs no remote data). Byte arrays are ``[P]``."""

    name: str
    backward: bool
    overlap: str
    bytes_intra: np.ndarray
    bytes_inter: np.ndarray
    rounds: int = 1


@dataclass
class RingPipeline:
    """A KV ring of ``S`` steps (all ``[P, S]`` arrays per GPU ``g`` and step ``s``).

    ``step_work``: forward work at step ``s``; ``kv_bytes``: KV bytes arriving during step ``s``
    (used at step ``s + 1``; the same in forward and backward); ``dkv_bytes``: dK/dV accumulator bytes
    arriving after step ``s`` (backward); ``prev`` ``[P]``: ring predecessor; ``inter`` ``[P]``: the
    link from it is inter-node."""

    step_work: np.ndarray
    kv_bytes: np.ndarray
    dkv_bytes: np.ndarray
    prev: np.ndarray
    inter: np.ndarray


@dataclass
class RoundSchedule:
    """hf_hsap's SAP rounds over its ``R`` parts (GPU ``g`` runs part ``gpu_part[g]``; the ``U`` GPUs
    of a part carry equal shares). ``[R, n]`` arrays per part and round: ``recv_intra`` /
    ``recv_inter`` KV bytes received per GPU, ``ret_intra`` / ``ret_inter`` dK/dV bytes coming back
    per GPU (the rows it sent), ``work`` remote pairs per GPU; ``peers`` ``[n, R, R]`` (dst, src);
    ``refetch``: backward fetches the KV again (a receive budget)."""

    gpu_part: np.ndarray
    recv_intra: np.ndarray
    recv_inter: np.ndarray
    ret_intra: np.ndarray
    ret_inter: np.ndarray
    work: np.ndarray
    peers: np.ndarray
    refetch: bool = False


@dataclass
class SchemeStats:
    """Per-rank counts of one scheme on one layout (see the module docstring for units).

    ``T`` and ``useful_pairs`` describe the real layout (no padding) and feed the physical bound.
    ``hideable_work`` ``[P]`` is work computable before any remote data arrives (``local`` overlap).
    """

    name: str
    P: int
    T: int
    useful_pairs: int
    tokens: np.ndarray
    work: np.ndarray
    recv_kv: np.ndarray
    bytes_intra: np.ndarray
    bytes_inter: np.ndarray
    correct: bool
    feasible: bool = True
    note: str = ""
    phases: list[CommPhase] = field(default_factory=list)
    ring: RingPipeline | None = None
    hideable_work: np.ndarray | None = None
    shape: ModelShape | None = None
    gpus_per_node: int = 8
    rounds: RoundSchedule | None = None


# ----------------------------------------------------------------------------- head helpers
def _heads_ok(U: int, shape: ModelShape) -> bool:
    """Whether Ulysses of degree ``U`` fits the heads (kv heads replicated when ``U > kv_heads``)."""
    if U == 1:
        return True
    kv_ok = shape.kv_heads % U == 0 or U % shape.kv_heads == 0
    return shape.q_heads % U == 0 and kv_ok


def _kv_share(U: int, shape: ModelShape) -> float:
    """Fraction of a token's full K/V one GPU carries under Ulysses degree ``U`` (kv heads replicated
    to ``max(kv_heads, U)``, then split ``U`` ways)."""
    return max(shape.kv_heads, U) / U / shape.kv_heads


def _split(total: np.ndarray, U: int) -> np.ndarray:
    """Split each group's token count over its ``U`` GPUs: ``[R]`` → ``[R * U]`` (GPU ``j*U + u``)."""
    total = np.asarray(total, dtype=np.int64)
    u = np.arange(U)
    return (total[:, None] // U + (u[None, :] < (total[:, None] % U))).reshape(-1)


# ----------------------------------------------------------------------------- building blocks
def _ulysses_phases(tok: np.ndarray, U: int, shape: ModelShape, gpn: int) -> tuple[list[CommPhase], np.ndarray]:
    """All-to-all phases of Ulysses groups of ``U`` consecutive GPUs (``tok``: ``[P]`` sequence-sharded
    tokens per GPU; ``gpn``: GPUs per node). Returns ``(phases, recv_kv [P] in full-KV units)``."""
    P = tok.size
    R = P // U
    n = tok.reshape(R, U).astype(np.float64)  # [R, U]
    node = (np.arange(P) // gpn).reshape(R, U)
    same = node[:, :, None] == node[:, None, :]  # [R, U(receiver), U(peer)]
    peer = ~np.eye(U, dtype=bool)[None]
    in_intra = (n[:, None, :] * (same & peer)).sum(-1)  # tokens of same-node peers, [R, U]
    in_inter = (n[:, None, :] * (~same & peer)).sum(-1)
    k_intra = (same & peer).sum(-1) * n  # own tokens × same-node peers
    k_inter = (~same & peer).sum(-1) * n
    q_b = shape.q_token_bytes / U  # per token, this GPU's head share
    kv_b = shape.kv_token_bytes * _kv_share(U, shape)
    flat = lambda x: x.reshape(-1)  # noqa: E731  [R, U] -> [P]
    phases = [
        CommPhase("a2a_qkv", False, "none", flat(in_intra) * (q_b + kv_b), flat(in_inter) * (q_b + kv_b)),
        CommPhase("a2a_o", False, "none", flat(k_intra) * q_b, flat(k_inter) * q_b),
        CommPhase("a2a_do", True, "none", flat(in_intra) * q_b, flat(in_inter) * q_b),
        CommPhase("a2a_dqkv", True, "none", flat(k_intra) * (q_b + kv_b), flat(k_inter) * (q_b + kv_b)),
    ]
    return phases, flat(in_intra + in_inter) * _kv_share(U, shape)


def _chunk_pairs(segments: tuple[np.ndarray, ...], chunk_owner: np.ndarray, n_parts: int,
                 window: int | None) -> np.ndarray:
    """:func:`segment_pair_matrix` of chunked segments ``(doc, a, b, chunk)`` owned by ``chunk_owner[chunk]``."""
    d, a, b, c = segments
    return segment_pair_matrix(d, a, b, np.asarray(chunk_owner)[c], n_parts, window)


def _ring_stats(name: str, wg: np.ndarray, group_tok: np.ndarray, tok: np.ndarray, U: int, shape: ModelShape,
                gpn: int, T: int, pairs: int, correct: bool, note: str) -> SchemeStats:
    """Scheme = Ulysses of degree ``U`` inside groups × KV ring over the ``R`` groups.

    Args:
        wg: ``[R, R]`` group-level work of group ``a``'s queries on group ``b``'s keys.
        group_tok: ``[R]`` tokens of each group (what its KV shard carries around the ring).
        tok: ``[P]`` tokens held by each GPU.
        U: Ulysses degree (1: plain ring).
        shape, gpn, T, pairs, correct, note: see :class:`SchemeStats`.
    """
    R = wg.shape[0]
    P = R * U
    g = np.arange(P)
    j = g // U  # ring position (group) of each GPU
    s = np.arange(R)
    src = (j[:, None] - s[None, :]) % R  # [P, R] group whose KV is used at step s
    step_work = wg[j[:, None], src] / U
    share = _kv_share(U, shape)
    kvb = shape.kv_token_bytes * share
    gt = np.asarray(group_tok, dtype=np.float64)
    nxt = gt[(j[:, None] - s[None, :] - 1) % R]  # [P, R] tokens of the shard arriving during step s
    kv_in = np.where(s[None, :] < R - 1, nxt, 0.0) * kvb
    dkv_in = nxt * kvb * (R > 1)  # the travelling dK/dV accumulator of the step's shard
    prev = (g - U) % P
    inter = (g // gpn) != (prev // gpn)
    phases, recv = [], (gt.sum() - gt[j]) * share
    if U > 1:
        phases, recv_u = _ulysses_phases(tok, U, shape, gpn)
        recv = recv + recv_u
    ring_total = 2 * kv_in.sum(1) + dkv_in.sum(1)  # KV in forward and again in backward, dK/dV
    b_intra = np.where(inter, 0.0, ring_total) + sum((p.bytes_intra for p in phases), np.zeros(P))
    b_inter = np.where(inter, ring_total, 0.0) + sum((p.bytes_inter for p in phases), np.zeros(P))
    return SchemeStats(name, P, T, pairs, tok.astype(np.int64), step_work.sum(1), recv, b_intra, b_inter,
                       correct, _heads_ok(U, shape), note, phases, RingPipeline(step_work, kv_in, dkv_in, prev, inter),
                       shape=shape, gpus_per_node=gpn)


# ----------------------------------------------------------------------------- schemes
def ring(lengths: np.ndarray, P: int, shape: ModelShape = LLAMA3_8B_SHAPE, gpus_per_node: int = 8,
         window: int | None = None) -> SchemeStats:
    """Ring attention on contiguous shards (rank ``r`` holds ``[rT/P, (r+1)T/P)``), varlen kernel.

    Args:
        lengths: ``[n_docs]`` document lengths (sum ``T``).
        P: SP size.
        shape: head shape for bytes.
        gpus_per_node: GPUs per node.
        window: sliding window ``W`` of the layer (None: full attention); changes ``work`` only.

    Returns:
        Counts; ``recv_kv`` is ``T - n_r`` = ``(P-1)/P T`` for equal shards.
    """
    T = int(np.sum(lengths))
    m = row_chunk_matrix(lengths, P)
    tok = m.sum(0).astype(np.int64)
    wg = pair_matrix(m, np.arange(P), P) if window is None else _chunk_pairs(row_segments(lengths, P), np.arange(P),
                                                                              P, window)
    return _ring_stats("ring", wg, tok, tok, 1, shape, gpus_per_node, T, window_useful_pairs(lengths, window), True,
                       "contiguous shards; every KV shard visits every rank")


def zigzag_ring(lengths: np.ndarray, P: int, shape: ModelShape = LLAMA3_8B_SHAPE,
                gpus_per_node: int = 8, window: int | None = None) -> SchemeStats:
    """Zigzag ring: the row cut in ``2P`` chunks, chunk ``i`` and ``2P-1-i`` on rank ``i``; KV ring.

    Args / Returns: as :func:`ring`.
    """
    return usp(lengths, 1, P, shape, gpus_per_node, name="zigzag_ring", window=window)


def torch_cp(lengths: np.ndarray, P: int, shape: ModelShape = LLAMA3_8B_SHAPE, gpus_per_node: int = 8,
             window: int | None = None) -> SchemeStats:
    """PyTorch context parallel as Accelerate uses it: head-tail (zigzag) sharding, KV ring, plain
    causal mask over the whole row (documents are not masked): ``correct`` only for one document.

    Args / Returns: as :func:`ring`; ``work`` counts ``g + 1`` pairs for a query at row position ``g``.
    """
    T = int(np.sum(lengths))
    s = usp(np.array([T]), 1, P, shape, gpus_per_node, name="torch_cp", window=window)  # the row as one sequence
    return dataclasses.replace(s, useful_pairs=window_useful_pairs(lengths, window), correct=len(lengths) == 1,
                               note="causal over the row, no document mask")


def usp(lengths: np.ndarray, U: int, R: int, shape: ModelShape = LLAMA3_8B_SHAPE, gpus_per_node: int = 8,
        name: str | None = None, window: int | None = None) -> SchemeStats:
    """USP: Ulysses of degree ``U`` inside groups of consecutive GPUs × zigzag ring of degree ``R``.

    Args:
        lengths, shape, gpus_per_node: as :func:`ring`; U, R: Ulysses and ring degrees (``P = U R``).
        name: scheme name (default ``usp_U{U}xR{R}``).
        window: sliding window ``W`` of the layer (None: full attention); changes ``work`` only.

    Returns:
        Counts; ``feasible`` is False when ``U`` does not fit the heads.
    """
    T = int(np.sum(lengths))
    m = row_chunk_matrix(lengths, 2 * R)
    owner = zigzag_owner(R)
    gtok = np.bincount(owner, weights=m.sum(0), minlength=R).astype(np.int64)
    wg = pair_matrix(m, owner, R) if window is None else _chunk_pairs(row_segments(lengths, 2 * R), owner, R, window)
    return _ring_stats(name or f"usp_U{U}xR{R}", wg, gtok, _split(gtok, U), U, shape,
                       gpus_per_node, T, window_useful_pairs(lengths, window), True, "row zigzag at the ring level")


def ulysses(lengths: np.ndarray, P: int, shape: ModelShape = LLAMA3_8B_SHAPE, gpus_per_node: int = 8,
            window: int | None = None) -> SchemeStats:
    """DeepSpeed Ulysses of degree ``P``: all-to-all of Q, K, V and O; every rank computes the whole
    row for ``H/P`` heads. ``feasible=False`` when ``P`` does not fit the heads (see module docs).

    Args / Returns: as :func:`ring`.
    """
    return usp(lengths, P, 1, shape, gpus_per_node, name="ulysses", window=window)


def te_p2p(lengths: np.ndarray, P: int, shape: ModelShape = LLAMA3_8B_SHAPE, gpus_per_node: int = 8,
           window: int | None = None) -> SchemeStats:
    """TransformerEngine THD with ``cp_comm_type="p2p"``: every document padded to a multiple of
    ``2P`` and cut in ``2P`` chunks, chunk ``i`` and ``2P-1-i`` on rank ``i``; KV ring.

    Args / Returns: as :func:`ring`; ``tokens`` and ``work`` include padding.
    """
    return te_a2a_p2p(lengths, 1, P, shape, gpus_per_node, name="te_p2p", window=window)


def te_a2a_p2p(lengths: np.ndarray, U: int, R: int, shape: ModelShape = LLAMA3_8B_SHAPE, gpus_per_node: int = 8,
               name: str | None = None, window: int | None = None) -> SchemeStats:
    """TransformerEngine ``a2a+p2p``: per-document ``2P`` chunking (``P = U R``), all-to-all inside
    groups of ``U`` GPUs, KV ring over the ``R`` groups. After the all-to-all group ``j`` holds
    chunks ``j`` and ``2R-1-j`` of every padded document at resolution ``2R``.

    Args:
        lengths, shape, gpus_per_node: as :func:`ring`; U, R: Ulysses and ring degrees.
        name: scheme name (default ``te_a2a_p2p_U{U}xR{R}``).
        window: sliding window ``W`` of the layer (None: full attention); changes ``work`` only (padding
            is computed like real tokens, windowed too).

    Returns:
        Counts (padding included in ``tokens`` and ``work``).
    """
    P = U * R
    padded = -(-np.asarray(lengths, dtype=np.int64) // (2 * P)) * (2 * P)  # THD: multiple of 2P
    m = per_doc_chunk_matrix(padded, 2 * R)
    gtok = np.full(R, int(padded.sum()) // R, dtype=np.int64)
    tok = np.full(P, int(padded.sum()) // P, dtype=np.int64)
    pad = int(padded.sum() - np.sum(lengths))
    wg = (pair_matrix(m, zigzag_owner(R), R) if window is None else
          _chunk_pairs(doc_chunk_segments(padded, 2 * R), zigzag_owner(R), R, window))
    return _ring_stats(name or f"te_a2a_p2p_U{U}xR{R}", wg, gtok, tok, U, shape,
                       gpus_per_node, int(np.sum(lengths)), window_useful_pairs(lengths, window), True,
                       f"{pad} padding tokens")


def allgather_kv(lengths: np.ndarray, P: int, shape: ModelShape = LLAMA3_8B_SHAPE,
                 gpus_per_node: int = 8, window: int | None = None) -> SchemeStats:
    """Llama 3 style: row zigzag (``2P`` chunks), all-gather of K and V, local queries against the keys
    they need; backward all-gathers K, V again and reduce-scatters dK, dV. Nothing overlaps.

    Args / Returns: as :func:`ring`.
    """
    T = int(np.sum(lengths))
    m = row_chunk_matrix(lengths, 2 * P)
    owner = zigzag_owner(P)
    tok = np.bincount(owner, weights=m.sum(0), minlength=P)
    node = np.arange(P) // gpus_per_node
    node_tok = np.bincount(node, weights=tok)[node]
    node_gpus = np.bincount(node)[node]
    inter = (T - node_tok) / node_gpus * shape.kv_token_bytes
    intra = (T - tok) * shape.kv_token_bytes - inter
    phases = [CommPhase("allgather_kv", False, "none", intra, inter, P - 1),
              CommPhase("allgather_kv_bwd", True, "none", intra, inter, P - 1),
              CommPhase("reduce_scatter_dkv", True, "none", intra, inter, P - 1)]
    wg = pair_matrix(m, owner, P) if window is None else _chunk_pairs(row_segments(lengths, 2 * P), owner, P, window)
    return SchemeStats("allgather_kv", P, T, window_useful_pairs(lengths, window), tok.astype(np.int64),
                       wg.sum(1), T - tok, 3 * intra, 3 * inter, True,
                       note="hierarchical all-gather / reduce-scatter", phases=phases, shape=shape,
                       gpus_per_node=gpus_per_node)


def whole_doc(lengths: np.ndarray, P: int, shape: ModelShape = LLAMA3_8B_SHAPE, gpus_per_node: int = 8,
              slack: float = 0.10, window: int | None = None) -> SchemeStats:
    """Every document whole on one rank (longest first onto the rank with fewest tokens; ties → lowest
    rank). No communication. ``feasible=False`` when a rank exceeds ``ceil(T/P) (1 + slack)`` tokens.

    Args / Returns: as :func:`ring` (zero bytes); ``slack``: memory slack over ``ceil(T/P)``; ``window``: as
    :func:`ring` (placement unchanged).
    """
    L = np.asarray(lengths, dtype=np.int64)
    T = int(L.sum())
    heap = [(0, r) for r in range(P)]
    rank_of = np.empty(L.size, dtype=np.int64)
    for d in np.argsort(-L, kind="stable"):
        load, r = heapq.heappop(heap)
        rank_of[d] = r
        heapq.heappush(heap, (load + int(L[d]), r))
    tok = np.bincount(rank_of, weights=L, minlength=P).astype(np.int64)
    work = np.bincount(rank_of, weights=window_rows_work(np.zeros_like(L), L, window).astype(np.float64), minlength=P)
    cap = -(-T // P) * (1 + slack)
    return SchemeStats("whole_doc", P, T, window_useful_pairs(L, window), tok, work, np.zeros(P), np.zeros(P),
                       np.zeros(P), True,
                       bool(tok.max() <= cap), f"token cap {cap:.0f}", hideable_work=work, shape=shape,
                       gpus_per_node=gpus_per_node)


def all_schemes(lengths: np.ndarray, P: int, shape: ModelShape = LLAMA3_8B_SHAPE, gpus_per_node: int = 8,
                u_values: tuple[int, ...] = (2, 4, 8), window: int | None = None) -> dict[str, SchemeStats]:
    """Every baseline on one layout, keyed by name (USP / TE a2a+p2p for each ``U`` dividing ``P``).

    Args:
        lengths, P, shape, gpus_per_node: as :func:`ring`.
        u_values: Ulysses degrees of the hierarchical schemes (``U = 1`` is ``zigzag_ring`` / ``te_p2p``).
        window: sliding window ``W`` of the layer (None: full attention); changes ``work`` only.

    Returns:
        ``{name: SchemeStats}``.
    """
    stats = [f(lengths, P, shape, gpus_per_node, window=window)
             for f in (ring, zigzag_ring, allgather_kv, ulysses, te_p2p, whole_doc, torch_cp)]
    for U in u_values:
        if 1 < U < P and P % U == 0:
            stats += [usp(lengths, U, P // U, shape, gpus_per_node, window=window),
                      te_a2a_p2p(lengths, U, P // U, shape, gpus_per_node, window=window)]
    return {s.name: s for s in stats}
