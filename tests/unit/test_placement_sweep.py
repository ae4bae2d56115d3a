"""``placement="auto"`` is never worse than a simpler placement by its own cost model; the density
placement and zigzag's closed-form price agree with the figures the plan uses (the offline optimiser against the
plan: tests/benchmarks/test_planner_against_bounds.py)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import assert_covers_once, ci_examples, cost_of, cu_of, layouts
from hf_hsap.plan.cost import CostModel, balance_bound, part_times, step_time, zigzag_part_times, zigzag_time_bound
from hf_hsap.plan.density import density
from hf_hsap.plan.group import GroupSpec
from hf_hsap.plan.layout import make_layout
from hf_hsap.plan.placement import zigzag
from hf_hsap.plan.planner import plan_layout
from hf_hsap.plan.transfers import compute_transfers
from hf_hsap.plan.windows import window_transfers

OTHERS = ("contiguous", "zigzag", "balanced", "density")


@settings(max_examples=ci_examples(60))
@given(lengths=layouts(), P=st.integers(2, 12), U=st.sampled_from([1, 2]), link=st.sampled_from(["nvlink", "network"]))
def test_auto_is_never_worse_than_a_simpler_placement(lengths, P, U, link):
    layout = make_layout(cu_of(lengths))
    if layout.total_tokens < P * U:
        return
    group = GroupSpec.offline(P * U, U, P * U if link == "nvlink" else U)
    plan_cost = CostModel.for_link(group.link)
    cost = plan_cost.for_ulysses(U)
    auto = plan_layout(layout, group, "auto", cost=plan_cost)
    t_auto = part_times(layout, auto.placement, auto.transfers, cost).max()
    assert t_auto >= balance_bound(layout, P, cost) * (1 - 1e-12)  # the compute lower bound holds
    for name in OTHERS:
        pl = plan_layout(layout, group, name, cost=plan_cost).placement
        t = part_times(layout, pl, compute_transfers(pl), cost).max()
        assert t_auto <= t * (1 + 1e-12), (name, t_auto, t)


@settings(max_examples=ci_examples(30))
@given(lengths=layouts(max_docs=20), P=st.integers(2, 8), W=st.integers(2, 600), full=st.integers(0, 2))
def test_auto_is_never_worse_with_windowed_layers(lengths, P, W, full):
    layout = make_layout(cu_of(lengths))
    if layout.total_tokens < P:
        return
    layers = {W: 3, **({None: full} if full else {})}
    group = GroupSpec.offline(P, 1, P)
    cost = CostModel.for_link(group.link)
    auto = plan_layout(layout, group, "auto", cost=cost, windows=layers)
    kinds, counts = auto.windows, auto.layer_counts
    t_auto = step_time(layout, auto.placement, {w: auto.kind(w).transfers for w in kinds}, counts, cost)
    for name in OTHERS:
        pl = plan_layout(layout, group, name, cost=cost, windows=layers).placement
        t = step_time(layout, pl, {w: window_transfers(pl, layout, w) for w in kinds}, counts, cost)
        assert t_auto <= t * (1 + 1e-12), (name, t_auto, t)


@settings(max_examples=ci_examples(60))
@given(lengths=layouts(), P=st.integers(1, 16), slack=st.sampled_from([0.0, 0.03, 0.10]))
def test_density_is_a_placement_within_the_token_cap(lengths, P, slack):
    layout = make_layout(cu_of(lengths))
    if layout.total_tokens < P:
        return
    pl = density(layout, P, CostModel.nvlink().token_cost, slack)
    assert_covers_once(layout, pl)
    assert pl.tokens_per_part().max() <= math.ceil(layout.total_tokens / P) * (1 + slack)


def test_density_splits_a_work_dense_document_over_the_parts_its_work_needs():
    # the row: P = 32, a 46K-token document among short ones. balanced's token-led split gave it 12
    # parts at 92.8M pairs each (mean 67M); density gives it as many parts as its pairs need
    rng = np.random.default_rng(0)
    short = np.clip(rng.lognormal(np.log(800), 1.0, 2000), 16, 20000).astype(int)
    short = short[: np.searchsorted(np.cumsum(short), 131072 - 46000)]
    lengths = [46000] + short.tolist()
    layout = make_layout(cu_of(lengths))
    P = 32
    pl = density(layout, P, CostModel.nvlink().token_cost, 0.10)
    work = pl.work_per_part(layout)
    parts_of_big = np.unique(pl.part[pl.doc == 0])
    big_work = 46000 * 46001 // 2
    assert parts_of_big.size >= math.ceil(big_work / work.mean())  # its pairs, not its tokens (~12), decide
    load = work + CostModel.nvlink().token_cost * pl.tokens_per_part()  # what it evens out
    assert load.max() / load.mean() < 1.05


@settings(max_examples=ci_examples(60))
@given(lengths=layouts(), P=st.integers(1, 12), link=st.sampled_from(["nvlink", "network", "cpu"]))
def test_zigzag_closed_form_equals_its_built_figures(lengths, P, link):
    layout = make_layout(cu_of(lengths))
    cost = cost_of(link)
    pl = zigzag(layout, P)
    built = part_times(layout, pl, compute_transfers(pl), cost)
    assert np.allclose(zigzag_part_times(layout, P, cost), built, rtol=1e-12)
    assert zigzag_time_bound(layout, P, cost) <= built.max() * (1 + 1e-12)


def test_diagonal_blocks_price_a_split_document():
    # a causal piece of n rows computes n * min(n, 512) / 2 masked pairs: a part holding one whole
    # 512-token document pays 512 * 512 / 2 more, and splitting it in zigzag pays it per chunk pair
    layout = make_layout([0, 512])
    cost = CostModel(token_cost=0.0, kv_token_cost=0.0, diag_block=512)
    plain = CostModel(token_cost=0.0, kv_token_cost=0.0)
    whole = plan_layout(layout, GroupSpec.offline(1, 1, None), "contiguous", cost=cost).placement
    assert part_times(layout, whole, compute_transfers(whole), cost)[0] == 512 * 513 / 2 + 512 * 512 / 2
    zz = zigzag(layout, 2)
    t = part_times(layout, zz, compute_transfers(zz), cost)
    assert np.allclose(t - part_times(layout, zz, compute_transfers(zz), plain), [256 * 256 / 2] * 2)
    assert cost.masked_pairs(np.array([10, 1000])).tolist() == [50.0, 256000.0]


def test_choose_ulysses_size_prices_every_degree_up_to_ulysses():
    import hf_hsap

    cu = cu_of([3000, 40, 900, 60, 4000])
    best, times = hf_hsap.choose_ulysses_size(cu, 8, num_heads=8, gpus_per_node=8, memory_cap=False)
    assert set(times) == {1, 2, 4, 8}  # every divisor of P and of the heads, up to one part (Ulysses)
    assert best == min(times, key=lambda u: (times[u], u))
    capped, same = hf_hsap.choose_ulysses_size(cu, 8, num_heads=8, gpus_per_node=8)  # memory cap: 8 kv heads
    assert same == times and times[capped] >= times[best]
    group = GroupSpec.offline(8, 4, 8)  # U = 4 as the plan prices it: its part's time over U
    plan = plan_layout(make_layout(cu), group, "auto", cost=CostModel.for_link(group.link))
    assert times[4] == pytest.approx(part_times(plan.layout, plan.placement, plan.transfers, plan.cost).max() / 4)
    _, t6 = hf_hsap.choose_ulysses_size(cu, 8, num_heads=6, gpus_per_node=4)  # heads and node size limit U
    assert set(t6) == {1, 2}
    with pytest.raises(ValueError, match="no Ulysses degree"):
        hf_hsap.choose_ulysses_size([0, 5], 8, num_heads=8)


def test_overlap_prices_what_local_work_cannot_hide():
    # overlap 1 (GPU): max(local, kv); 0 (CPU ranks sharing cores): local + kv; between: the share hidden
    tokens, work, local, recv = np.array([10.0, 10.0]), np.array([500.0, 500.0]), np.array([300.0, 50.0]), np.array([2, 2])
    kw = dict(token_cost=1.0, kv_token_cost=100.0)
    gpu, cpu, half = CostModel(**kw), CostModel(**kw, overlap=0.0), CostModel(**kw, overlap=0.5)
    assert gpu.time_of(tokens, work, local, recv).tolist() == [10 + 300 + 200, 10 + 200 + 450]
    assert cpu.time_of(tokens, work, local, recv).tolist() == [10 + 500 + 200, 10 + 500 + 200]
    assert half.time_of(tokens, work, local, recv).tolist() == [10 + 500 + 100, 10 + 500 + 175]
    for bad in (-0.1, 1.5, True, float("nan")):
        with pytest.raises(ValueError, match="overlap"):
            CostModel(overlap=bad)


@settings(max_examples=ci_examples(25), deadline=None)
@given(layouts(), st.integers(2, 8))
def test_auto_never_worse_without_overlap(lengths, P):
    """With nothing hidden (overlap 0) `auto` still beats every simpler placement by its own model."""
    cost = CostModel(token_cost=0.0, kv_token_cost=30.0, overlap=0.0, diag_block=256)
    layout = make_layout(cu_of(lengths))
    if layout.total_tokens < P:
        return
    group = GroupSpec.offline(P, 1, P)
    best = plan_layout(layout, group, "auto", cost=cost)
    t_auto = step_time(layout, best.placement, {None: best.transfers}, {None: 1}, cost)
    for name in OTHERS:
        other = plan_layout(layout, group, name, cost=cost)
        assert t_auto <= step_time(layout, other.placement, {None: other.transfers}, {None: 1}, cost) * (1 + 1e-12), name


@settings(max_examples=ci_examples(20), deadline=None)
@given(layouts(max_docs=25), st.integers(2, 8), st.sampled_from(["nvlink", "network", "cpu"]))
def test_polish_never_loses_keeps_the_cap_and_is_bounded(lengths, P, link):
    from hf_hsap.plan.local_search import polish

    layout = make_layout(cu_of(lengths))
    if layout.total_tokens < P:
        return
    cost = cost_of(link)
    start = plan_layout(layout, GroupSpec.offline(P, 1, P), "balanced", cost=cost).placement
    t_start = float(part_times(layout, start, compute_transfers(start), cost).max())
    t, pl = polish(layout, P, cost, start, token_slack=0.10)
    assert_covers_once(layout, pl)
    cap = math.ceil(layout.total_tokens / P) * 1.10  # no move fills a part past it (nor does the start)
    assert start.tokens_per_part().max() <= cap and pl.tokens_per_part().max() <= cap
    assert t == pytest.approx(float(part_times(layout, pl, compute_transfers(pl), cost).max()))
    assert t <= t_start * (1 + 1e-12)
    again = polish(layout, P, cost, start, token_slack=0.10)[1]  # deterministic: every rank finds the same plan
    assert np.array_equal(again.start, pl.start) and np.array_equal(again.part, pl.part)
    t0, _ = polish(layout, P, cost, start, token_slack=0.10, max_rows=0)  # no budget: nothing moves
    assert t0 == pytest.approx(t_start)


def test_auto_polishes_its_winner_on_small_groups():
    """The winner of a small network-priced group is searched locally (local_search.polish) and the result kept where
    the search's rule accepts it; a group above POLISH_MAX_PARTS is not searched, a windowed plan not refined."""
    from hf_hsap.data.lengths import sweep_lengths
    from hf_hsap.plan.candidates import cheapest_candidate
    from hf_hsap.plan.auto import POLISH_MAX_PARTS, REFINEMENTS
    from hf_hsap.plan.local_search import polish
    from hf_hsap.plan.search import MARGIN, Search

    layout = make_layout(cu_of(sweep_lengths("lognormal-0.5", 6 * 2048, 0)))
    group = GroupSpec.offline(6, 1, 1)  # one rank per node: SAP's KV over the network
    cost = CostModel.for_link(group.link)
    plan = plan_layout(layout, group, "auto", cost=cost)
    s = Search(layout, 6, cost, 0.10)
    winner = cheapest_candidate(s)
    found = s.price(REFINEMENTS[0](s, winner))
    t_searched = polish(layout, 6, cost, winner.placement, token_slack=0.10)[0]  # the winner searched alone
    assert found.time == pytest.approx(t_searched) and found.time < winner.time * (1 - MARGIN)
    assert s.accepts(winner, found) and plan.placement_name == f"{winner.placement.name}+polish"
    t_auto = float(part_times(layout, plan.placement, plan.transfers, cost).max())
    assert t_auto <= t_searched * (1 + 1e-12)
    assert_covers_once(layout, plan.placement)
    big = Search(layout, POLISH_MAX_PARTS + 2, cost, 0.10)
    assert REFINEMENTS[0](big, cheapest_candidate(big)) is None  # not searched
    windowed = plan_layout(layout, group, "auto", cost=cost, windows=[None, 512])
    assert not windowed.placement_name.endswith("+polish")


@pytest.mark.parametrize("lengths,P", [([45, 57, 3, 9], 6), ([19, 9, 1, 3, 9, 2], 6), ([9, 9, 9], 3)])
def test_split_shares_keep_the_token_cap_on_tiny_rows(lengths, P):
    """A k-way split gives a part up to ceil(L / k) tokens, not L / k: the cap is tested against that (these
    rows once put 21 tokens under a cap of 20.9, and 9 under 8.8)."""
    from hf_hsap.plan.balanced import balanced

    layout = make_layout(cu_of(lengths))
    for eps in (0.0, 0.01, 0.1):
        cap = math.ceil(layout.total_tokens / P) * (1 + eps)
        for pl in (balanced(layout, P, eps), density(layout, P, 0.0, eps), density(layout, P, 1e3, eps)):
            assert_covers_once(layout, pl)
            assert pl.tokens_per_part().max() <= cap, (pl.name, eps)


@settings(max_examples=ci_examples(40), deadline=None)
@given(layouts(max_docs=12), st.integers(2, 9), st.sampled_from([0.0, 0.01, 0.1]))
def test_balanced_and_density_never_exceed_the_token_cap(lengths, P, eps):
    """Tokens max <= ceil(T / P) * (1 + eps) for the greedy placements, whatever the row (activation memory)."""
    from hf_hsap.plan.balanced import balanced

    layout = make_layout(cu_of(lengths))
    if layout.total_tokens < P:
        return
    cap = math.ceil(layout.total_tokens / P) * (1 + eps)
    for pl in (balanced(layout, P, eps), density(layout, P, 0.0, eps), density(layout, P, 1e3, eps)):
        assert pl.tokens_per_part().max() <= cap, (pl.name, eps)
