"""The pure planner: placements, minimal transfers, compiled schedules, stats, validation."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import ci_examples

import hf_hsap
from hf_hsap import CostModel, PlanCache, plan_sequence
from hf_hsap.data.lengths import doc_lengths
from hf_hsap.data.positions import check_position_ids, cu_seqlens_from_position_ids
from hf_hsap.plan.layout import make_layout

PLACEMENTS = ["contiguous", "zigzag", "balanced", "density", "auto"]


def cu_of(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def brute_force_need(owner: np.ndarray, cu: np.ndarray, n_parts: int) -> set:
    """(part, token) pairs a part needs: not held, same document, at or before a held query."""
    doc = np.searchsorted(cu, np.arange(len(owner)), side="right") - 1
    need = set()
    for r in range(n_parts):
        held = np.nonzero(owner == r)[0]
        for d in set(doc[held].tolist()):
            last = held[doc[held] == d].max()
            need |= {(r, j) for j in range(cu[d], last + 1) if owner[j] != r}
    return need


layouts = st.lists(st.integers(1, 30), min_size=1, max_size=9)


@settings(max_examples=ci_examples(150))
@given(lengths=layouts, P=st.integers(1, 6), U=st.sampled_from([1, 2]), placement=st.sampled_from(PLACEMENTS))
def test_plan_is_minimal_partition_and_counts_exactly(lengths, P, U, placement):
    size = P * U
    cu = cu_of(lengths)
    T = int(cu[-1])
    if T < size:
        with pytest.raises(ValueError, match="at least one token"):
            plan_sequence(cu, size, placement, ulysses_size=U)
        return
    plan = plan_sequence(cu, size, placement, ulysses_size=U)
    # the ranks' tokens partition [0, T), each rank in global order
    parts = [plan.local_token_indices(r).numpy() for r in range(size)]
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(T))
    assert all(np.all(np.diff(p) > 0) for p in parts)
    assert all(len(p) >= 1 for p in parts)
    # transfers == brute-force need, each (part, token) exactly once, from its owner
    owner = np.empty(T, dtype=np.int64)
    for r in range(plan.n_parts):
        owner[plan.part_token_indices(r)] = r
    got = []
    tr = plan.transfers
    for s, e, src, dst in zip(tr.start, tr.end, tr.src, tr.dst):
        assert (owner[s:e] == src).all()
        got += [(int(dst), j) for j in range(s, e)]
    assert len(got) == len(set(got))
    assert set(got) == brute_force_need(owner, cu, plan.n_parts)
    # stats
    st_ = plan.stats()
    assert sum(st_.tokens) == T
    L = np.asarray(lengths)
    assert sum(st_.attn_work) == pytest.approx(int((L * (L + 1) // 2).sum()))
    doc_of = np.searchsorted(cu, np.arange(T), side="right") - 1
    for r in range(size):
        assert st_.recv_kv_tokens[r] == sum(1 for (d, _) in got if d == r // U)
        held = plan.part_token_indices(r // U)
        same_doc = doc_of[held][:, None] == doc_of[held][None, :]
        local_pairs = int((same_doc & (held[None, :] <= held[:, None])).sum())
        assert st_.local_attn_work[r] == pytest.approx(local_pairs / U)
    # compiled schedules receive exactly the transfers, and every remote key is used
    for part in range(plan.n_parts):
        sched = plan.schedule(part)
        assert sched.recv_tokens == st_.recv_kv_tokens[part * U]
        assert sched.n_local == len(plan.part_token_indices(part))


@pytest.mark.parametrize("placement", ["contiguous", "zigzag", "balanced", "density", "auto"])
@pytest.mark.parametrize("dist", ["longtail", "sft", "mixed", "single"])
def test_token_bound(placement, dist):
    T, P = 131072, 8
    plan = plan_sequence(cu_of(doc_lengths(dist, T, 0)), P, placement)
    eps = 0.10 if placement in ("balanced", "density", "auto") else 0.0
    assert max(plan.stats().tokens) <= int(np.ceil(T / P) * (1 + eps))


@settings(max_examples=ci_examples(40))
@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=8), budget=st.integers(1, 20))
def test_rounds_respect_budget_and_cover_transfers(lengths, budget):
    cu = cu_of(lengths)
    if cu[-1] < 3:
        return
    plan = plan_sequence(cu, 3, "zigzag", recv_budget_tokens=budget)
    for part in range(3):
        sched = plan.schedule(part)
        assert all(r.recv_total <= budget for r in sched.rounds)
        assert all(r.send_index.shape[0] <= budget for r in sched.rounds)
        assert sched.recv_tokens == plan.stats().recv_kv_tokens[part]
    sent = sum(plan.schedule(p).send_tokens for p in range(3))
    assert sent == sum(plan.stats().recv_kv_tokens)


def test_cache_returns_same_plan():
    cache = PlanCache(maxsize=2)
    a = plan_sequence([0, 5, 9], 2, cache=cache)
    b = plan_sequence(torch.tensor([0, 5, 9]), 2, cache=cache)
    c = plan_sequence([0, 4, 9], 2, cache=cache)
    assert a is b and a is not c and cache.hits == 1 and cache.misses == 2


def test_shard_unshard_roundtrip():
    plan = plan_sequence([0, 3, 20, 21, 40], 4, "zigzag")
    x = torch.randn(40, 3)
    pieces = [plan.shard(x, rank=r) for r in range(4)]
    assert torch.equal(plan.unshard(pieces), x)
    y = torch.randn(2, 40)
    assert torch.equal(plan.unshard([plan.shard(y, 1, rank=r) for r in range(4)], dim=1), y)


@pytest.mark.parametrize("cu,match", [
    ([1, 5, 9], "start at 0"),
    ([0, 5, 5, 9], "strictly increasing"),
    ([0, 7, 5], "strictly increasing"),
    ([0], "at least one document"),
    ([[0, 4], [4, 8]], "1-D"),
])
def test_bad_cu_seqlens(cu, match):
    with pytest.raises(ValueError, match=match):
        plan_sequence(cu, 2)


def test_other_bad_input():
    with pytest.raises(ValueError, match="ends at 9 but the batch has 10"):
        plan_sequence([0, 4, 9], 2, total_tokens=10)
    with pytest.raises(ValueError, match="integers"):
        plan_sequence(torch.tensor([0.0, 4.0]), 2)
    with pytest.raises(ValueError, match="unknown placement"):
        plan_sequence([0, 4, 9], 2, "diagonal")
    with pytest.raises(ValueError, match="at least one token"):
        plan_sequence([0, 3], 4)
    with pytest.raises(ValueError, match="multiple of ulysses_size"):
        plan_sequence([0, 30], 4, ulysses_size=3)
    with pytest.raises(ValueError, match="recv_budget_tokens"):
        plan_sequence([0, 30], 2, recv_budget_tokens=0)
    plan = plan_sequence([0, 30], 1)
    q = torch.randn(29, 4, 8)
    with pytest.raises(ValueError, match="holds 30 tokens"):
        hf_hsap.hsap_attn_func(q, q[:, :2], q[:, :2], plan)
    q = torch.randn(30, 3, 8)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        hf_hsap.hsap_attn_func(q, q[:, :2], q[:, :2], plan)
    with pytest.raises(ValueError, match="offline"):
        hf_hsap.hsap_attn_func(q, q, q, plan_sequence([0, 30], 2))


def test_position_ids_helpers():
    pos = torch.tensor([[0, 1, 2, 0, 1], [0, 0, 1, 2, 3]])
    cu = cu_seqlens_from_position_ids(pos)
    assert cu.tolist() == [0, 3, 5, 6, 10]
    check_position_ids(pos, make_layout(cu))
    with pytest.raises(ValueError, match="disagree with cu_seqlens"):
        check_position_ids(pos, make_layout([0, 2, 5, 6, 10]))


def test_shard_batch_refuses_inconsistent_position_ids():
    import hf_hsap

    ids = torch.arange(10).reshape(1, 10)
    batch = {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4, 0, 1]]),
             "cu_seq_lens_q": torch.tensor([0, 3, 8, 10])}
    out = hf_hsap.shard_batch(batch, None)
    assert out["input_ids"].shape == (1, 10)
    batch["cu_seq_lens_q"] = torch.tensor([0, 4, 8, 10])
    with pytest.raises(ValueError, match="disagree with cu_seqlens"):
        hf_hsap.shard_batch(batch, None)


def test_auto_ulysses_rule():
    from hf_hsap.topology import auto_ulysses_size

    assert auto_ulysses_size(16, 8, 32) == 8  # several nodes: fill the node
    assert auto_ulysses_size(16, 8, 12) == 4  # heads cap it
    assert auto_ulysses_size(6, 8, 32) == 2  # groups of 6 straddle 8-GPU nodes: divide both
    assert auto_ulysses_size(4, 4, None) == 1  # one node: pure SAP
    assert auto_ulysses_size(8, 8, 32) == 1
    assert auto_ulysses_size(4, 8, 32) == 1  # two SP groups per node
    assert auto_ulysses_size(16, 8, 7) == 1


def test_sap_link_and_default_cost():
    """The default cost model of ``auto`` follows the link SAP's KV takes."""
    from hf_hsap.topology import SPGroup

    assert SPGroup(size=4, ulysses_size=1, rank=0, global_ranks=(4, 5, 6, 7), gpus_per_node=8).sap_link == "nvlink"
    assert SPGroup(size=4, ulysses_size=1, rank=0, global_ranks=(6, 7, 8, 9), gpus_per_node=8).sap_link == "network"
    assert SPGroup(size=2, ulysses_size=1, rank=0, global_ranks=(0, 1)).sap_link == "network"  # unknown
    assert hf_hsap.CostModel.for_link("nvlink").kv_token_cost < hf_hsap.CostModel.for_link("network").kv_token_cost
    with pytest.raises(ValueError, match="unknown link"):
        hf_hsap.CostModel.for_link("pcie")
    # offline: a group inside one node plans with NVLink costs, accepting more KV for less token slack
    cu = cu_of(doc_lengths("mixed", 131072, 0))
    one_node = hf_hsap.plan_sequence(cu, 8, gpus_per_node=8).stats()
    network = hf_hsap.plan_sequence(cu, 8).stats()
    assert one_node == hf_hsap.plan_sequence(cu, 8, cost=hf_hsap.CostModel.nvlink()).stats()
    assert max(one_node.tokens) <= max(network.tokens)


def test_shard_batch_plans_with_its_config():
    batch = {"input_ids": torch.arange(40).reshape(1, 40), "position_ids": torch.tensor([list(range(25)) + list(range(15))])}
    cfg = hf_hsap.HSAPConfig(rounds="by_peer", recv_budget_tokens=8)
    plan = hf_hsap.shard_batch(batch, None, config=cfg)["hsap_plan"]
    assert plan.round_order == "by_peer" and plan.recv_budget_tokens == 8
    # a placement override is validated by the config
    assert hf_hsap.shard_batch(batch, None, "zigzag", config=cfg)["hsap_plan"].placement_name == "zigzag"
    with pytest.raises(ValueError, match=r"HSAPConfig\.placement="):
        hf_hsap.shard_batch(batch, None, "spread", config=cfg)


def test_cost_model_from_config():
    from types import SimpleNamespace

    cfg = SimpleNamespace(num_attention_heads=32, num_key_value_heads=8, hidden_size=4096, intermediate_size=14336)
    a100 = hf_hsap.CostModel.from_config(cfg, "network", "A100")
    assert a100.token_cost == pytest.approx(17930, rel=1e-3) and a100.kv_token_cost == pytest.approx(1226, rel=1e-3)
    h100 = hf_hsap.CostModel.from_config(cfg, "network", "H100")
    assert h100.kv_token_cost > a100.kv_token_cost  # compute gets 3.2x faster, the network only 2x
    mha = hf_hsap.CostModel.from_config(SimpleNamespace(num_attention_heads=32, hidden_size=4096), "nvlink", "A100")
    assert mha.kv_token_cost > 3 * hf_hsap.CostModel.from_config(cfg, "nvlink", "A100").kv_token_cost
    # the q, k, v projections' share of a token's GEMMs: 4096 x (4096 + 2 x 1024) of 218 M parameters a layer
    assert a100.qkv_share == pytest.approx(4096 * 6144 / (4096 * 128 * 80 + 3 * 4096 * 14336))
    assert a100.qkv_share == pytest.approx(hf_hsap.CostModel().qkv_share, abs=0.002)
    assert 0 < mha.qkv_share < 1 and mha.qkv_share > a100.qkv_share  # 32 kv heads project more
    for bad in (-0.1, 1.5, True):
        with pytest.raises(ValueError, match="qkv_share must lie in"):
            hf_hsap.CostModel(qkv_share=bad)
    with pytest.raises(ValueError, match="unknown hardware"):
        hf_hsap.CostModel.from_config(cfg, "network", "TPU")
    with pytest.raises(ValueError, match="unknown link"):
        hf_hsap.CostModel.from_config(cfg, "pcie", "A100")


@settings(max_examples=ci_examples(200))
@given(L=st.integers(1, 5000), k=st.integers(1, 40), rot=st.integers(0, 200))
def test_balanced_split_arithmetic_matches_zigzag(L, k, rot):
    """``balanced``'s per-document split helpers agree with the vectorised zigzag chunker and with the
    definitions (pair work = pairs of its two chunks; pair recv = everything before its second chunk's
    end minus its own chunks)."""
    from hf_hsap.plan.balanced import _chunk_sizes, _pair_recv, _pair_work
    from hf_hsap.plan.placement import _zigzag_chunks

    sizes, nxt = _chunk_sizes(L, k, rot)
    ref, ref_nxt = _zigzag_chunks(np.array([L]), k, rot)
    assert sizes == ref[0].tolist() and nxt == ref_nxt
    ends = np.cumsum(sizes)
    starts = ends - np.array(sizes)
    for i, (w, r) in enumerate(zip(_pair_work(sizes), _pair_recv(sizes))):
        j = 2 * k - 1 - i
        pairs = sum(int(x) + 1 for c in (i, j) for x in range(starts[c], ends[c]))
        assert w == pairs
        assert r == ends[j] - sizes[i] - sizes[j]


@settings(max_examples=ci_examples(100))
@given(rows=st.lists(st.integers(0, 200), max_size=80, unique=True), shuffle=st.booleans())
def test_index_runs_cover_the_index_in_order(rows, shuffle):
    """``index_runs`` lists the rows of an index, in order, as runs of consecutive rows (or gives up
    beyond MAX_RUNS runs, when the runtime falls back to ``index_select``)."""
    from hf_hsap.plan.schedule import MAX_RUNS, index_runs

    idx = np.array(rows if shuffle else sorted(rows), dtype=np.int64)
    runs = index_runs(idx)
    n_runs = 1 + int(np.count_nonzero(np.diff(idx) != 1)) if idx.size else 0
    if n_runs > MAX_RUNS:
        assert runs is None
        return
    assert len(runs) == n_runs and all(b > a for a, b in runs)
    flat = [r for a, b in runs for r in range(a, b)]
    assert flat == idx.tolist()


@pytest.mark.parametrize("U", [1, 2])
def test_est_time_is_the_cost_models_step_time_of_each_rank(U: int) -> None:
    """``stats().est_time``: token_cost * tokens + max(local, kv_token_cost * recv) + remote, per part,
    split over its U ranks, with the all-to-all's share added to the token cost for U > 1; computed here
    from the other per-rank figures of the same stats."""
    cost = CostModel(token_cost=50.0, kv_token_cost=7.0, round_cost=1.0, a2a_token_cost=3.0)
    token_cost = 50.0 + 3.0 * (U - 1) / U
    lengths = [3000, 700, 5000, 120, 2600, 900, 40, 1500]
    plan = plan_sequence(np.concatenate([[0], np.cumsum(lengths)]), 4, "balanced", ulysses_size=U, cost=cost)
    st = plan.stats()
    for r in range(4):
        part = [q for q in range(4) if q // U == r // U]
        tokens = sum(st.tokens[q] for q in part)  # the part's tokens
        work, local = st.attn_work[r] * U, st.local_attn_work[r] * U  # the part's pairs (all heads)
        want = token_cost * tokens + max(local, cost.kv_token_cost * st.recv_kv_tokens[r]) + work - local
        assert st.est_time[r] == pytest.approx(want / U, rel=1e-12)
    assert len(plan_sequence(np.concatenate([[0], np.cumsum(lengths)]), 4, "auto").stats().est_time) == 4


@pytest.mark.parametrize("bad", [{"token_cost": -1.0}, {"kv_token_cost": float("nan")}, {"round_cost": "60000"},
                                 {"token_cost": float("inf")}, {"a2a_token_cost": -3.0}])
def test_cost_model_rejects_bad_costs(bad: dict) -> None:
    with pytest.raises(ValueError, match="finite number >= 0.*from_config"):
        CostModel(**bad)


def test_all_to_all_cost_of_the_hierarchy() -> None:
    """from_config prices a token's q, k, v, out and their gradients over NVLink (Llama-3-8B on A100:
    2 * (2 * 32 + 2 * 8) * 128 * 2 bytes at 240 GB/s against one pair's 57344 FLOPs at 171.6 TFLOP/s);
    for_ulysses adds its (U - 1) / U share to the token cost and leaves U = 1 alone."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(num_attention_heads=32, num_key_value_heads=8, hidden_size=4096, intermediate_size=14336)
    for link in ("nvlink", "network"):
        c = CostModel.from_config(cfg, link, "A100")
        assert c.a2a_token_cost == pytest.approx((40960 / 240e9) / (57344 / (312e12 * 0.55)), rel=1e-9)
    assert c.for_ulysses(1) is c
    assert c.for_ulysses(8).token_cost == pytest.approx(c.token_cost + c.a2a_token_cost * 7 / 8)
    assert CostModel().a2a_token_cost == pytest.approx(c.a2a_token_cost, rel=1e-3)  # the defaults agree
