"""The work refinement of the ``balanced`` placement (``hf_hsap.plan.refine``): token-neutral exchanges,
and slides priced by a cost model's token cost."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import hf_hsap.plan.balanced as balanced_mod
import hf_hsap.plan.greedy as greedy_mod
from helpers import assert_covers_once, ci_examples
from hf_hsap.plan.layout import make_layout
from hf_hsap.plan.refine import refine_moves
from hf_hsap.plan.segments import Segments


def _placements(lengths: list[int], P: int, slack: float, token_cost: float | None = None):
    """The balanced placement with and without the refinement."""
    layout = make_layout(np.concatenate([[0], np.cumsum(lengths)]))
    on = balanced_mod.balanced(layout, P, token_slack=slack, token_cost=token_cost)
    real = greedy_mod.refine_moves  # what refines every greedy pass (Greedy.placement)
    greedy_mod.refine_moves = lambda *a, **k: 0
    try:
        off = balanced_mod.balanced(layout, P, token_slack=slack, token_cost=token_cost)
    finally:
        greedy_mod.refine_moves = real
    return layout, on, off


@settings(max_examples=ci_examples(60))
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=40), st.integers(2, 12), st.sampled_from([0.0, 0.01, 0.03]))
def test_refinement_keeps_tokens_and_never_raises_the_peak(lengths: list[int], P: int, slack: float) -> None:
    layout, on, off = _placements(lengths, P, slack)
    # every token exactly once, each segment inside one document
    cover = np.zeros(layout.total_tokens, dtype=np.int64)
    for s, e, d in zip(on.start, on.end, on.doc):
        assert layout.cu_seqlens[d] <= s < e <= layout.cu_seqlens[d + 1]
        cover[s:e] += 1
    assert (cover == 1).all()
    assert np.array_equal(on.tokens_per_part(), off.tokens_per_part())
    assert set(zip(on.part.tolist(), on.doc.tolist())) == set(zip(off.part.tolist(), off.doc.tolist()))
    assert len(on.doc) == len(off.doc)
    assert on.work_per_part(layout).max() <= off.work_per_part(layout).max()


def test_refinement_evens_out_a_dual_chunk_split() -> None:
    """Two parts share one document in a dual-chunk split (p: chunks 0 and 3, q: chunks 1 and 2) and
    p also holds a whole document: p hands late rows to q for early ones until the work is even."""
    doc_first = [0, 400]
    seg_doc, seg_start, seg_end, seg_part = [0, 0, 0, 0, 1], [0, 100, 200, 300, 400], [100, 200, 300, 400, 440], \
        [0, 1, 1, 0, 0]
    work = lambda a, b, s0: ((b - s0) * (b - s0 + 1) - (a - s0) * (a - s0 + 1)) // 2  # noqa: E731
    wrk = [0.0, 0.0]
    for d, a, b, p in zip(seg_doc, seg_start, seg_end, seg_part):
        wrk[p] += work(a, b, doc_first[d])
    before = list(wrk)
    segs = Segments(seg_doc, seg_start, seg_end, seg_part)  # the lists above, moved in place
    moves = refine_moves(doc_first, segs, wrk, max_moves=10)
    assert moves >= 1
    recomputed = [0.0, 0.0]
    for d, a, b, p in zip(seg_doc, seg_start, seg_end, seg_part):
        recomputed[p] += work(a, b, doc_first[d])
    assert recomputed == wrk  # the running totals are exact
    tokens = [sum(b - a for a, b, p in zip(seg_start, seg_end, seg_part) if p == part) for part in (0, 1)]
    assert tokens == [240, 200]
    assert max(wrk) < max(before) and abs(wrk[0] - wrk[1]) <= 400  # within one exchange step of even


def test_refinement_balances_the_cpu_benchmark_layout() -> None:
    """The measured CPU layout (longtail, T = 16384, seed 0) at P = 4: 3 % imbalance before, none after."""
    lengths = [2504, 1657, 5706, 2422, 869, 3226]
    layout, on, off = _placements(lengths, 4, 0.01)
    w_on, w_off = on.work_per_part(layout), off.work_per_part(layout)
    assert w_off.max() / w_off.mean() > 1.02
    assert w_on.max() / w_on.mean() < 1.005


@settings(max_examples=ci_examples(60))
@given(st.lists(st.integers(1, 3000), min_size=1, max_size=40), st.integers(2, 12), st.sampled_from([0.0, 0.01, 0.03]),
       st.sampled_from([0.0, 50.0, 2000.0]))
def test_priced_refinement_lowers_the_load_within_the_token_cap(lengths: list[int], P: int, slack: float,
                                                                 token_cost: float) -> None:
    layout, on, off = _placements(lengths, P, slack, token_cost)
    assert_covers_once(layout, on)
    cap = np.ceil(layout.total_tokens / P) * (1 + slack)
    t_on, t_off = on.tokens_per_part(), off.tokens_per_part()
    assert (t_on <= np.maximum(cap, t_off)).all()  # a slide never takes a part above the cap
    assert set(zip(on.part.tolist(), on.doc.tolist())) == set(zip(off.part.tolist(), off.doc.tolist()))
    assert len(on.doc) == len(off.doc)
    load_on = on.work_per_part(layout) + token_cost * t_on
    load_off = off.work_per_part(layout) + token_cost * t_off
    assert load_on.max() <= load_off.max() + 1e-6 * load_off.max()


def test_a_slide_reaches_a_neighbour_across_one_boundary() -> None:
    """Part 0 holds the first half of a document and a whole one; part 1 holds the second half and has
    free tokens under the cap. No exchange is possible (one shared boundary), but part 0 can slide the
    boundary: it hands its last rows of the document (and their tokens) to part 1 until the loads
    ``work + token_cost * tokens`` are even. Running totals stay exact."""
    doc_first = [0, 400]
    seg_doc, seg_start, seg_end, seg_part = [0, 0, 1], [0, 200, 400], [200, 400, 800], [0, 1, 0]
    work = lambda a, b, s0: ((b - s0) * (b - s0 + 1) - (a - s0) * (a - s0 + 1)) // 2  # noqa: E731
    wrk, tok = [0.0, 0.0], [0.0, 0.0]
    for d, a, b, p in zip(seg_doc, seg_start, seg_end, seg_part):
        wrk[p] += work(a, b, doc_first[d])
        tok[p] += b - a
    token_cost = 100.0
    load_before = [w + token_cost * t for w, t in zip(wrk, tok)]
    segs = Segments(seg_doc, seg_start, seg_end, seg_part)  # the lists above, moved in place
    assert refine_moves(doc_first, segs, list(wrk), 10) == 0  # token-neutral
    moves = refine_moves(doc_first, segs, wrk, 10, tok=tok, token_cost=token_cost, cap_t=400)
    assert moves >= 1
    recomputed_w, recomputed_t = [0.0, 0.0], [0.0, 0.0]
    for d, a, b, p in zip(seg_doc, seg_start, seg_end, seg_part):
        recomputed_w[p] += work(a, b, doc_first[d])
        recomputed_t[p] += b - a
    assert recomputed_w == wrk and recomputed_t == tok  # the running totals are exact
    assert tok[1] <= 400 and seg_end[0] == seg_start[1] < 200  # part 1 took part 0's last rows, within the cap
    load = [w + token_cost * t for w, t in zip(wrk, tok)]
    assert max(load) < max(load_before)
    if tok[1] < 400:  # not stopped by the cap: even within one row (a row there carries < 300 load)
        assert abs(load[0] - load[1]) <= 2 * (200 + token_cost)


def test_a_slide_far_from_the_document_start_is_sized_exactly() -> None:
    """The work of rows given away near a document's start grows quadratically with their number; the
    slide is sized by bisection, not a linear guess, so a large gap is still evened out. A caller's
    default (infinite) token cap is fine."""
    from hf_hsap.plan.placement import rows_work

    doc_first = [0, 2000]  # document 0 (2000 rows): part 1 holds [0, 100), part 0 [100, 2000); doc 1 on part 1
    seg_doc, seg_start, seg_end, seg_part = [0, 0, 1], [0, 100, 2000], [100, 2000, 3000], [1, 0, 1]
    wrk = [float(rows_work(100, 2000)), float(rows_work(0, 100) + rows_work(0, 1000))]
    tok = [1900.0, 1100.0]
    before = max(wrk)
    segs = Segments(seg_doc, seg_start, seg_end, seg_part)  # the lists above, moved in place
    assert refine_moves(doc_first, segs, wrk, 10, tok=tok, token_cost=0.0) >= 1
    assert max(wrk) < 0.65 * before and abs(wrk[0] - wrk[1]) < 2500  # even within about one row (~1224 pairs)
    assert tok == [2000.0 - seg_end[0], seg_end[0] + 1000.0]


@settings(max_examples=ci_examples(200))
@given(st.integers(1, 10**6), st.booleans(), st.sampled_from([0.0, 102.0, 17930.0]), st.integers(1, 10**5),
       st.floats(0.0, 1e13))
def test_the_slide_length_is_the_binary_search_one(pos: int, left: bool, token_cost: float, x_max: int,
                                                    limit: float) -> None:
    """_best_slide's largest x within half the gap, on the delta the refinement uses, is the bisection's over
    rows_work (the closed form written out)."""
    from hf_hsap.plan.placement import rows_work
    from hf_hsap.plan.refine import _largest_within, _slide_delta

    x_max = min(x_max, pos) if left else x_max  # a slide never gives more rows than lie below the boundary
    delta = (lambda x: rows_work(pos - x, pos) + token_cost * x) if left else \
        (lambda x: rows_work(pos, pos + x) + token_cost * x)
    lo, hi = 1, x_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if delta(mid) <= limit else (lo, mid - 1)
    assert _largest_within(_slide_delta(pos, left, token_cost), x_max, limit) == lo


def test_two_token_costs_that_refine_alike_share_one_placement() -> None:
    """A pass refined at two token costs to the same segments returns one placement object (``auto`` prices it
    once); refinements that differ do not."""
    layout = make_layout(np.array([0, 3000, 3400, 3600, 3700, 3750]))
    g = balanced_mod.balanced_greedy(layout, 2, token_slack=0.03)
    a, b, c = g.placement(0.0), g.placement(None), g.placement(1e9)
    for x, y in ((a, b), (a, c), (b, c)):
        same = all(np.array_equal(getattr(x, f), getattr(y, f)) for f in ("doc", "start", "end", "part"))
        assert (x is y) == same
    assert a is b  # at no token cost a slide moves nothing an exchange would not: the same moves
