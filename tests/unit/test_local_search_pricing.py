"""The search's incremental pricing (hf_hsap.plan.local_search._Part): a part's time with one document's rows dropped or
added, re-priced from that document alone, equals the part priced from scratch with its new segments, exactly
(the search compares these times; the shortcuts for one segment and for a document the part does not hold are
where it could drift)."""
from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import ci_examples
from hf_hsap.plan.cost import CostModel
from hf_hsap.plan.local_search import _doc_terms, _Part

DOC_START = [0, 1000, 3000, 3500]  # four documents of 1000, 2000, 500 and 1500 tokens
DOC_LEN = [1000, 2000, 500, 1500]
COSTS = [CostModel.for_link("network"), CostModel.for_link("nvlink"),
         dataclasses.replace(CostModel.for_link("network"), diag_block=128, overlap=0.5)]


def _scratch(segs, cost) -> float:
    """A part's time from its segments, summed here document by document (the model's terms written out: tokens,
    pairs, pairs against its own keys, keys before its last row that it does not hold; diagonal blocks masked)."""
    total = [0, 0.0, 0.0, 0]
    for d in {d for d, _, _ in segs}:
        tokens, work, local, last = 0, 0, 0, 0
        for _, a, b in sorted(x for x in segs if x[0] == d):
            a, b = a - DOC_START[d], b - DOC_START[d]
            n = b - a
            work += sum(range(a + 1, b + 1))  # row r attends to r + 1 keys
            local += n * (n + 1) // 2 + n * tokens
            tokens, last = tokens + n, b
        masked = float(cost.masked_pairs(tokens)) if cost.diag_block else 0.0
        for j, v in enumerate((tokens, work + masked, local + masked, last - tokens)):
            total[j] += v
    return float(cost.time_of(*total))


@st.composite
def _segments(draw):
    """A part's segments (disjoint ranges of each document, global positions) and one range of a document to add
    that overlaps none of them."""
    segs, free = [], []
    for d, (s0, n) in enumerate(zip(DOC_START, DOC_LEN)):
        cuts = sorted(set(draw(st.lists(st.integers(0, n), min_size=2, max_size=8))))
        for a, b in zip(cuts, cuts[1:]):
            (segs if draw(st.booleans()) else free).append((d, s0 + a, s0 + b))
    return segs, free


@settings(max_examples=ci_examples(200), deadline=None)
@given(_segments(), st.data(), st.sampled_from(range(len(COSTS))))
def test_a_move_is_priced_as_the_part_from_scratch(parts, data, c):
    cost = COSTS[c]
    segs, free = parts
    part = _Part(list(segs), DOC_START, cost)
    if segs:  # drop one segment, keep a head or tail of it (the giving side of a move)
        i = data.draw(st.integers(0, len(segs) - 1))
        d, a, b = segs[i]
        cut = data.draw(st.integers(a, b))
        kept = data.draw(st.sampled_from([None, (d, a, cut), (d, cut, b)]))
        kept = None if kept is None or kept[1] == kept[2] else kept
        after = segs[:i] + segs[i + 1:] + ([kept] if kept else [])
        o = DOC_START[d]
        got = part.time_with(d, (a - o, b - o), None if kept is None else (kept[1] - o, kept[2] - o), cost)
        assert got == _Part(after, DOC_START, cost).time == _scratch(after, cost)
    if free:  # add a free range (the receiving side): to a document it holds, or one it does not
        d, a, b = data.draw(st.sampled_from(free))
        o = DOC_START[d]
        want = _Part(list(segs) + [(d, a, b)], DOC_START, cost).time
        assert want == _scratch(list(segs) + [(d, a, b)], cost)
        assert part.time_with(d, None, (a - o, b - o), cost) == want
        if d not in part.rows:
            assert part.time_plus(_doc_terms([(a - o, b - o)], cost), cost) == want
