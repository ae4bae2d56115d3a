"""Round orders, per-round remote work and the dataflow simulations of :mod:`hf_hsap.plan.pipeline`."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import ci_examples

import hf_hsap
from hf_hsap.plan.pipeline import (PipelineShape, backward_steps, forward_steps, pipeline_shape, simulate_layers,
                                   simulate_steps)
from hf_hsap.plan.rounds import piece_remote_work, round_tables, split_rounds


def simulate_forward(local: np.ndarray, xfer: np.ndarray, work: np.ndarray, peers: np.ndarray,
                     eager: bool = True) -> np.ndarray:
    """``[R]`` finish time of every part's forward (arrays as ``simulate_steps``); ``eager``: every round posted at
    once, else double-buffered."""
    n = xfer.shape[1]
    shape = PipelineShape(n, n if eager else 1, False, max(n, 1))
    return simulate_steps(forward_steps(shape), local, xfer, work, peers)


def simulate_backward(local: np.ndarray, xfer: np.ndarray, work: np.ndarray, peers: np.ndarray,
                      ret: np.ndarray, refetch: bool) -> np.ndarray:
    """``[R]`` finish time of every part's backward (arrays as ``simulate_steps``); ``refetch``: the KV is fetched
    again and one return travels at a time, else kept buffers, every return collected at the end."""
    n = xfer.shape[1]
    shape = PipelineShape(n, 1, refetch, 1 if refetch else max(n, 1))
    return simulate_steps(backward_steps(shape), local, xfer, work, peers, ret)


def _plan(lengths, P, placement="zigzag", U=1):
    cu = np.concatenate([[0], np.cumsum(lengths)])
    return hf_hsap.plan_sequence(cu, P, placement, ulysses_size=U, rounds="batched")


def _rows(pieces):
    """Multiset of (dst, src, global token) rows a set of pieces moves."""
    out = []
    for d, s, a, b in zip(pieces.dst, pieces.src, pieces.start, pieces.end):
        out += [(int(d), int(s), t) for t in range(int(a), int(b))]
    return sorted(out)


@settings(max_examples=ci_examples(60))
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=8), P=st.integers(2, 6),
       placement=st.sampled_from(["zigzag", "balanced", "contiguous"]), budget=st.sampled_from([None, 1, 5, 17]))
def test_orders_move_the_same_rows(lengths, P, placement, budget):
    if sum(lengths) < P:
        lengths = lengths + [P]
    plan = _plan(lengths, P, placement)
    tr, R = plan.transfers, plan.n_parts
    batched = split_rounds(tr, R, budget, "batched")
    by_peer = split_rounds(tr, R, budget, "by_peer")
    assert _rows(batched) == _rows(by_peer) == _rows(split_rounds(tr, R, None, "batched"))
    for pieces in (batched, by_peer):
        n = pieces.end - pieces.start
        assert (n > 0).all()
        if pieces.round.shape[0]:
            used = np.unique(pieces.round)
            assert used.tolist() == list(range(len(used))), "rounds are numbered densely"
        if budget is not None:
            for t in np.unique(pieces.round):
                m = pieces.round == t
                assert np.bincount(pieces.dst[m], weights=n[m]).max() <= budget
                assert np.bincount(pieces.src[m], weights=n[m]).max() <= budget
    # by_peer: one ring distance per round, so one sender per receiver and one receiver per sender
    for t in np.unique(by_peer.round):
        m = by_peer.round == t
        pairs = set(zip(by_peer.dst[m].tolist(), by_peer.src[m].tolist()))
        assert len({d for d, _ in pairs}) == len(pairs) == len({s for _, s in pairs})
        assert len({(d - s) % R for d, s in pairs}) == 1


@settings(max_examples=ci_examples(60))
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=8), P=st.integers(2, 6),
       placement=st.sampled_from(["zigzag", "balanced", "contiguous"]), order=st.sampled_from(["batched", "by_peer"]))
def test_remote_work_per_round_sums_to_the_plan(lengths, P, placement, order):
    """Per-round remote pairs add up to the plan's attention work minus its local work, per part, and
    equal brute force over the pieces."""
    if sum(lengths) < P:
        lengths = lengths + [P]
    plan = _plan(lengths, P, placement)
    pieces = split_rounds(plan.transfers, plan.n_parts, 7, order)
    work = piece_remote_work(plan.layout, plan.placement, pieces)
    st_ = plan.stats()
    rwork = round_tables(pieces, work, plan.n_parts).remote_work
    expect = np.array(st_.attn_work, dtype=float) - np.array(st_.local_attn_work, dtype=float)
    assert np.allclose(rwork.sum(1), expect)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    doc = np.searchsorted(cu, np.arange(cu[-1]), side="right") - 1
    owner = np.empty(cu[-1], dtype=int)
    for r in range(plan.n_parts):
        owner[plan.part_token_indices(r)] = r
    for i in range(pieces.start.shape[0]):  # brute force: receiver queries that see the piece
        a, b, d = pieces.start[i], pieces.end[i], pieces.dst[i]
        q = np.nonzero((owner == d) & (doc == doc[a]) & (np.arange(cu[-1]) >= b))[0]
        assert work[i] == (b - a) * q.shape[0]


def test_simulations_by_hand():
    """Two parts; part 1 receives 3 s of KV from part 0 in one batched round."""
    local = np.array([5.0, 1.0])
    xfer = np.array([[0.0], [3.0]])
    work = np.array([[0.0], [4.0]])
    peers = np.zeros((1, 2, 2), dtype=bool)
    peers[0, 1, 0] = True
    assert simulate_forward(local, xfer, work, peers).tolist() == [5.0, 7.0]  # max(1, 3) + 4
    # backward: part 1 computes 4, returns 2 s of dK/dV to part 0 (which computes its local 5 meanwhile)
    ret = np.array([[2.0], [0.0]])
    assert simulate_backward(local, xfer, work, peers, ret, refetch=False).tolist() == [6.0, 5.0]
    # refetch: part 1 waits for the KV first (3), then 4 of work, then its local 1
    assert simulate_backward(local, xfer, work, peers, ret, refetch=True).tolist() == [9.0, 8.0]


def test_consecutive_layers_charge_a_lag_once():
    """Part 1 receives part 0's KV; part 0 reaches its rounds at 10 (its projections before them), part 1 at 1.
    One layer that both start at once makes part 1 wait for the KV and then compute: 11.5. Layers run back to
    back, part 1 keeps pace with part 0 (11 per layer, its sender's own time) and never pays the wait again;
    with no transfer every part advances by its own work alone, and a start offsets the one-layer clocks."""
    local = np.array([1.0, 1.0])
    xfer = np.array([[0.0], [0.5]])
    work = np.array([[0.0], [1.0]])
    peers = np.zeros((1, 2, 2), dtype=bool)
    peers[0, 1, 0] = True
    before, after = np.array([10.0, 1.0]), np.zeros(2)
    steps = forward_steps(pipeline_shape(1, False))
    assert simulate_steps(steps, local, xfer, work, peers, start=before).tolist() == [11.0, 11.5]
    assert simulate_layers(steps, local, xfer, work, peers, None, before=before, after=after).tolist() == [11.0, 11.0]
    alone = simulate_layers(steps, local, np.zeros((2, 1)), work, np.zeros_like(peers), None, before=before,
                            after=after + 2)
    assert alone.tolist() == [13.0, 5.0]  # before + local + work + after of each part


def test_pipelining_hides_a_long_transfer():
    """One receiver fed by 3 peers, each round's transfer as long as each round's work: batched waits for
    everything, by_peer overlaps later transfers with this round's work (posted at once or double-buffered)."""
    R, n = 4, 3
    peers = np.zeros((n, R, R), dtype=bool)
    for t in range(n):
        peers[t, 0, 3 - t] = True
    xfer = np.zeros((R, n))
    xfer[0] = 2.0
    work = np.zeros((R, n))
    work[0] = 2.0
    local = np.zeros(R)
    eager = simulate_forward(local, xfer, work, peers)[0]  # rounds land at 2, 4, 6; work ends at 8
    double = simulate_forward(local, xfer, work, peers, eager=False)[0]  # round t+1 posted when t landed
    one = simulate_forward(local, xfer.sum(1, keepdims=True), work.sum(1, keepdims=True), peers.any(0)[None])[0]
    assert eager == 8.0 and double == 8.0 and one == 12.0


def test_eager_posting_avoids_a_slow_peer_stall():
    """Part 0 receives from part 2, then from part 1; part 1 runs a long local item before it waits for its
    own round 0, and with double buffering posts its round 1 only then: part 0 stalls. Posted at once,
    nothing waits for compute."""
    R, n = 3, 2
    peers = np.zeros((n, R, R), dtype=bool)
    peers[0, 0, 2], peers[1, 0, 1] = True, True  # round 0: 2 -> 0, round 1: 1 -> 0
    peers[0, 1, 0] = True  # part 1 first receives from part 0 (it posts round 1 only after that)
    xfer = np.zeros((R, n))
    xfer[0] = [1.0, 1.0]
    xfer[1, 0] = 1.0
    work = np.zeros((R, n))
    local = np.array([0.0, 10.0, 0.0])  # part 1 reaches its rounds at time 10
    assert simulate_forward(local, xfer, work, peers, eager=False)[0] == 11.0  # waits for part 1 to post
    assert simulate_forward(local, xfer, work, peers, eager=True)[0] == 2.0


def test_round_orders_validated():
    with pytest.raises(ValueError, match="unknown rounds"):
        hf_hsap.plan_sequence([0, 10], 2, rounds="eager")
    plan = _plan([40, 3, 30], 4)
    with pytest.raises(ValueError, match="unknown round order"):
        split_rounds(plan.transfers, 4, None, "ring")


def test_auto_picks_by_peer_when_transfers_dominate():
    """One long document over 8 parts with a network-priced KV 10x heavier than the default: by_peer."""
    heavy = hf_hsap.CostModel(token_cost=17930.0, kv_token_cost=12260.0, round_cost=120000.0)
    plan = hf_hsap.plan_sequence([0, 65536], 8, cost=heavy)
    assert plan.round_order == "by_peer"
    assert hf_hsap.plan_sequence([0, 65536], 8, rounds="batched", cost=heavy).round_order == "batched"
    # short documents, nothing split: one (empty) batched round
    assert hf_hsap.plan_sequence(np.arange(0, 65537, 512), 8).round_order == "batched"
