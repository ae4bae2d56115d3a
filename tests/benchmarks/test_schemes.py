"""Pure benchmark code: distributions, exact per-scheme counts (against brute force) and the cost model."""
from __future__ import annotations

import dataclasses
import functools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import ci_examples, ring_step_matrix

from benchmarks.analytic import cost_model as cm
from benchmarks.analytic import distributions as dist
from benchmarks.analytic import hsap_scheme as hs
from benchmarks.analytic import schemes as sc
from hf_hsap.data.lengths import doc_lengths as lib_doc_lengths

GQA = sc.LLAMA3_8B_SHAPE  # 32 q heads, 8 kv heads, head dim 128, bf16
MHA = sc.LLAMA2_7B_SHAPE


# ----------------------------------------------------------------------------- references
def _reference_lengths(name: str, T: int, seed: int) -> np.ndarray:
    """One draw at a time, straight from the spec's wording."""
    rng = np.random.default_rng(seed)
    median, sigma = {"longtail": (2048, 1.6), "sft": (600, 0.9)}[name]
    out, acc = [], 0
    while acc < T:
        x = int(np.clip(rng.lognormal(np.log(median), sigma), 16, T))
        out.append(min(x, T - acc))
        acc += out[-1]
    return np.array(out)


def _brute(lengths: np.ndarray, owner: np.ndarray, P: int) -> tuple[np.ndarray, np.ndarray]:
    """``[P]`` tokens and ``[P, P]`` pairs (query owner, key owner) by enumerating all pairs."""
    doc = np.repeat(np.arange(len(lengths)), lengths)
    i, j = np.tril_indices(len(doc))  # j <= i
    keep = doc[i] == doc[j]
    w = np.zeros((P, P))
    np.add.at(w, (owner[i[keep]], owner[j[keep]]), 1)
    return np.bincount(owner, minlength=P), w


def _row_owner(T: int, C: int, chunk_owner: np.ndarray) -> np.ndarray:
    """Owner of every token when the row is cut in ``C`` chunks ``[cT//C, (c+1)T//C)``."""
    bounds = np.arange(C + 1) * T // C
    return chunk_owner[np.searchsorted(bounds, np.arange(T), side="right") - 1]


layouts = st.lists(st.integers(1, 40), min_size=1, max_size=8)


# ----------------------------------------------------------------------------- distributions
@pytest.mark.parametrize("name", dist.DISTRIBUTIONS)
@pytest.mark.parametrize("T", [131072, 524288])
def test_distribution_sum_and_clipping(name: str, T: int) -> None:
    for seed in range(5):
        L = dist.doc_lengths(name, T, seed)
        assert L.dtype == np.int64 and int(L.sum()) == T
        assert L.min() >= 1 and L.max() <= T
        assert np.all(L[:-1] >= dist.MIN_DOC)
        cu = dist.cu_seqlens(L)
        assert cu[0] == 0 and cu[-1] == T and np.all(np.diff(cu) == L)
    if name == "single":
        assert list(dist.doc_lengths(name, T, 3)) == [T]
    if name == "mixed":
        assert dist.doc_lengths(name, T, 1)[0] == T // 2
        assert len(dist.doc_lengths(name, T, 1)) > 2


@pytest.mark.parametrize("name", ["longtail", "sft"])
def test_distribution_matches_one_at_a_time_definition(name: str) -> None:
    for seed in range(5):
        for T in (5000, 131072):
            assert np.array_equal(dist.doc_lengths(name, T, seed), _reference_lengths(name, T, seed))
    assert not np.array_equal(dist.doc_lengths(name, 131072, 0), dist.doc_lengths(name, 131072, 1))


def test_sft_shorter_than_longtail() -> None:
    assert len(dist.doc_lengths("sft", 524288, 0)) > 3 * len(dist.doc_lengths("longtail", 524288, 0))
    with pytest.raises(ValueError):
        dist.doc_lengths("nope", 1024, 0)


# ----------------------------------------------------------------------------- exact counts vs brute force
@settings(max_examples=ci_examples(40))
@given(layouts, st.integers(1, 4))
def test_row_placements_match_brute_force(lengths: list[int], P: int) -> None:
    L = np.array(lengths)
    T = int(L.sum())
    for scheme, owner in ((sc.ring, _row_owner(T, P, np.arange(P))),
                          (sc.zigzag_ring, _row_owner(T, 2 * P, dist.zigzag_owner(P)))):
        s = scheme(L, P, GQA)
        tok, w = _brute(L, owner, P)
        assert np.array_equal(s.tokens, tok)
        assert np.array_equal(s.work, w.sum(1))
        assert np.array_equal(ring_step_matrix(s), w)
        assert np.array_equal(s.recv_kv, T - tok)
    ag = sc.allgather_kv(L, P, GQA)
    tok, w = _brute(L, _row_owner(T, 2 * P, dist.zigzag_owner(P)), P)
    assert np.array_equal(ag.work, w.sum(1)) and np.array_equal(ag.tokens, tok)
    cp = sc.torch_cp(L, P, GQA)  # plain causal over the row
    _, w_row = _brute(np.array([T]), _row_owner(T, 2 * P, dist.zigzag_owner(P)), P)
    assert np.array_equal(cp.work, w_row.sum(1)) and cp.correct == (len(L) == 1)


@settings(max_examples=ci_examples(30))
@given(layouts, st.integers(1, 3))
def test_te_p2p_matches_brute_force_on_padded_documents(lengths: list[int], P: int) -> None:
    L = np.array(lengths)
    padded = -(-L // (2 * P)) * (2 * P)
    offset = np.concatenate([np.arange(n) for n in padded])
    size = np.repeat(padded // (2 * P), padded)
    owner = dist.zigzag_owner(P)[offset // size]
    tok, w = _brute(padded, owner, P)
    s = sc.te_p2p(L, P, GQA)
    assert np.array_equal(s.tokens, tok) and np.array_equal(s.work, w.sum(1))
    assert np.array_equal(ring_step_matrix(s), w)
    assert s.T == L.sum() and s.useful_pairs == dist.useful_pairs(L)


@settings(max_examples=ci_examples(30))
@given(layouts, st.sampled_from([(1, 4), (2, 2), (4, 1), (2, 3), (8, 1)]))
def test_hierarchical_work_and_tokens_add_up(lengths: list[int], ur: tuple[int, int]) -> None:
    U, R = ur
    L = np.array(lengths)
    padded = -(-L // (2 * U * R)) * (2 * U * R)
    for s, pairs in ((sc.usp(L, U, R, GQA), dist.useful_pairs(L)), (sc.te_a2a_p2p(L, U, R, GQA), dist.useful_pairs(padded))):
        assert s.P == U * R and s.work.shape == (U * R,)
        assert s.work.sum() == pytest.approx(pairs)
        assert np.allclose(s.ring.step_work.sum(1), s.work)
        assert s.tokens.max() - s.tokens.min() <= (2 if s.name.startswith("usp") else 0)  # 2 chunks, each ±1
    # the group work of USP equals zigzag at ring level, split evenly over the U GPUs
    z = sc.zigzag_ring(L, R, GQA)
    assert np.allclose(sc.usp(L, U, R, GQA).work, np.repeat(z.work / U, U))


def test_degenerate_hierarchies_equal_their_flat_schemes() -> None:
    L = dist.doc_lengths("longtail", 16384, 0)
    a, b = sc.usp(L, 1, 8, MHA), sc.zigzag_ring(L, 8, MHA)
    for f in ("tokens", "work", "recv_kv", "bytes_intra", "bytes_inter"):
        assert np.array_equal(getattr(a, f), getattr(b, f))
    a, b = sc.te_a2a_p2p(L, 1, 8, MHA), sc.te_p2p(L, 8, MHA)
    assert np.array_equal(a.work, b.work) and np.array_equal(a.bytes_inter, b.bytes_inter)


# ----------------------------------------------------------------------------- figures of the spec
@pytest.mark.parametrize("P", [8, 32, 64])
@pytest.mark.parametrize("name", ["longtail", "sft", "mixed"])
def test_ring_receives_every_other_shard(P: int, name: str) -> None:
    T = 131072
    L = dist.doc_lengths(name, T, 2)
    for f in (sc.ring, sc.zigzag_ring, sc.allgather_kv, sc.torch_cp):
        s = f(L, P, GQA)
        assert np.all(s.recv_kv == (P - 1) * T // P), f.__name__
        assert np.all(s.tokens == T // P)


@pytest.mark.parametrize("P", [8, 64])
def test_single_document_work_is_the_closed_form(P: int) -> None:
    T = 131072
    L = dist.doc_lengths("single", T, 0)
    stats = sc.all_schemes(L, P, GQA)
    assert {"ring", "zigzag_ring", "allgather_kv", "ulysses", "te_p2p", "whole_doc", "torch_cp"} <= set(stats)
    for name, s in stats.items():
        assert s.correct, name
        assert s.work.sum() == pytest.approx(T * (T + 1) / 2, rel=1e-12), name
    assert not stats["whole_doc"].feasible
    assert stats["zigzag_ring"].work.max() / stats["zigzag_ring"].work.mean() == pytest.approx(1, abs=1e-3)
    assert stats["ring"].work.max() / stats["ring"].work.mean() > 1.8  # contiguous causal is unbalanced


def test_torch_cp_is_wrong_and_wasteful_on_packed_rows() -> None:
    L = dist.doc_lengths("sft", 131072, 0)
    s = sc.torch_cp(L, 8, GQA)
    assert not s.correct and s.work.sum() == 131072 * 131073 // 2 > 50 * dist.useful_pairs(L)


def test_whole_doc_moves_nothing_and_respects_memory() -> None:
    L = dist.doc_lengths("sft", 131072, 0)
    s = sc.whole_doc(L, 8, GQA)
    assert s.feasible and np.all(s.recv_kv == 0) and s.bytes_intra.sum() == 0 and s.bytes_inter.sum() == 0
    assert s.tokens.sum() == 131072 and s.tokens.max() <= 1.1 * 131072 / 8
    assert s.work.sum() == dist.useful_pairs(L)
    assert not sc.whole_doc(dist.doc_lengths("mixed", 131072, 0), 8, GQA).feasible


def test_ulysses_head_limits() -> None:
    L = dist.doc_lengths("sft", 131072, 0)
    assert sc.ulysses(L, 8, GQA).feasible and sc.ulysses(L, 32, MHA).feasible
    assert sc.ulysses(L, 16, GQA).feasible  # 16 > 8 kv heads: kv heads replicated
    assert not sc.ulysses(L, 64, GQA).feasible and not sc.ulysses(L, 64, MHA).feasible
    assert not sc.usp(L, 3, 2, GQA).feasible
    heads = functools.partial(dataclasses.replace, GQA, head_dim=64)
    assert not sc.ulysses(L, 4, heads(q_heads=24, kv_heads=6)).feasible  # 4 divides the q heads, not the kv heads
    assert sc.ulysses(L, 4, heads(q_heads=24, kv_heads=2)).feasible  # kv heads replicated twice
    assert sc.usp(L, 8, 8, GQA).feasible


def test_ulysses_bytes_closed_form() -> None:
    T, P, d, b = 131072, 8, 128, 2
    L = dist.doc_lengths("longtail", T, 0)
    for shape in (MHA, GQA):
        s = sc.ulysses(L, P, shape)
        kv_eff = max(shape.kv_heads, P)
        per_dir = (P - 1) * (T // P) * ((2 * shape.q_heads + 2 * kv_eff) // P) * d * b  # Q, K, V in + O out
        assert np.allclose(s.bytes_intra, 2 * per_dir) and np.all(s.bytes_inter == 0)
        assert np.allclose(s.recv_kv, (P - 1) * (T // P) / P * kv_eff / shape.kv_heads)
        assert np.allclose(s.work, dist.useful_pairs(L) / P)
    s4 = sc.ulysses(L, 32, MHA, gpus_per_node=8)  # 4 nodes: 24 of 31 peers are remote
    assert np.allclose(s4.bytes_inter / s4.bytes_intra, 24 / 7)


def test_ring_and_allgather_link_split() -> None:
    T, P, kvb = 131072, 32, GQA.kv_token_bytes
    L = dist.doc_lengths("sft", T, 0)
    r = sc.ring(L, P, GQA, gpus_per_node=8)
    total = (2 * (T - T // P) + T) * kvb  # KV fwd, KV again in bwd, dK/dV accumulator
    boundary = np.arange(P) % 8 == 0
    assert np.allclose(r.bytes_inter, np.where(boundary, total, 0))
    assert np.allclose(r.bytes_intra, np.where(boundary, 0, total))
    assert np.all(sc.ring(L, 8, GQA).bytes_inter == 0)
    ag = sc.allgather_kv(L, P, GQA)
    assert np.allclose(ag.bytes_inter + ag.bytes_intra, 3 * (T - T // P) * kvb)
    assert np.allclose(ag.bytes_inter, 3 * (T - T // 4) / 8 * kvb)
    u = sc.usp(L, 8, 4, GQA)  # Ulysses inside nodes, ring across: the ring always crosses nodes
    assert np.all(u.ring.inter) and np.all(u.bytes_inter > 0)


def test_hsap_adapter_with_hand_made_stats() -> None:
    send = np.array([[0, 10, 0, 4], [0, 0, 6, 0], [0, 0, 0, 0], [2, 0, 0, 0]])
    stats = {"tokens": [5, 5, 5, 5], "attn_work": [15, 20, 25, 30], "recv_kv_tokens": list(send.sum(0)),
             "send_kv_pairs": send.tolist(), "local_attn_work": [15, 5, 10, 30]}
    kvb = GQA.kv_token_bytes
    s = hs.hsap_stats_from_plan(stats, GQA, gpus_per_node=2)  # nodes {0, 1}, {2, 3}
    assert s.P == 4 and s.correct and s.feasible and s.ring is None
    assert np.array_equal(s.recv_kv, [2, 10, 6, 4]) and np.array_equal(s.work, [15, 20, 25, 30])
    fwd_intra = np.array([0, 10, 0, 0]) * kvb  # 0->1 intra; 1->2 inter; 0->3 inter; 3->0 inter
    fwd_inter = np.array([2, 0, 6, 4]) * kvb
    bwd_intra = np.array([10, 0, 0, 0]) * kvb  # dK/dV go back along the reversed edges
    bwd_inter = np.array([4, 6, 0, 2]) * kvb
    assert np.allclose(s.bytes_intra, fwd_intra + bwd_intra) and np.allclose(s.bytes_inter, fwd_inter + bwd_inter)
    assert np.array_equal(s.hideable_work, [15, 5, 10, 30])
    s2 = hs.hsap_stats_from_plan(stats, GQA, gpus_per_node=4, U=2)  # 4 parts x 2 GPUs
    assert s2.P == 8 and np.allclose(s2.work, np.repeat([15, 20, 25, 30], 2) / 2)
    assert s2.tokens.sum() == 20 and {p.name for p in s2.phases} >= {"a2a_qkv", "p2p_kv"}
    assert np.all(s2.recv_kv > np.repeat(np.array([2, 10, 6, 4]) * 8 / 2 / 8, 2) - 1e-9)
    by_rank = {"tokens": [3, 2] * 4, "attn_work": list(np.repeat([15, 20, 25, 30], 2) / 2),
               "recv_kv_tokens": list(np.repeat(send.sum(0), 2)), "send_kv_pairs": send.tolist()}
    s3 = hs.hsap_stats_from_plan(by_rank, GQA, gpus_per_node=4, U=2)  # the layout Plan.stats() returns
    for f in ("tokens", "work", "recv_kv", "bytes_intra", "bytes_inter"):
        assert np.allclose(getattr(s3, f), getattr(s2, f)), f
    with pytest.raises(ValueError):
        hs.hsap_stats_from_plan({**by_rank, "tokens": [1] * 5}, GQA, U=2)


# ----------------------------------------------------------------------------- cost model
def _faster(hw: cm.HardwareSpec, k: float) -> cm.HardwareSpec:
    return dataclasses.replace(hw, intra_bw=hw.intra_bw * k, inter_bw=hw.inter_bw * k)


@pytest.mark.parametrize("name", ["single", "longtail", "sft", "mixed"])
@pytest.mark.parametrize("hw_name", ["A100", "H100"])
@pytest.mark.parametrize("nodes", [1, 4])
def test_cost_model_bound_and_monotonic(name: str, hw_name: str, nodes: int) -> None:
    T = 131072
    hw = cm.HARDWARE[hw_name]
    a = cm.CostAssumptions()
    for model in cm.MODELS.values():
        stats = sc.all_schemes(dist.doc_lengths(name, T, 0), 8 * nodes, model)
        rows = cm.predict_all(stats, model, hw, nodes, a)
        assert rows[-1]["scheme"] == "bound"
        for s, r in zip(stats.values(), rows):
            assert r["time_s_if_feasible"] >= r["bound_time_s"] * (1 - 1e-12), r["scheme"]
            assert r["tgs"] <= r["bound_tgs"] or not r["feasible"]
            fast = cm.predict(s, model, _faster(hw, 4.0), nodes, a)["time_s_if_feasible"]
            assert fast <= r["time_s_if_feasible"] * (1 + 1e-12), r["scheme"]
            slow = cm.predict(s, model, hw, nodes, dataclasses.replace(a, alpha_inter_s=1e-3, alpha_intra_s=1e-3))
            assert slow["time_s_if_feasible"] >= r["time_s_if_feasible"] * (1 - 1e-12)
            better = cm.predict(s, model, hw, nodes, dataclasses.replace(a, attn_efficiency=0.9))
            assert better["time_s_if_feasible"] <= r["time_s_if_feasible"] * (1 + 1e-12)


def test_cost_model_bound_closed_form_and_checks() -> None:
    m, hw = cm.MODELS["llama2-7b"], cm.HARDWARE["H100"]
    params = 4096 * 128 * (64 + 64) + 3 * 4096 * 11008
    T = 131072
    b = cm.bound(T, T * (T + 1) // 2, m, hw, 8)
    flops = 32 * (6 * params * T + 14 * 128 * 32 * T * (T + 1) / 2)
    assert b["time_s"] == pytest.approx(flops / (8 * 989e12)) and b["tgs"] == pytest.approx(T / (8 * b["time_s"]))
    s = sc.ring(np.array([T]), 8, m)
    with pytest.raises(ValueError):
        cm.predict(s, m, hw, 4)  # P = 8, but 4 nodes x 8
    with pytest.raises(ValueError):
        cm.predict(s, cm.MODELS["llama3-8b"], hw, 1)  # stats built for the other head shape
    inf = cm.predict(sc.ulysses(np.array([T]), 64, m), m, hw, 8)
    assert inf["time_s"] == float("inf") and inf["tgs"] == 0.0


def test_ring_and_local_overlap_rules() -> None:
    m, hw = cm.MODELS["llama3-8b"], cm.HARDWARE["A100"]
    a = cm.CostAssumptions()
    L = dist.doc_lengths("single", 131072, 0)
    z = sc.zigzag_ring(L, 8, m)
    free = dataclasses.replace(hw, intra_bw=1e30, inter_bw=1e30)
    r0 = cm.predict(z, m, free, 1, dataclasses.replace(a, alpha_intra_s=0.0, alpha_inter_s=0.0))
    pair_s = 4 * 128 * 32 / (hw.peak_flops * a.attn_efficiency)
    assert r0["layer"]["attn_fwd"] == pytest.approx(z.work.max() * pair_s)  # nothing exposed
    slow = cm.predict(z, m, dataclasses.replace(hw, intra_bw=1e9), 1, a)
    kv_time = (131072 - 16384) * m.kv_token_bytes / (1e9 * a.link_efficiency)
    assert slow["layer"]["attn_fwd"] >= kv_time  # bandwidth-bound ring: the transfers dominate
    # hf_hsap-style batched P2P: hidden behind local work when there is enough of it
    send = np.full((8, 8), 1000) - 1000 * np.eye(8)
    base = {"tokens": [16384] * 8, "attn_work": [1e9] * 8, "recv_kv_tokens": [7000] * 8, "send_kv_pairs": send}
    hidden = cm.predict(hs.hsap_stats_from_plan({**base, "local_attn_work": [9e8] * 8}, m), m, hw, 1, a)
    exposed = cm.predict(hs.hsap_stats_from_plan(base, m), m, hw, 1, a)
    assert hidden["layer"]["attn_fwd"] == pytest.approx(1e9 * pair_s)
    assert exposed["layer"]["attn_fwd"] > hidden["layer"]["attn_fwd"]


def test_calibration_file(tmp_path) -> None:
    path = tmp_path / "calibration.json"
    assert cm.load_assumptions("H100", path) == cm.CostAssumptions()  # missing file: defaults
    path.write_text(json.dumps({"attn_efficiency": 0.4, "hardware": {"H100": {"gemm_efficiency": 0.8}},
                                "source": "test"}))
    a = cm.load_assumptions("H100", path)
    assert a.attn_efficiency == 0.4 and a.gemm_efficiency == 0.8
    assert cm.load_assumptions("A100", path).gemm_efficiency == cm.GEMM_EFFICIENCY
    path.write_text(json.dumps({"attn_eff": 0.4}))
    with pytest.raises(ValueError):
        cm.load_assumptions("H100", path)
    path.write_text(json.dumps({"attn_efficiency": 1.5}))
    with pytest.raises(ValueError):
        cm.load_assumptions("H100", path)


def test_rounds_dataflow_matches_the_batched_formula_and_credits_pipelining():
    """One batched round: the round simulation gives the forward of ``max(local, transfer) + remote``;
    on one long document over InfiniBand, ``by_peer`` rounds predict a faster forward than one round."""
    import hf_hsap
    from benchmarks.analytic.traffic import hsap_scheme

    m, hw = cm.MODELS["llama2-7b"], cm.HARDWARE["A100"]
    lengths = np.array([131072])
    a = cm.load_assumptions("A100", path=None)
    preds = {}
    for rounds in ("batched", "by_peer"):
        plan = hf_hsap.plan_sequence([0, 131072], 64, ulysses_size=8, rounds=rounds)
        s = hsap_scheme(plan, lengths, m, 8, rounds)
        assert s.rounds is not None and s.rounds.work.shape[1] == (1 if rounds == "batched" else 7)
        preds[rounds] = cm.predict(s, m, hw, 8, a)
        if rounds == "batched":  # the closed form, from the same counts
            flat = cm.predict(dataclasses.replace(s, rounds=None), m, hw, 8, a)
            assert preds[rounds]["layer"]["attn_fwd"] == pytest.approx(flat["layer"]["attn_fwd"], rel=1e-9)
    assert preds["by_peer"]["layer"]["attn_fwd"] < 0.8 * preds["batched"]["layer"]["attn_fwd"]


def test_the_benchmarks_draw_the_library_s_rows():
    """One sampler: the benchmarks' document lengths are hf_hsap's (``hsap-plan --dist`` draws the same rows)."""
    assert dist.doc_lengths is lib_doc_lengths
