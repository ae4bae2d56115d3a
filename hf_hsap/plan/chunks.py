"""Chunked attention (Llama 4's ``chunked_attention`` layers) as documents: the plan of the row cut at chunk bounds.

A chunked layer's query sees the causal keys of its own chunk only. Transformers' rule (``masking_utils``'
``chunked_overlay`` on a packed row, where ``remap_positions_for_packed_sequence`` maps indices to
``position_ids``): a query and a key of one document attend when ``pos_q // C == pos_k // C``. With positions
restarting at 0 in every document, chunk boundaries fall at *document-relative* multiples of ``C``, exactly as
for each document run alone::

    documents  | d0: 0 1 2 3 4 5 | d1: 0 1 2 3 4 5 6 |        (C = 4)
    chunks     | 0 1 2 3 | 4 5   | 0 1 2 3 | 4 5 6   |        every chunk its own document

So a chunked layer runs the same SAP as a full layer, on the layout whose documents are the chunks
(:func:`chunk_layout`, the one rule), with the same token placement cut at those bounds (:func:`chunk_placement`):
no token moves, a rank's local tokens are the same, only the keys each part needs shrink (a key of an earlier
chunk is never sent). :func:`chunked_plan` derives that plan from a document plan once per chunk size and
caches it on the plan; its transfers and rounds are priced as any mask kind's (:func:`~.kinds.plan_kind`).
"""
from __future__ import annotations

import numpy as np

from .layout import Layout, make_layout
from .placement import Placement, _finish
from .plan import Plan
from .kinds import plan_kind

__all__ = ["chunk_layout", "chunk_placement", "chunked_plan"]


def chunk_layout(layout: Layout, chunk: int, first_positions: np.ndarray | None = None) -> Layout:
    """The documents of a chunked layer: every document cut where its position is a multiple of ``chunk``.

    Args:
        layout: the batch's documents.
        chunk: ``attention_chunk_size`` (``C >= 1``).
        first_positions: ``[n_docs]`` position of each document's first token (``None``: 0 for all, the packed
            convention; a document continuing from position ``p`` has its first bound at ``p``'s next multiple).

    Returns:
        The chunk layout (``layout`` itself when no document crosses a chunk bound).

    Raises:
        ValueError: ``chunk`` below 1, or ``first_positions`` of the wrong shape or negative.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"attention_chunk_size must be a positive int, got {chunk!r}")
    chunk = int(chunk)
    starts, lengths = layout.cu_seqlens[:-1], layout.doc_lengths  # [n_docs] each
    if first_positions is None:
        first = np.zeros_like(starts)
    else:
        first = np.asarray(first_positions, dtype=np.int64).reshape(-1)
        if first.shape != starts.shape or bool((first < 0).any()):
            raise ValueError(f"first_positions must be [{starts.shape[0]}] non-negative positions, got "
                             f"{tuple(first.shape)}")
    lead = (-first) % chunk  # offset of the first bound inside each document (0: the document start itself)
    lead = np.where(lead == 0, chunk, lead)  # the bounds strictly inside: lead, lead + C, ... < length
    n_cuts = np.where(lengths > lead, (lengths - 1 - lead) // chunk + 1, 0)  # [n_docs]
    if not n_cuts.any():
        return layout
    doc = np.repeat(np.arange(starts.shape[0]), n_cuts)
    k = np.arange(int(n_cuts.sum())) - np.repeat(np.cumsum(n_cuts) - n_cuts, n_cuts)  # [n_cuts] index within its doc
    cuts = starts[doc] + lead[doc] + k * chunk
    return make_layout(np.sort(np.concatenate([layout.cu_seqlens, cuts])))


def chunk_placement(placement: Placement, chunks: Layout) -> Placement:
    """``placement``'s segments cut at the bounds of ``chunks`` (a refinement of its layout): every part holds
    the same tokens in the same order, each segment now inside one chunk.

    Args:
        placement: a placement of the document layout. chunks: :func:`chunk_layout` of that layout.

    Returns:
        The placement over ``chunks``.
    """
    cu = chunks.cu_seqlens
    start, end = placement.start, placement.end  # [n_seg]
    lo = np.searchsorted(cu, start, side="right")  # first bound after a segment's start
    hi = np.searchsorted(cu, end, side="left")  # first bound at or after its end
    pieces = hi - lo + 1  # [n_seg] pieces of each segment (bounds strictly inside + 1)
    seg = np.repeat(np.arange(start.shape[0]), pieces)
    k = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # piece index in its segment
    first, last = k == 0, k == pieces[seg] - 1
    p_start = np.where(first, start[seg], cu[np.minimum(lo[seg] + k - 1, cu.shape[0] - 1)])
    p_end = np.where(last, end[seg], cu[np.minimum(lo[seg] + k, cu.shape[0] - 1)])
    # segments were by (part, start) and each one's pieces ascend: still by (part, start), none empty
    return _finish(placement.name, placement.n_parts, chunks.doc_of(p_start), p_start, p_end, placement.part[seg],
                   ordered=True)


def chunked_plan(plan: Plan, chunk: int, first_positions: np.ndarray | None = None) -> Plan:
    """The plan a chunked-attention layer of ``chunk`` tokens runs: ``plan`` with its chunks as documents.

    Same group and token placement (a rank's local tokens, their order and the intra slices are ``plan``'s), the
    chunk layout (:func:`chunk_layout`), and the minimal transfers of that layout cut into rounds as any mask kind
    (:func:`~.kinds.plan_kind`, ``plan``'s cost model, receive budget and rounds option). Built once per chunk
    size (and first positions) and cached on ``plan``; not bound to a process group (bind it as ``plan`` is).

    Args:
        plan: the batch's document plan. chunk: ``attention_chunk_size``.
        first_positions: ``[n_docs]`` first position of each document (``None``: 0 for all).

    Returns:
        ``plan`` itself when no document crosses a chunk bound, else the derived :class:`Plan`.
    """
    key = (int(chunk), None if first_positions is None or not np.any(np.asarray(first_positions) % chunk)
           else tuple(int(p) % int(chunk) for p in np.asarray(first_positions).reshape(-1)))
    cache = plan._chunks
    if key not in cache:
        layout = chunk_layout(plan.layout, chunk, None if key[1] is None else np.asarray(key[1]))
        if layout is plan.layout:
            cache[key] = None
        else:
            pl = chunk_placement(plan.placement, layout)
            kind = plan_kind(layout, pl, None, plan.cost, plan.recv_budget_tokens, plan.rounds_option)
            cache[key] = Plan(layout=layout, group=plan.group, placement=pl, transfers=kind.transfers,
                              pieces=kind.pieces, round_order=kind.round_order,
                              recv_budget_tokens=plan.recv_budget_tokens, cost=plan.cost,
                              rounds_option=plan.rounds_option)
    derived = cache[key]
    return plan if derived is None else derived
