"""Activation memory of one attention layer's step under a plan: what the per-batch Ulysses degree weighs beside time.
Unit: a token of a head (``head_dim`` elements). Per rank, the peak a forward + backward adds, from the tensors held
then (own tokens', SAP's receive side, the all-to-all's head shards), fitted to ``benchmarks/tensor_memory.py``."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from .rounds import RoundPieces, round_tables

if TYPE_CHECKING:
    from .plan import Plan

OWN_Q = 2.0  # the output and dQ
OWN_KV = 3.0  # dK|dV accumulators and the K|V send rows
RECV = 4.0  # K|V receive buffer and its gradient
SEND = 2.0  # the dK|dV partial sums returning for the rows this rank sent
A2A_Q = 3.5  # head-sharded q, output and their gradients, and the sequence-sharded output's copy
A2A_KV = 1.5  # head-sharded k, v and their gradients beside the inputs


def kv_heads_held(kv_heads: int, U: int) -> int:
    """Key/value heads of a part after the all-to-all's repetition: ``lcm(Hkv, U)`` (``Hkv`` when ``U`` divides it)."""
    return kv_heads if kv_heads % U == 0 else math.lcm(kv_heads, U)


def memory_terms(part_tokens: np.ndarray, pieces: RoundPieces, budgeted: bool, U: int, q_heads: int,
                 kv_heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(own, all_to_all, receive_side)`` of :func:`attention_memory`, each ``[R]``, from ``[R]`` ``part_tokens``;
    ``budgeted``: whether the plan has a receive budget (double-buffered rounds)."""
    R = len(part_tokens)
    hkv = kv_heads_held(kv_heads, U)
    tab = round_tables(pieces, np.zeros(len(pieces)), R)  # only its [R, rounds] KV tokens received and sent
    recv, sent = tab.recv, tab.sent
    if budgeted and pieces.n_rounds > 1:  # two buffers and one gradient in flight, two returning messages
        kv = 1.5 * RECV * recv.max(axis=1) + 2 * SEND * sent.max(axis=1)
    else:  # every buffer kept for the backward
        kv = RECV * recv.sum(axis=1) + SEND * sent.sum(axis=1)
    t = np.asarray(part_tokens, dtype=np.float64) / U  # [R] a rank's share of its part
    own = t * (OWN_Q * q_heads + OWN_KV * hkv)
    a2a = t * (A2A_Q * q_heads + A2A_KV * hkv) if U > 1 else np.zeros(R)
    return own, a2a, kv * hkv / U


def attention_memory(part_tokens: np.ndarray, pieces: RoundPieces, budgeted: bool, U: int, q_heads: int,
                     kv_heads: int) -> np.ndarray:
    """``[R]`` modelled peak activation memory of a rank of each part (tokens x heads): :func:`memory_terms`' sum."""
    own, a2a, kv = memory_terms(part_tokens, pieces, budgeted, U, q_heads, kv_heads)
    return own + a2a + kv


def plan_memory(plan: "Plan", q_heads: int, kv_heads: int) -> float:
    """The largest rank's :func:`attention_memory` under ``plan`` (any degree) over its mask kinds."""
    tokens = plan.placement.tokens_per_part()
    budgeted = plan.recv_budget_tokens is not None
    return max(float(attention_memory(tokens, plan.kind(w).pieces, budgeted, plan.ulysses_size, q_heads,
                                      kv_heads).max()) for w in plan.windows)
