"""The batched least-loaded placement (``hf_hsap.plan.lpt``) makes the heap's choices exactly: the same part for
every document, the same figures and the same cuts where a document has no room, ties and tight caps included."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import ci_examples, cu_of
from hf_hsap.plan.density import _least_loaded, _least_loaded_batched, density_figures
from hf_hsap.plan.layout import make_layout
from hf_hsap.plan.lpt import least_loaded_batch
from hf_hsap.plan.placement import token_cap


@settings(max_examples=ci_examples(200), deadline=None)
@given(lengths=st.one_of(st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=60),  # ties everywhere
                         st.lists(st.one_of(st.integers(1, 40), st.sampled_from([8, 16]), st.integers(100, 3000)),
                                  min_size=1, max_size=300)),
       P=st.integers(1, 70), token_cost=st.sampled_from([0.0, 1.0, 17930.0]), slack=st.sampled_from([0.0, 0.01, 0.1]),
       preload=st.booleans(), data=st.data())
def test_the_batches_choose_what_the_heap_chooses(lengths, P, token_cost, slack, preload, data):
    layout = make_layout(cu_of(lengths))
    T = layout.total_tokens
    if T < P:
        return
    fig = density_figures(layout, token_cost)
    cap = token_cap(T, P, slack)
    first = data.draw(st.integers(0, len(lengths) - 1)) if preload else 0  # the heavier ones placed already, unevenly
    tok = [0.0] * P
    for d in fig.order[:first]:  # their tokens on random parts, none above the cap (room is left for the rest)
        left, p = fig.lens[d], data.draw(st.integers(0, P - 1))
        while left:
            take = min(left, int(cap - tok[p]))
            tok[p], left, p = tok[p] + take, left - take, (p + 1) % P
    wrk = [t * data.draw(st.sampled_from([0.0, 0.5, 100.0])) for t in tok]
    docs = fig.order[first:]
    runs = []
    for batched in (False, True):
        t, w, segs = list(tok), list(wrk), ([], [], [], [])
        if batched:
            out = _least_loaded_batched(docs, first, fig, P, cap, t, w, *segs)
        else:
            out = _least_loaded(docs, fig.lens_by_order[first:], fig.pairs_by_order[first:], fig.cu, P, token_cost, cap,
                                t, w, *segs)
        runs.append((out, t, w, segs))
    assert runs[0] == runs[1]


def test_a_tie_stops_a_batch_and_goes_to_the_lower_index():
    # parts of load 0 and 2, documents of load 2: the first goes to part 0, which then ties part 1 at 2; the heap
    # takes the lower index, part 0 again (a batch that took part 1 next would be wrong)
    tok, wrk = np.zeros(2), np.array([0.0, 2.0])
    out = np.full(3, -1, dtype=np.int64)
    assert least_loaded_batch(np.zeros(3), np.full(3, 2.0), 1.0, 10.0, tok, wrk, out) == 3
    assert out.tolist() == [0, 0, 1] and wrk.tolist() == [4.0, 4.0]


def test_a_document_without_room_stops_the_batch_there():
    tok, wrk = np.array([0.0, 5.0]), np.array([0.0, 0.0])
    out = np.full(3, -1, dtype=np.int64)
    # the first goes to part 0 (6 tokens), the second's least-loaded part is then part 1 (5 + 6 > 10): stop at it
    assert least_loaded_batch(np.array([6.0, 6.0, 1.0]), np.zeros(3), 1.0, 10.0, tok, wrk, out) == 1
    assert out.tolist() == [0, -1, -1] and tok.tolist() == [6.0, 5.0]
