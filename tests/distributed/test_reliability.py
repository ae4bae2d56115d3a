"""Reliability: faults end quickly with a clear error, results are deterministic, NaN propagates as
in single-device attention, receive buffers stay within the budget, and a bounded stress test."""
import os

import pytest
import torch.multiprocessing as mp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_hsap.testing import free_port
from test_sap_attention import assert_exact, cu_of
from workers.reliability import check_nan_propagation, fault_worker
from workers.sap import check_attention

FAULT_TIMEOUT_S = 4.0


@pytest.mark.parametrize("mode", ["die", "stall"])
def test_dead_or_stalled_rank_fails_the_others_within_timeout(mode):
    world = 3
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=fault_worker, args=(r, world, port, mode, FAULT_TIMEOUT_S, results), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        got = {}
        for _ in range(world - 1):  # the survivors must report (the bad rank may not)
            rank, kind, elapsed, msg = results.get(timeout=120)
            got[rank] = (kind, elapsed, msg)
        survivors = {r: v for r, v in got.items() if r != world - 1}
        assert len(survivors) == world - 1 or len(got) == world - 1, got
        for rank, (kind, elapsed, msg) in survivors.items():
            assert kind == "HSAPCommError", (rank, kind, msg)
            assert "no answer from global rank" in msg and "timeout_s" in msg, msg
            assert elapsed < FAULT_TIMEOUT_S * 5, f"rank {rank} took {elapsed:.1f}s to fail"
    finally:
        for p in procs:
            p.join(timeout=1)
            if p.is_alive():
                p.kill()


def test_bitwise_deterministic(pools):
    args = (cu_of([5, 40, 1, 22, 9]), 4, 2, "auto", 4, 2, 8, "float32", 123)
    a = pools(4).run(check_attention, *args)
    b = pools(4).run(check_attention, *args)
    assert [r["digest"] for r in a] == [r["digest"] for r in b]
    c = pools(4).run(check_attention, *args[:-1], 124)
    assert [r["digest"] for r in a] != [r["digest"] for r in c]


@pytest.mark.parametrize("where", ["key", "query"])
def test_nan_propagates_like_single_device(pools, where):
    for r in pools(3).run(check_nan_propagation, 3, where):
        assert r["got"] == r["want"]
    assert sum(r["n_nan"] for r in pools(3).run(check_nan_propagation, 3, where)) > 0


@pytest.mark.parametrize("budget", [None, 5, 16])
def test_receive_buffers_within_budget(pools, budget):
    res = pools(4).run(check_attention, cu_of([90, 4, 30, 3]), 4, 1, "zigzag", 2, 1, 8, "float64", 9, budget)
    assert_exact(res, "float64")
    for r in res:
        limit = max(r["plan_recv"], r["plan_send"]) if budget is None else budget
        assert r["max_recv_rows"] <= limit
    assert max(r["max_recv_rows"] for r in res) > 0


group_shapes = st.sampled_from([(2, 1), (2, 2), (3, 1), (4, 1), (4, 2), (4, 4)])


@settings(max_examples=int(os.environ.get("HSAP_STRESS_EXAMPLES", "20")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=14), shape=group_shapes,
       placement=st.sampled_from(["contiguous", "zigzag", "balanced", "auto"]),
       heads=st.sampled_from([(4, 1), (4, 2), (4, 4), (8, 2)]),
       budget=st.one_of(st.none(), st.integers(1, 50)), seed=st.integers(0, 2**31 - 1))
def test_stress_random_layouts_and_groups(pools, lengths, shape, placement, heads, budget, seed):
    """Property test; HSAP_STRESS_EXAMPLES=2000 for a long run."""
    world, U = shape
    if sum(lengths) < world:
        lengths = lengths + [world]
    res = pools(world).run(check_attention, cu_of(lengths), world, U, placement, *heads, 8, "float64", seed, budget)
    assert_exact(res, "float64")
