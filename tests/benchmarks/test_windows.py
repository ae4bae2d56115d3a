"""Sliding-window benchmark section: windowed work of every baseline against brute force, the placement's
minimal windowed KV, the goal ratio and the section's rendering (``benchmarks/analytic/windows.py``, its run and its section)."""
from __future__ import annotations

import heapq
import inspect

import numpy as np
import pytest

from benchmarks.analytic import distributions as dist
from benchmarks.analytic import schemes as sc
from benchmarks.analytic import window_pairs as wp
from benchmarks.analytic import windows as wn
from benchmarks.report import windows as wrep
from benchmarks.suites import windows as wrun
from helpers import ring_step_matrix

GQA = sc.LLAMA3_8B_SHAPE


# ----------------------------------------------------------------------------- brute force
def _brute(lengths: np.ndarray, owner: np.ndarray, P: int, window: int | None) -> np.ndarray:
    """``[P, P]`` pairs (query owner, key owner) a window keeps, by enumerating every pair."""
    doc = np.repeat(np.arange(len(lengths)), lengths)
    i, j = np.tril_indices(len(doc))  # j <= i
    keep = doc[i] == doc[j]
    if window is not None:
        keep &= i - j < window
    w = np.zeros((P, P))
    np.add.at(w, (owner[i[keep]], owner[j[keep]]), 1)
    return w


def _row_owner(T: int, C: int, chunk_owner: np.ndarray) -> np.ndarray:
    bounds = np.arange(C + 1) * T // C
    return chunk_owner[np.searchsorted(bounds, np.arange(T), side="right") - 1]


def _te_owner(padded: np.ndarray, P: int) -> np.ndarray:
    offset = np.concatenate([np.arange(n) for n in padded])
    size = np.repeat(padded // (2 * P), padded)
    return dist.zigzag_owner(P)[offset // size]


def _layouts(n: int, seed: int = 0):
    """Random layouts of about 200 tokens (documents 1..80), P in 2..4, W in 1..50."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        L = rng.integers(1, 80, size=rng.integers(1, 7))
        yield L, int(rng.integers(2, 5)), int(rng.integers(1, 51))


# ----------------------------------------------------------------------------- closed forms
def test_window_pairs_match_enumeration() -> None:
    rng = np.random.default_rng(1)
    qa, ka = rng.integers(0, 60, 400), rng.integers(0, 60, 400)
    qb, kb = qa + rng.integers(0, 40, 400), ka + rng.integers(0, 40, 400)
    W = rng.integers(1, 50, 400)
    for w_opt in (None, "rand"):
        got = [int(wp.window_pairs(qa[t], qb[t], ka[t], kb[t], None if w_opt is None else int(W[t])))
               for t in range(400)]
        want = []
        for t in range(400):
            i, j = np.meshgrid(np.arange(qa[t], qb[t]), np.arange(ka[t], kb[t]), indexing="ij")
            keep = j <= i
            if w_opt is not None:
                keep &= i - j < W[t]
            want.append(int(keep.sum()))
        assert got == want
    assert sum(want) > 0
    # rows against their whole document: min(x + 1, W) keys at offset x
    for W_ in (1, 7, 50):
        a, b = np.array([0, 3, 10]), np.array([5, 60, 11])
        ref = [sum(min(x + 1, W_) for x in range(u, v)) for u, v in zip(a, b)]
        assert list(wp.window_rows_work(a, b, W_)) == ref
    assert wp.window_useful_pairs(np.array([3, 10]), 4) == (1 + 2 + 3) + (1 + 2 + 3 + 4 * 7)
    assert wp.window_useful_pairs(np.array([3, 10]), None) == dist.useful_pairs(np.array([3, 10]))


def test_segment_pair_matrix_without_window_is_pair_matrix() -> None:
    for L, P, _ in _layouts(20, seed=2):
        for C, owner in ((P, np.arange(P)), (2 * P, dist.zigzag_owner(P))):
            d, a, b, c = wp.row_segments(L, C)
            got = wp.segment_pair_matrix(d, a, b, owner[c], P, None)
            assert np.array_equal(got, dist.pair_matrix(dist.row_chunk_matrix(L, C), owner, P))


# ----------------------------------------------------------------------------- baselines vs brute force
def test_ring_schemes_windowed_work_match_brute_force() -> None:
    checked = 0
    for L, P, W in _layouts(25, seed=3):
        T = int(L.sum())
        for scheme, owner in ((sc.ring, _row_owner(T, P, np.arange(P))),
                              (sc.zigzag_ring, _row_owner(T, 2 * P, dist.zigzag_owner(P)))):
            s, full = scheme(L, P, GQA, window=W), scheme(L, P, GQA)
            w = _brute(L, owner, P, W)
            assert np.array_equal(s.work, w.sum(1))
            assert np.array_equal(ring_step_matrix(s), w)
            assert s.useful_pairs == w.sum()
            # traffic does not change with a window
            assert np.array_equal(s.recv_kv, full.recv_kv) and np.array_equal(s.bytes_intra, full.bytes_intra)
            assert np.array_equal(s.bytes_inter, full.bytes_inter) and np.array_equal(s.tokens, full.tokens)
            checked += int(w.sum() < _brute(L, owner, P, None).sum())
        ag = sc.allgather_kv(L, P, GQA, window=W)
        assert np.array_equal(ag.work, _brute(L, _row_owner(T, 2 * P, dist.zigzag_owner(P)), P, W).sum(1))
        assert np.array_equal(ag.recv_kv, sc.allgather_kv(L, P, GQA).recv_kv)
    assert checked > 10  # the window really cut pairs in most layouts


def test_te_windowed_work_matches_brute_force_on_padded_documents() -> None:
    for L, P, W in _layouts(20, seed=4):
        padded = -(-L // (2 * P)) * (2 * P)
        w = _brute(padded, _te_owner(padded, P), P, W)
        s = sc.te_p2p(L, P, GQA, window=W)
        assert np.array_equal(s.work, w.sum(1)) and np.array_equal(ring_step_matrix(s), w)
        assert s.useful_pairs == wp.window_useful_pairs(L, W) and s.T == L.sum()
        assert np.array_equal(s.bytes_intra + s.bytes_inter,
                              sc.te_p2p(L, P, GQA).bytes_intra + sc.te_p2p(L, P, GQA).bytes_inter)


def test_hierarchical_and_whole_doc_windowed_work() -> None:
    for L, P, W in _layouts(20, seed=5):
        T = int(L.sum())
        total = _brute(L, np.zeros(T, dtype=np.int64), 1, W).sum()
        u = sc.ulysses(L, P, GQA, window=W)
        assert np.allclose(u.work, total / P)
        if P == 4:  # USP U=2 x R=2: zigzag at ring level, each group's pairs split over its 2 GPUs
            z = sc.zigzag_ring(L, 2, GQA, window=W)
            assert np.allclose(sc.usp(L, 2, 2, GQA, window=W).work, np.repeat(z.work / 2, 2))
            padded = -(-L // 8) * 8
            wg = _brute(padded, _te_owner(padded, 2), 2, W)  # group level: 2R = 4 chunks per document
            assert np.allclose(sc.te_a2a_p2p(L, 2, 2, GQA, window=W).work, np.repeat(wg.sum(1) / 2, 2))
        # whole_doc: the greedy placement of schemes.whole_doc, redone here
        heap, rank_of = [(0, r) for r in range(P)], np.empty(L.size, dtype=np.int64)
        for d in np.argsort(-L, kind="stable"):
            load, r = heapq.heappop(heap)
            rank_of[d] = r
            heapq.heappush(heap, (load + int(L[d]), r))
        owner = np.repeat(rank_of, L)
        assert np.array_equal(sc.whole_doc(L, P, GQA, window=W).work, _brute(L, owner, P, W).sum(1))


# ----------------------------------------------------------------------------- hf_hsap side
def _random_placement(rng, L: np.ndarray, P: int):
    """Random segments: every document cut at random points, pieces on random parts."""
    cu = dist.cu_seqlens(L)
    doc, start, end = [], [], []
    for d, n in enumerate(L):
        cuts = np.unique(np.concatenate([[0, n], rng.integers(0, n, size=rng.integers(0, 4))]))
        for a, b in zip(cuts[:-1], cuts[1:]):
            doc.append(d), start.append(cu[d] + a), end.append(cu[d] + b)
    part = rng.integers(0, P, size=len(doc))
    return np.array(doc), np.array(start), np.array(end), part, cu


def test_placement_window_need_matches_brute_force() -> None:
    rng = np.random.default_rng(6)
    nonzero = 0
    for L, P, W in _layouts(30, seed=7):
        doc, start, end, part, cu = _random_placement(rng, L, P)
        owner = np.empty(int(L.sum()), dtype=np.int64)
        for a, b, p in zip(start, end, part):
            owner[a:b] = p
        for window in (None, W):
            got = wn.placement_window_need(doc, start, end, part, cu, P, window)
            want = np.zeros((P, P), dtype=np.int64)  # want[src, dst]: keys dst has no copy of but sees
            tok_doc = np.repeat(np.arange(len(L)), L)
            for dst in range(P):
                q = np.nonzero(owner == dst)[0]
                need = np.zeros(int(L.sum()), dtype=bool)
                for i in q:
                    lo = cu[tok_doc[i]] if window is None else max(cu[tok_doc[i]], i - window + 1)
                    need[lo:i + 1] = True
                need &= owner != dst
                want[:, dst] = np.bincount(owner[need], minlength=P)
            assert np.array_equal(got, want)
            nonzero += int(want.sum() > 0)
    assert nonzero > 10


def test_split_docs_and_goal_ratio() -> None:
    # doc 0 on parts 0 and 1 (twice on 0), doc 1 whole on part 1, doc 2 on parts 1 and 2
    split = wn.split_docs_per_part(np.array([0, 0, 0, 1, 2, 2]), np.array([0, 1, 0, 1, 1, 2]), 4)
    assert list(split) == [1, 2, 1, 0]
    assert wn.goal_ratio(np.array([8, 20, 4, 0]), split, 5) == pytest.approx(max(8 / 10, 20 / 20, 4 / 10))
    assert wn.goal_ratio(np.array([0, 0, 0, 3]), split, 5) == float("inf")  # KV with no split document
    assert wn.goal_ratio(np.zeros(4), np.zeros(4), 5) == 0.0
    # contiguous shards [0, 12) [12, 25) [25, 37) [37, 50); documents [0, 15) [15, 40) [40, 50)
    seg = wn.scheme_segments("ring", np.array([15, 25, 10]), 4)
    assert list(wn.split_docs_per_part(*seg, 4)) == [1, 2, 1, 1]
    assert wn.scheme_segments("ulysses", np.array([10]), 2) is None


def _has_windows() -> bool:
    from hf_hsap.plan.planner import plan_sequence
    return "windows" in inspect.signature(plan_sequence).parameters


def test_planner_recv_equals_placement_minimum() -> None:
    if not _has_windows():
        pytest.skip("the planner has no windows option yet")
    from hf_hsap.plan.planner import plan_sequence

    rng = np.random.default_rng(8)
    for _ in range(10):
        L = rng.integers(1, 400, size=rng.integers(1, 12))
        P, W = int(rng.integers(2, 5)), int(rng.integers(1, 120))
        plan = plan_sequence(dist.cu_seqlens(L), P, "auto", windows={W: 3, None: 1})
        pl = plan.placement
        for window in (W, None):
            need = wn.placement_window_need(pl.doc, pl.start, pl.end, pl.part, dist.cu_seqlens(L), P, window)
            assert list(need.sum(0)) == list(plan.stats(window=window).recv_kv_tokens)


def test_derived_hsap_figures_equal_the_planners() -> None:
    """The stand-in for a planner without windows (placement + this module's minimum) gives the planner's
    figures: work, received KV and bytes split over NVLink / InfiniBand (P = 16: two nodes)."""
    if not _has_windows():
        pytest.skip("the planner has no windows option yet")
    cfg = wn.WindowConfig()
    L = dist.doc_lengths("longtail", 65536, 1)
    plan, source, _ = wrun._plan(dist.cu_seqlens(L), 16, {512: 5, None: 1}, cfg)
    assert source == "planner"
    for window in (512, None):
        a, diff = wn.hsap_kind_stats(plan, "planner", window, L, cfg)
        b, _ = wn.hsap_kind_stats(plan, "derived", window, L, cfg)
        assert diff == 0
        for k in ("work", "recv_kv", "tokens", "bytes_intra", "bytes_inter"):
            assert np.allclose(getattr(a, k), getattr(b, k)), k
        assert a.bytes_inter.sum() > 0 and a.useful_pairs == wp.window_useful_pairs(L, window)


# ----------------------------------------------------------------------------- the section
@pytest.fixture(scope="module")
def tiny_section():
    mp = pytest.MonkeyPatch()
    mp.setitem(wn.WINDOW_MODELS, "tiny", {"label": "tiny: 5 layers of W = 64, 1 full", "layers": {64: 5, None: 1}})
    mp.setitem(wn.WINDOW_MODELS, "flat", {"label": "flat: W = 32", "layers": {32: 4}})
    cfg = wn.WindowConfig(models=("tiny", "flat"), dists=("longtail", "single"), Ts=(4096,), Ps=(2, 4), seeds=(0, 1))
    res = wrun.run_windows(cfg)
    md = wrep.render_windows(res)
    yield res, md
    mp.undo()


def test_section_rows_and_goal_column(tiny_section) -> None:
    res, md = tiny_section
    rows = res["rows"]
    names = {r["scheme"] for r in rows}
    assert {"hsap", "ring", "zigzag_ring", "allgather_kv", "ulysses", "te_p2p", "whole_doc"} <= names
    assert "torch_cp" not in names
    kinds = {(r["model"], r["kind"]) for r in rows}
    assert kinds == {("tiny", "window=64"), ("tiny", "full"), ("tiny", "model"), ("flat", "window=32")}
    # the goal column is computed for windowed kinds of sequence-sharded schemes only
    for r in rows:
        assert ("goal" in r) == (r["window"] is not None and r["scheme"] in wn.SHARDED)
    # ring on one document of 4096 tokens, P = 4: every rank holds a piece of it and receives 3072 tokens
    ring = next(r for r in rows if r["scheme"] == "ring" and r["dist"] == "single" and r["P"] == 4
                and r["kind"] == "window=32")
    assert ring["goal"] == pytest.approx(3072 / (2 * 32 * 1)) and ring["recv_max"] == pytest.approx(1.0)
    assert ring["work_max_mean"] == pytest.approx(1.0, abs=0.01)  # a window balances contiguous shards
    full = next(r for r in rows if r["scheme"] == "ring" and r["dist"] == "single" and r["P"] == 4
                and r["model"] == "tiny" and r["kind"] == "full")
    assert full["work_max_mean"] > 1.5  # causal: the last shard does ~7/4 of the mean
    # the model row weighs 5 windowed layers to 1 full one
    h = {r["kind"]: r for r in rows if r["scheme"] == "hsap" and r["model"] == "tiny" and r["dist"] == "single"
         and r["P"] == 4}
    assert h["model"]["recv_max"] <= max(h["window=64"]["recv_max"], h["full"]["recv_max"]) + 1e-12
    assert h["model"]["recv_max"] >= min(h["window=64"]["recv_max"], h["full"]["recv_max"]) - 1e-12
    # every goal row: met flags follow the numbers
    assert len(res["goals"]) == 2 * 2 * 2  # (tiny W=64, flat W=32) x 2 dists x 2 P
    for g in res["goals"]:
        assert g["recv_met"] == (g["goal_worst"] <= 1.0)
        assert g["met"] == (g["recv_met"] and g["work_met"] and g["tok_met"])
        assert g["check"] == 0  # the planner moves exactly the placement's minimum


def test_section_markdown(tiny_section) -> None:
    res, md = tiny_section
    assert md.startswith("## Sliding windows")
    assert "| model | layers | dist | T | P | recv / (2W·split) (worst seed) | ≤ 1 |" in md
    assert md.count("#### ") == 2 * 2 * 2  # (model, dist, T, P) tables
    assert "**Where it stands**" in md and f"in {sum(g['met'] for g in res['goals'])}/{len(res['goals'])}" in md
    for g in res["goals"]:
        cell = f"{g['goal']:.2f} ({g['goal_worst']:.2f})"
        assert cell in md
    assert "| **hsap** | model (mean over layers) |" in md
    # a failing goal row prints ✗ and the number
    bad = dict(res["goals"][0], goal=1.2, goal_worst=1.5, recv_met=False)
    assert "✗ 1.50" in wrep.goal_table([bad]) and "✓" in wrep.goal_table([res["goals"][0] | {"recv_met": True}])


def test_section_survives_results_json(tiny_section) -> None:
    """``python -m benchmarks report`` renders from results.json: the section must render the same from JSON."""
    import json

    from benchmarks.suites.core import compact

    res, md = tiny_section
    back = json.loads(json.dumps(compact(res), default=float))
    again = wrep.render_windows(back)
    assert again.split("\n\n")[3:] == md.split("\n\n")[3:]  # tables and paragraph (floats rounded to 6 digits)
    assert again.count("| **hsap** |") == md.count("| **hsap** |") > 0
