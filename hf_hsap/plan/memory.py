"""Activation memory of one attention layer's step under a plan (pure, offline): what the per-batch Ulysses degree
weighs beside time.

The unit is one token of one head (``head_dim`` elements of the activations' dtype): multiply by ``head_dim *
element size`` for bytes. Per rank, the peak of the tensors one forward + backward adds to its inputs, modelled
from the tensors the runtime holds at that peak:

* **own tokens** (``t`` = the part's tokens over ``U``, a rank's share): the output and ``dQ`` (``OWN_Q`` per query
  head), the ``dK|dV`` accumulators and the ``K|V`` rows the sends gather (``OWN_KV`` per key/value head);
* **SAP's receive side**: without a receive budget every round's ``K|V`` buffer is kept for the backward and gets
  a gradient (``RECV`` = 2 halves x (buffer + gradient) per received token and key/value head), and the
  ``dK|dV`` partial sums of every row this rank sent come back (``SEND`` = 2 per sent token); with a budget the
  rounds are double-buffered (two buffers, one gradient, two returning messages of the largest round);
* **the all-to-all** (``U > 1``): the head-sharded copies of q, k, v and the output, and their gradients'
  (``A2A_Q`` per query head, ``A2A_KV`` per key/value head of a rank's own tokens).

Key/value heads are those a rank holds: ``lcm(Hkv, U) / U`` (repeated when ``U`` does not divide them, as
:func:`hf_hsap.hsap_attn_func` does). The constants are the tensors named above, rounded to a least-squares fit of the
exact peak of the allocated tensors (``benchmarks/tensor_memory.py``) over 96 ranks x degrees of CPU rows (long-tail,
one document, SFT, mixed; 8 and 2 kv heads; within -14 % / +6 % of it);
``tests/distributed/test_degree_memory_measured.py`` holds the model's ranking of degrees to the measurement.
"""
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
    """The three terms of :func:`attention_memory` per part (module docstring), in tokens x heads per rank.

    Args:
        part_tokens: ``[R]`` tokens of each part. pieces: the plan's round pieces. budgeted: the plan has a receive
        budget (double-buffered rounds). U: the Ulysses degree. q_heads, kv_heads: the model's heads.

    Returns:
        ``(own, all_to_all, receive_side)``, each ``[R]``.
    """
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
    """Modelled peak activation memory of one attention layer's forward + backward, per part (module docstring):
    the sum of :func:`memory_terms`.

    Returns:
        ``[R]`` per rank of each part, in tokens x heads (``head_dim`` elements each).
    """
    own, a2a, kv = memory_terms(part_tokens, pieces, budgeted, U, q_heads, kv_heads)
    return own + a2a + kv


def plan_memory(plan: "Plan", q_heads: int, kv_heads: int) -> float:
    """The largest rank's :func:`attention_memory` under ``plan``, over its mask kinds (tokens x heads).

    Args:
        plan: a plan (any degree). q_heads, kv_heads: the model's heads.

    Returns:
        The modelled peak of the rank that needs the most.
    """
    tokens = plan.placement.tokens_per_part()
    budgeted = plan.recv_budget_tokens is not None
    return max(float(attention_memory(tokens, plan.kind(w).pieces, budgeted, plan.ulysses_size, q_heads,
                                      kv_heads).max()) for w in plan.windows)
