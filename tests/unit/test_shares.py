"""The parts a document's shares go to (hf_hsap.plan.shares): what one scalar loop over every count and part chooses
(the rule written out here)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import ci_examples
from hf_hsap.plan.shares import choose


def _reference(by_load, L, w, k0, P, tok, wrk, caps, rho):
    """The scalar loop over every part count and part, at each of the three work tests in turn."""
    cap_t, cap_w, mean_t = caps
    for j, r in enumerate((rho, 0.0, None)):
        for k in range(P if 2 * k0 > P else k0, min(P, L) + 1):
            t, x = L / k, w / k
            room = cap_t - -(-L // k)
            chosen = []
            for p in by_load:
                tp = tok[p]
                if tp > room:
                    continue
                if r is not None:
                    wp = wrk[p] + x
                    free = mean_t - tp - t
                    if wp > cap_w or wp + r * (free if free > 0.0 else 0.0) > cap_w:
                        continue
                chosen.append(p)
                if len(chosen) == k:
                    return j, chosen
    return None


def _choose(case):
    """:func:`choose` of a case laid out as :func:`_reference`'s arguments."""
    by_load, L, w, k0, P, tok, wrk, caps, rho = case
    return choose(by_load, L, w, k0, n_parts=P, tok=tok, wrk=wrk, caps=caps, rho=rho)


@st.composite
def _cases(draw):
    P = draw(st.integers(1, 24))
    mean_t = draw(st.integers(16, 4096))
    cap_t = float(mean_t) * draw(st.sampled_from([1.0, 1.01, 1.05, 1.1]))
    L = draw(st.integers(1, 3 * mean_t))
    w = L * (L + 1) / 2
    cap_w = draw(st.floats(0.3, 3.0)) * w
    cap_t = float(int(cap_t))  # whole tokens: a part can sit exactly at a share's room
    # a part's tokens: any, or exactly the room a k-way share leaves (the token test's boundary)
    tok = [float(draw(st.one_of(st.integers(0, int(cap_t)),
                                st.integers(1, P).map(lambda k: max(0, int(cap_t) + (-L // k))))))
           for _ in range(P)]
    wrk = [t * draw(st.floats(0.0, 2.0)) * draw(st.sampled_from([1.0, mean_t / 2])) for t in tok]
    loads = np.asarray(wrk) + np.asarray(tok)
    by_load = sorted(range(P), key=loads.__getitem__)
    k0 = max(1, -(-L // int(cap_t)), draw(st.integers(1, P)))
    rho = draw(st.sampled_from([0.0, 0.5, float(mean_t) / 4]))
    return by_load, L, w, k0, P, tok, wrk, (cap_t, cap_w, float(mean_t)), rho


@settings(max_examples=ci_examples(300), deadline=None)
@given(_cases())
def test_choose_is_the_scalar_loop(case):
    assert _choose(case) == _reference(*case)


def test_a_document_that_misses_its_fewest_parts_goes_to_more():
    # two parts are nearly full: a 600-token document fits none of them whole, nor 2 shares of 300, but 4 shares
    # of 150 fit the four emptier parts (the table's rows, not the scan of the fewest count)
    tok = [900.0, 900.0, 850.0, 850.0, 850.0, 850.0]
    wrk = [0.0] * 6
    by_load = [2, 3, 4, 5, 0, 1]
    case = (by_load, 600, 600 * 601 / 2, 1, 6, tok, wrk, (1000.0, 1e12, 1000.0), 0.0)
    assert _choose(case) == (0, [2, 3, 4, 5]) == _reference(*case)


def test_the_caps_hold_a_share_that_meets_them_exactly():
    # part 0 sits exactly at the token room (cap 1000 - 600) and, with its share, exactly at the work cap once
    # filled to the mean: 1000 - 400 - 600 = 0 free tokens; part 1 is one token over the room
    L, w = 600, 180300.0
    tok, wrk = [400.0, 401.0], [19700.0, 0.0]
    for rho in (0.0, 3.5, None):
        case = ([0, 1], L, w, 1, 2, tok, wrk, (1000.0, 200000.0, 1000.0), rho)
        assert _choose(case) == (0, [0]) == _reference(*case)
    # one pair more on part 0: the work cap refuses the document whole, and it is split over both parts
    case = ([0, 1], L, w, 1, 2, tok, [19701.0, 0.0], (1000.0, 200000.0, 1000.0), 0.0)
    assert _choose(case) == (0, [0, 1]) == _reference(*case)


def test_a_larger_count_meets_the_caps_exactly():
    # no part has room for the document whole (400 tokens left of 1000); two shares of 300 fit, each at exactly the
    # work cap and, filled to the mean of 750 tokens, with no free token left (the table's boundary)
    L, w = 600, 180300.0
    tok = [450.0, 450.0, 450.0]
    for rho in (0.0, 2.0, None):
        case = ([0, 1, 2], L, w, 1, 3, tok, [0.0, 0.0, 0.0], (1000.0, 90150.0, 750.0), rho)
        assert _choose(case) == (0, [0, 1]) == _reference(*case)
