"""The runs of a recurrent layer's split documents (``hf_hsap.plan.chain``): every rank's segments, their place in
their document and the holders of the runs before and after, and the one summary exchange they imply, for random
layouts and random token ownership (any subsets, not only contiguous slices)."""
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
def test_segments_cover_each_document_as_ordered_runs(case: tuple[np.ndarray, list[np.ndarray]]) -> None:
    cu, tokens = case
    chains = [state_chain(cu, tokens, r) for r in range(len(tokens))]
    runs = []  # (global start, global end, doc, run, earlier, later, rank)
    for r, ch in enumerate(chains):
        covered = np.concatenate([np.arange(s.start, s.end) for s in ch.segments]) if ch.segments else np.zeros(0)
        assert covered.tolist() == list(range(len(tokens[r]))), "local tokens once each, in order"
        assert ch.total == len(tokens[r])
        for s in ch.segments:
            g = tokens[r][s.start:s.end]
            assert (np.diff(g) == 1).all() and cu[s.doc] <= g[0] and g[-1] < cu[s.doc + 1]
            runs.append((int(g[0]), int(g[-1]) + 1, s.doc, s.run, s.earlier, s.later, r))
    runs.sort()
    summaries, sends, receives = 0, set(), set()
    for doc in range(len(cu) - 1):
        mine = [x for x in runs if x[2] == doc]
        assert mine[0][0] == cu[doc] and mine[-1][1] == cu[doc + 1]
        holders = [x[6] for x in mine]
        for i, (a, b, _, run, earlier, later, r) in enumerate(mine):
            assert run == i and earlier == tuple(holders[:i]) and later == tuple(holders[i + 1:])
            if i:
                assert mine[i - 1][1] == a and holders[i - 1] != r  # consecutive runs, on two ranks
            for p in set(later) - {r}:  # a summary to every other rank holding a later run
                summaries += 1
                sends.add((r, p, doc, i))
            for j, p in enumerate(earlier):
                if p != r:
                    receives.add((p, r, doc, j))
    assert sends == receives  # every summary sent is received once, by the rank that folds it
    for r, ch in enumerate(chains):
        assert ch.summaries == summaries and ch.remote == bool(summaries)
        assert ch.sends() == sorted((p, d, j) for s, p, d, j in sends if s == r)
        assert ch.receives() == sorted((s, d, j) for s, p, d, j in receives if p == r)


def test_contiguous_slices_send_each_cut_document_to_its_later_holders() -> None:
    cu = np.array([0, 6, 8, 13])  # documents of 6, 2, 5 tokens; ranks hold 0-3, 4-8, 9-12
    tokens = [np.arange(0, 4), np.arange(4, 9), np.arange(9, 13)]
    chains = [state_chain(cu, tokens, r) for r in range(3)]
    assert [(s.start, s.end, s.doc, s.run, s.earlier, s.later) for s in chains[1].segments] == [
        (0, 2, 0, 1, (0,), ()), (2, 4, 1, 0, (), ()), (4, 5, 2, 0, (), (2,))]
    assert chains[0].summaries == 2 and chains[0].sends() == [(1, 0, 0)] and chains[2].receives() == [(1, 2, 0)]


def test_a_document_over_every_rank_reaches_every_later_rank_in_one_exchange() -> None:
    cu = np.array([0, 12])
    tokens = [np.arange(3 * r, 3 * r + 3) for r in range(4)]
    chains = [state_chain(cu, tokens, r) for r in range(4)]
    assert chains[0].sends() == [(1, 0, 0), (2, 0, 0), (3, 0, 0)]
    assert chains[3].receives() == [(0, 0, 0), (1, 0, 1), (2, 0, 2)]
    assert chains[0].summaries == 6  # P (P - 1) / 2 summaries, all in one exchange


def test_document_chain_is_every_document_from_the_zero_state() -> None:
    ch = document_chain([0, 3, 4, 9])
    assert [(s.start, s.end, s.run, s.earlier, s.later) for s in ch.segments] == [
        (0, 3, 0, (), ()), (3, 4, 0, (), ()), (4, 9, 0, (), ())]
    assert not ch.remote and ch.total == 9
