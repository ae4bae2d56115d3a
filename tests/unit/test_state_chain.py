"""The hand-off chain of a recurrent layer (``hf_hsap.plan.chain``): every rank's segments, their steps and
neighbours, for random layouts and random token ownership (any subsets, not only contiguous slices)."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hf_hsap.plan.chain import document_chain, state_chain


@st.composite
def layouts(draw: st.DrawFn) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(cu_seqlens, every rank's ascending token indices)``: 1-40 tokens in 1-6 documents over 1-5 ranks."""
    lens = draw(st.lists(st.integers(1, 9), min_size=1, max_size=6))
    cu = np.concatenate([[0], np.cumsum(lens)])
    ranks = draw(st.integers(1, 5))
    owner = np.array(draw(st.lists(st.integers(0, ranks - 1), min_size=int(cu[-1]), max_size=int(cu[-1]))))
    return cu, [np.flatnonzero(owner == r) for r in range(ranks)]


@given(layouts())
def test_segments_cover_each_document_as_one_chain(case: tuple[np.ndarray, list[np.ndarray]]) -> None:
    cu, tokens = case
    chains = [state_chain(cu, tokens, r) for r in range(len(tokens))]
    runs = []  # (global start, global end, doc, step, prev, next, rank)
    for r, ch in enumerate(chains):
        covered = np.concatenate([np.arange(s.start, s.end) for s in ch.segments]) if ch.segments else np.zeros(0)
        assert covered.tolist() == list(range(len(tokens[r]))), "local tokens once each, in order"
        assert ch.total == len(tokens[r])
        for s in ch.segments:
            g = tokens[r][s.start:s.end]
            assert (np.diff(g) == 1).all() and cu[s.doc] <= g[0] and g[-1] < cu[s.doc + 1]
            assert r not in (s.prev, s.next)  # a rank's consecutive runs are one segment
            runs.append((int(g[0]), int(g[-1]) + 1, s.doc, s.step, s.prev, s.next, r))
    runs.sort()
    handoffs, traffic = 0, set()
    for doc in range(len(cu) - 1):
        mine = [x for x in runs if x[2] == doc]
        assert mine[0][0] == cu[doc] and mine[-1][1] == cu[doc + 1]
        for i, (a, b, _, step, prev, nxt, r) in enumerate(mine):
            assert step == i
            assert prev == (mine[i - 1][6] if i else -1) and nxt == (mine[i + 1][6] if i + 1 < len(mine) else -1)
            if i:
                assert mine[i - 1][1] == a  # the runs of a document are consecutive
            if nxt not in (-1, r):
                handoffs += 1
                traffic.add(step)
    steps = max(x[3] for x in runs) + 1
    for ch in chains:
        assert ch.steps == steps and ch.handoffs == handoffs
        assert [s for s in range(steps) if ch.traffic[s]] == sorted(traffic)
        assert ch.remote == bool(traffic)


def test_contiguous_slices_hand_one_state_per_cut_inside_a_document() -> None:
    cu = np.array([0, 6, 8, 13])  # documents of 6, 2, 5 tokens; ranks hold 0-3, 4-8, 9-12
    tokens = [np.arange(0, 4), np.arange(4, 9), np.arange(9, 13)]
    chains = [state_chain(cu, tokens, r) for r in range(3)]
    assert [(s.start, s.end, s.doc, s.step, s.prev, s.next) for s in chains[1].segments] == [
        (0, 2, 0, 1, 0, -1), (2, 4, 1, 0, -1, -1), (4, 5, 2, 0, -1, 2)]
    assert chains[0].handoffs == 2 and chains[0].steps == 2 and chains[0].traffic == (True, False)


def test_document_chain_is_every_document_from_the_zero_state() -> None:
    ch = document_chain([0, 3, 4, 9])
    assert [(s.start, s.end, s.step, s.prev, s.next) for s in ch.segments] == [
        (0, 3, 0, -1, -1), (3, 4, 0, -1, -1), (4, 9, 0, -1, -1)]
    assert not ch.remote and ch.total == 9
