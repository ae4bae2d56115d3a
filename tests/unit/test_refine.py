"""The token-neutral work refinement of the ``balanced`` placement (``hf_hsap.plan.refine``)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import hf_hsap.plan.balanced as balanced_mod
from hf_hsap.plan.layout import make_layout
from hf_hsap.plan.refine import refine_work


def _placements(lengths: list[int], P: int, slack: float, monkeypatch=None):
    """The balanced placement with and without the refinement."""
    layout = make_layout(np.concatenate([[0], np.cumsum(lengths)]))
    on = balanced_mod.balanced(layout, P, token_slack=slack)
    real = balanced_mod.refine_work
    balanced_mod.refine_work = lambda *a, **k: 0
    try:
        off = balanced_mod.balanced(layout, P, token_slack=slack)
    finally:
        balanced_mod.refine_work = real
    return layout, on, off


@settings(max_examples=60, deadline=None)
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
    moves = refine_work(doc_first, seg_doc, seg_start, seg_end, seg_part, wrk, max_moves=10)
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
