"""Sliding-window mask kinds in the planner, against an independent brute force.

The brute force knows nothing of the planner: it takes the placement the plan chose (which part holds which
global position), builds the (query, key) visibility of a window over plain positions (Transformers'
``sliding_window``: a query at document position ``i`` sees the keys ``j`` of its document with
``i - W < j <= i``; ``None`` is full causal attention) and derives from it, with numpy masks and Python sets,
what each part must receive (the keys its queries see that it does not hold), what each part sends, and the
pairs each part computes. Every kind of a plan must move exactly that, once, from the real owner, and count it
so in its stats and compiled schedules.

``test_full_attention_plan_is_minimal`` uses only the API without windows (``plan.transfers``,
``plan.pieces``, ``plan.stats()``, ``plan.schedule(part)``): it checks the full kind as the planner makes it
today.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from helpers import ci_examples, cu_of

from hf_hsap import PlanCache
from hf_hsap.plan.planner import plan_sequence

PLACEMENTS = ["contiguous", "zigzag", "balanced", "auto"]
ROUNDS = ["auto", "batched", "by_peer"]


# --------------------------------------------------------------------------------------------- brute force
def norm(window: int | None, longest: int) -> int | None:
    """The kind of a window on a layout whose longest document has ``longest`` tokens."""
    return None if window is None or window >= longest else window


def expected_kinds(windows, longest: int) -> tuple:
    ks = {norm(w, longest) for w in windows}
    return ((None,) if None in ks else ()) + tuple(sorted(k for k in ks if k is not None))


def kind_key(window: int | None) -> str:
    return "full" if window is None else f"window={window}"


def owners(plan, T: int) -> np.ndarray:
    """``[T]`` the part holding each global position (checks that the parts partition ``[0, T)``)."""
    owner = np.full(T, -1, dtype=np.int64)
    for r in range(plan.n_parts):
        idx = np.asarray(plan.part_token_indices(r))
        assert np.all(np.diff(idx) > 0), f"part {r} not in global order"
        assert np.all(owner[idx] == -1), f"part {r} holds a position another part holds"
        owner[idx] = r
    assert np.all(owner >= 0), "a position is held by no part"
    return owner


def sees(cu, window: int | None) -> np.ndarray:
    """``[T, T]`` bool: query ``i`` (row) sees key ``j`` (column)."""
    T = int(cu[-1])
    pos = np.arange(T)
    doc = np.searchsorted(np.asarray(cu), pos, side="right") - 1
    lag = pos[:, None] - pos[None, :]  # i - j
    m = (doc[:, None] == doc[None, :]) & (lag >= 0)
    if window is not None:
        m &= lag < window
    return m


@dataclass
class Want:
    """What a kind must move and compute, per part: the keys received, KV tokens sent, (query, key) pairs
    of the part's queries, and those of them against keys the part holds."""

    need: list[set[int]]
    send: list[int]
    work: list[int]
    local: list[int]


def brute_force(cu, owner: np.ndarray, n_parts: int, window: int | None) -> Want:
    vis = sees(cu, window)
    need, work, local = [], [], []
    for r in range(n_parts):
        held = owner == r
        rows = vis[held]  # [tokens of r, T]
        need.append(set(np.flatnonzero(rows.any(axis=0) & ~held).tolist()))
        work.append(int(rows.sum()))
        local.append(int(rows[:, held].sum()))
    send = [0] * n_parts
    for r in range(n_parts):
        for j in need[r]:
            send[int(owner[j])] += 1
    return Want(need, send, work, local)


# --------------------------------------------------------------------------------------------- checks
def moved_rows(plan, owner: np.ndarray, runs) -> list[tuple[int, int, int]]:
    """``(dst, src, position)`` of every KV token a set of transfers or pieces moves, checking on the way that
    the sender holds it, at the local row the run says, and does not send it to itself."""
    out = []
    for s, e, src, dst, loc in zip(runs.start.tolist(), runs.end.tolist(), runs.src.tolist(), runs.dst.tolist(),
                                   runs.src_local.tolist()):
        assert e >= s and src != dst, (s, e, src, dst)
        assert np.all(owner[s:e] == src), f"part {src} sends [{s}, {e}) it does not hold"
        held = np.asarray(plan.part_token_indices(src))
        assert np.array_equal(held[loc:loc + e - s], np.arange(s, e)), f"src_local {loc} of [{s}, {e}) is wrong"
        out += [(dst, src, j) for j in range(s, e)]
    return out


def check_moves(plan, owner: np.ndarray, want: Want, transfers, pieces) -> None:
    """The transfers deliver each needed key once and nothing else; the pieces move exactly the transfers
    (and respect the receive budget)."""
    rows = moved_rows(plan, owner, transfers)
    for r in range(plan.n_parts):
        got = [j for dst, _, j in rows if dst == r]
        assert len(got) == len(set(got)), f"part {r} receives a key twice"
        assert set(got) == want.need[r], (f"part {r}: extra {sorted(set(got) - want.need[r])[:10]}, "
                                          f"missing {sorted(want.need[r] - set(got))[:10]}")
    assert Counter(moved_rows(plan, owner, pieces)) == Counter(rows), "the round pieces are not the transfers"
    budget = plan.recv_budget_tokens
    if budget is not None and len(pieces):
        for t in range(pieces.n_rounds):
            in_t = pieces.round == t
            assert np.bincount(pieces.dst[in_t], weights=pieces.lengths[in_t]).max(initial=0) <= budget
            assert np.bincount(pieces.src[in_t], weights=pieces.lengths[in_t]).max(initial=0) <= budget


def check_figures(fig, want: Want, plan, pieces) -> None:
    """Per-rank figures (``PlanStats`` or ``KindStats``) equal the brute-force counts."""
    U = plan.ulysses_size
    for rank in range(plan.size):
        r = rank // U
        assert fig.recv_kv_tokens[rank] == len(want.need[r]), (rank, fig.recv_kv_tokens, want.need)
        assert fig.send_kv_tokens[rank] == want.send[r], (rank, fig.send_kv_tokens, want.send)
        if U == 1:
            assert fig.attn_work[rank] == want.work[r], (rank, fig.attn_work, want.work)
            assert fig.local_attn_work[rank] == want.local[r], (rank, fig.local_attn_work, want.local)
        else:  # each rank of a part computes 1/U of the heads
            assert fig.attn_work[rank] == pytest.approx(want.work[r] / U, rel=1e-12, abs=1e-12)
            assert fig.local_attn_work[rank] == pytest.approx(want.local[r] / U, rel=1e-12, abs=1e-12)
    assert fig.rounds == pieces.n_rounds


def check_schedule(plan, owner: np.ndarray, want: Want, pieces, part: int, sched) -> None:
    """A part's compiled schedule receives and sends, round by round, exactly that kind's pieces."""
    assert len(sched.rounds) == pieces.n_rounds
    held = np.asarray(plan.part_token_indices(part))
    for t, rnd in enumerate(sched.rounds):
        into = (pieces.round == t) & (pieces.dst == part)
        out = (pieces.round == t) & (pieces.src == part)
        assert rnd.recv_total == int(pieces.lengths[into].sum())
        assert sum(c for _, _, c in rnd.recv_splits) == rnd.recv_total
        sent = held[np.asarray(rnd.send_index, dtype=np.int64)]
        want_sent = [j for s, e in zip(pieces.start[out].tolist(), pieces.end[out].tolist()) for j in range(s, e)]
        assert Counter(sent.tolist()) == Counter(want_sent), f"part {part} round {t} sends the wrong rows"
        if plan.recv_budget_tokens is not None:
            assert rnd.recv_total <= plan.recv_budget_tokens
    assert sum(r.recv_total for r in sched.rounds) == sched.recv_tokens == len(want.need[part])
    assert sched.send_tokens == want.send[part]
    assert sched.n_local == held.shape[0]


def same_runs(a, b) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("src", "dst", "start", "end", "src_local"))


# --------------------------------------------------------------------------------------------- strategies
WINDOWS = st.one_of(st.sampled_from([1, 2, 3, None]), st.integers(1, 70))


@st.composite
def cases(draw, max_len: int = 60, max_size: int = 6):
    """A layout (1-8 documents), a group shape (P = R x U <= max_size, U in {1, 2, 3}), a placement, a
    round order and (sometimes) a receive budget."""
    lengths = draw(st.lists(st.integers(1, max_len), min_size=1, max_size=8))
    U = draw(st.sampled_from([1, 2, 3]))
    R = draw(st.integers(1, max_size // U))
    assume(sum(lengths) >= R * U)
    return {"lengths": lengths, "P": R * U, "U": U, "placement": draw(st.sampled_from(PLACEMENTS)),
            "rounds": draw(st.sampled_from(ROUNDS)), "budget": draw(st.one_of(st.none(), st.integers(1, 40)))}


def make(case: dict, **kw):
    return plan_sequence(cu_of(case["lengths"]), case["P"], case["placement"], ulysses_size=case["U"],
                         rounds=case["rounds"], recv_budget_tokens=case["budget"], **kw)


# --------------------------------------------------------------------------------------------- today's API
@settings(max_examples=ci_examples(80))
@given(case=cases())
def test_full_attention_plan_is_minimal(case):
    """Full attention as planned without ``windows``: the brute force with ``W = None`` (only the API that
    predates mask kinds)."""
    plan = make(case)
    cu = cu_of(case["lengths"])
    owner = owners(plan, cu[-1])
    want = brute_force(cu, owner, plan.n_parts, None)
    check_moves(plan, owner, want, plan.transfers, plan.pieces)
    st_ = plan.stats()
    check_figures(st_, want, plan, plan.pieces)
    L = np.asarray(case["lengths"])
    assert sum(want.work) == int((L * (L + 1) // 2).sum())  # the brute force itself: every causal pair once
    for part in range(plan.n_parts):
        check_schedule(plan, owner, want, plan.pieces, part, plan.schedule(part))


# --------------------------------------------------------------------------------------------- mask kinds
@settings(max_examples=ci_examples(80))
@given(case=cases(), windows=st.lists(WINDOWS, min_size=1, max_size=4), extra=WINDOWS)
def test_every_kind_receives_exactly_the_keys_its_queries_see(case, windows, extra):
    """For every kind of the plan (and one asked for on demand): minimal transfers, no duplicates, from the
    owner; round pieces that cover them; stats (top level and per kind) equal to the brute-force counts."""
    plan = make(case, windows=windows)
    cu = cu_of(case["lengths"])
    owner = owners(plan, cu[-1])
    kinds = expected_kinds(windows, max(case["lengths"]))
    assert plan.windows == kinds
    default = plan.stats()
    assert set(default.kinds) == {kind_key(k) for k in kinds}
    for k in kinds:
        want = brute_force(cu, owner, plan.n_parts, k)
        tr, pc = plan.transfers_for(k), plan.pieces_for(k)
        check_moves(plan, owner, want, tr, pc)
        top = plan.stats(window=k)
        check_figures(top, want, plan, pc)
        assert top.tokens == default.tokens
        for part in range(plan.n_parts):
            assert sum(top.round_recv_kv[part]) == len(want.need[part])
        ks = default.kinds[kind_key(k)]
        assert ks.window == k and ks.layers == plan.layer_counts[k]
        check_figures(ks, want, plan, pc)
    # the default kind is the first one
    assert same_runs(plan.transfers, plan.transfers_for(kinds[0]))
    assert same_runs(plan.pieces, plan.pieces_for(kinds[0]))
    first = plan.stats(window=kinds[0])
    for f in ("recv_kv_tokens", "send_kv_tokens", "attn_work", "local_attn_work", "rounds", "round_recv_kv"):
        assert getattr(default, f) == getattr(first, f), f
    # a window the plan was not made for: computed on demand, just as exact
    want = brute_force(cu, owner, plan.n_parts, extra)
    check_moves(plan, owner, want, plan.transfers_for(extra), plan.pieces_for(extra))


@settings(max_examples=ci_examples(40))
@given(case=cases(), windows=st.lists(WINDOWS, min_size=1, max_size=6))
def test_windows_normalise_and_the_list_and_mapping_forms_agree(case, windows):
    """``plan.windows`` / ``layer_counts`` from a per-layer list and from ``{window: layers}``: windows at
    least the longest document are full attention; both forms give the same plan."""
    longest = max(case["lengths"])
    a = make(case, windows=windows)
    b = make(case, windows=dict(Counter(windows)))
    kinds = expected_kinds(windows, longest)
    counts = dict(Counter(norm(w, longest) for w in windows))
    assert a.windows == b.windows == kinds
    assert a.layer_counts == b.layer_counts == counts
    for part in range(a.n_parts):
        assert np.array_equal(a.part_token_indices(part), b.part_token_indices(part))
    for k in kinds:
        assert same_runs(a.transfers_for(k), b.transfers_for(k))
        assert a.stats().kinds[kind_key(k)].layers == counts[k]


def test_normalisation_at_the_longest_document():
    cu = cu_of([10, 30, 5])  # longest document: 30 tokens
    plan = plan_sequence(cu, 2, "contiguous", windows=[4, 30, 100, None, 4, 29])
    assert plan.windows == (None, 4, 29)
    assert plan.layer_counts == {None: 3, 4: 2, 29: 1}
    assert set(plan.stats().kinds) == {"full", "window=4", "window=29"}
    mapped = plan_sequence(cu, 2, "contiguous", windows={29: 1, 4: 2, 31: 2, None: 1})
    assert mapped.windows == (None, 4, 29) and mapped.layer_counts == {None: 3, 4: 2, 29: 1}
    # no full layer: the kinds ascend, and the first one is the default of transfers / pieces / stats
    only = plan_sequence(cu, 2, "contiguous", windows=[20, 3, 20, 7])
    assert only.windows == (3, 7, 20) and only.layer_counts == {3: 1, 7: 1, 20: 2}
    assert same_runs(only.transfers, only.transfers_for(3))
    assert only.stats().recv_kv_tokens == only.stats(window=3).recv_kv_tokens
    # part 0 holds [0, 22), part 1 [22, 45): document [10, 40) is cut at 22, where part 1 needs the W - 1 keys
    # before its first query (all 12 of the document from W = 13 on)
    assert [only.stats(window=w).recv_kv_tokens for w in (3, 7, 20)] == [[0, 2], [0, 6], [0, 12]]
    default = plan_sequence(cu, 2, "contiguous")
    assert default.windows == (None,) and set(default.layer_counts) == {None}


@pytest.mark.parametrize("bad", [[0], [-3], [2.5], {4: -1}])
def test_bad_windows_are_refused(bad):
    with pytest.raises(ValueError):
        plan_sequence(cu_of([10, 30]), 2, windows=bad)


def test_windows_are_part_of_the_cache_key():
    cache = PlanCache(maxsize=8)
    cu = cu_of([40, 25])
    full = plan_sequence(cu, 2, cache=cache)
    w4 = plan_sequence(cu, 2, windows=[4], cache=cache)
    w4x2 = plan_sequence(cu, 2, windows=[4, 4], cache=cache)
    mixed = plan_sequence(cu, 2, windows=[None, 4], cache=cache)
    assert full.windows == (None,) and w4.windows == (4,) and mixed.windows == (None, 4)
    assert w4.layer_counts == {4: 1} and w4x2.layer_counts == {4: 2}
    assert len({id(p) for p in (full, w4, w4x2, mixed)}) == 4


@settings(max_examples=ci_examples(40))
@given(case=cases())
def test_the_full_kind_is_todays_plan(case):
    """Windows that are all full attention give exactly the plan made without ``windows``; a mixed plan's full
    kind moves today's transfers when the placement is the same."""
    plain = make(case)
    longest = max(case["lengths"])
    assert plain.windows == (None,)
    assert same_runs(plain.transfers_for(None), plain.transfers)
    base = plain.stats()
    fields = ("placement", "round_order", "tokens", "attn_work", "local_attn_work", "recv_kv_tokens",
              "send_kv_tokens", "a2a_tokens", "rounds", "send_kv_pairs", "round_recv_kv", "round_transfers")
    for variant in ([None], [None, None, None], {None: 4}, [longest, None, longest + 9]):
        p = make(case, windows=variant)
        assert p.windows == (None,)
        for part in range(p.n_parts):
            assert np.array_equal(p.part_token_indices(part), plain.part_token_indices(part))
        assert same_runs(p.transfers, plain.transfers) and same_runs(p.transfers_for(None), plain.transfers)
        assert same_runs(p.pieces, plain.pieces)
        s = p.stats()
        for f in fields:
            assert getattr(s, f) == getattr(base, f), f
    if case["placement"] in ("contiguous", "zigzag"):  # placements that do not look at the mask
        mixed = make(case, windows=[None, 5, 2])
        for part in range(mixed.n_parts):
            assert np.array_equal(mixed.part_token_indices(part), plain.part_token_indices(part))
        assert same_runs(mixed.transfers_for(None), plain.transfers)
        assert mixed.stats(window=None).recv_kv_tokens == base.recv_kv_tokens


# --------------------------------------------------------------------------------------------- the W - 1 bound
def runs_of(idx: np.ndarray, cu) -> list[tuple[int, int, int]]:
    """``(doc, start, end)`` maximal runs of consecutive positions of one document in a sorted index."""
    doc = np.searchsorted(np.asarray(cu), idx, side="right") - 1
    br = np.flatnonzero((np.diff(idx) != 1) | (np.diff(doc) != 0)) + 1
    first = np.concatenate([[0], br])
    last = np.concatenate([br, [idx.shape[0]]]) - 1
    return [(int(doc[a]), int(idx[a]), int(idx[b]) + 1) for a, b in zip(first.tolist(), last.tolist())]


@settings(max_examples=ci_examples(40))
@given(lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=6), U=st.sampled_from([1, 2]),
       R=st.integers(1, 4), placement=st.sampled_from(PLACEMENTS), window=st.integers(1, 400))
def test_a_window_needs_at_most_w_minus_1_keys_before_each_query_segment(lengths, U, R, placement, window):
    """Per part and split document: the received keys are at most ``W - 1`` per query segment the part holds
    there, and are exactly the (up to ``W - 1``) keys before each segment's start that the part lacks; never
    more than full attention moves. Larger layouts than the pairwise brute force could take."""
    cu = cu_of(lengths)
    assume(cu[-1] >= R * U)
    plan = plan_sequence(cu, R * U, placement, ulysses_size=U, windows=[window, None])
    tr, full = plan.transfers_for(window), plan.transfers_for(None)
    for part in range(plan.n_parts):
        runs = runs_of(np.asarray(plan.part_token_indices(part)), cu)
        n_runs, exact, prev_end = Counter(), Counter(), {}
        for d, a, b in runs:
            n_runs[d] += 1
            exact[d] += min(window - 1, a - prev_end.get(d, cu[d]))  # the gap since the part's previous run
            prev_end[d] = b
        into = tr.dst == part
        got = np.concatenate([np.arange(s, e) for s, e in zip(tr.start[into], tr.end[into])] or [np.zeros(0, int)])
        assert np.unique(got).shape[0] == got.shape[0]
        per_doc = Counter((np.searchsorted(np.asarray(cu), got, side="right") - 1).tolist())
        for d, n in per_doc.items():
            assert n <= (window - 1) * n_runs[d], (part, d, n, n_runs[d])
        assert per_doc == +exact, (part, dict(per_doc), dict(exact))
        into_full = full.dst == part
        got_full = {j for s, e in zip(full.start[into_full], full.end[into_full]) for j in range(s, e)}
        assert set(got.tolist()) <= got_full


# --------------------------------------------------------------------------------------------- schedules
@settings(max_examples=ci_examples(40))
@given(case=cases(), windows=st.lists(WINDOWS, min_size=1, max_size=3))
def test_each_kinds_schedule_moves_that_kinds_kv(case, windows):
    """``plan.schedule(part, window=W)``: its rounds receive and send exactly that kind's pieces; the sum of
    its receive buffers is the part's recv for the kind."""
    plan = make(case, windows=windows)
    cu = cu_of(case["lengths"])
    owner = owners(plan, cu[-1])
    for k in plan.windows:
        want = brute_force(cu, owner, plan.n_parts, k)
        pc = plan.pieces_for(k)
        recv = plan.stats(window=k).recv_kv_tokens
        for part in range(plan.n_parts):
            sched = plan.schedule(part, window=k)
            check_schedule(plan, owner, want, pc, part, sched)
            assert sum(r.recv_total for r in sched.rounds) == recv[part * plan.ulysses_size]
    first = plan.windows[0]
    for part in range(plan.n_parts):
        assert plan.schedule(part).recv_tokens == plan.schedule(part, window=first).recv_tokens
