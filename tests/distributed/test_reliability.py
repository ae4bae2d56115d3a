"""Reliability: faults end in a clear error (not a hang), results are deterministic, NaN propagates as
in single-device attention, receive buffers stay within the budget, and a bounded stress test."""
import queue
import re

import pytest
import torch.multiprocessing as mp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import assert_exact, ci_examples, cu_of
from workers.reliability import check_nan_propagation, fault_worker
from workers.sap import check_attention

FAULT_TIMEOUT_S = 4.0  # the SP group's timeout_s in the fault test
HANG_GUARD_S = 120.0  # fails the fault test if a report never comes (a hang); never a timing check


def _peers_named(msg: str) -> list[int]:
    """The global ranks an HSAPCommError message names (``no answer from global rank(s) [1, 2]``)."""
    found = re.search(r"no answer from global rank\(s\) \[([\d, ]*)\]", msg)
    return [int(x) for x in found.group(1).split(",") if x.strip()] if found else []


@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["die", "stall"])
def test_dead_or_stalled_rank_fails_every_other_rank_with_a_comm_error(mode, tmp_path):
    """The last rank dies or stalls after planning: every other rank raises HSAPCommError naming it and the SP
    group's timeout. A stalled rank stays alive and silent until all of them have reported, so what ended their
    wait was the group's timeout, not the peer going away."""
    world = 3
    bad = world - 1
    ctx = mp.get_context("spawn")
    results, release = ctx.Queue(), ctx.Event()
    init_method = f"file://{tmp_path / 'rendezvous'}"
    procs = [ctx.Process(target=fault_worker, daemon=True,
                         args=(r, world, init_method, mode, FAULT_TIMEOUT_S, results, release, HANG_GUARD_S))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        got: dict[int, tuple[str, str]] = {}
        for _ in range(world - 1):
            try:
                rank, kind, msg = results.get(timeout=HANG_GUARD_S)
            except queue.Empty:
                pytest.fail(f"only {sorted(got)} reported: a rank hung instead of raising ({got})")
            got[rank] = (kind, msg)
        assert sorted(got) == list(range(bad)), got  # every survivor once, and not the stalled rank
        for rank, (kind, msg) in got.items():
            assert kind == "HSAPCommError", (rank, kind, msg)
            assert f"within the SP group timeout ({FAULT_TIMEOUT_S:g} s)" in msg and "timeout_s" in msg, msg
            assert bad in _peers_named(msg), (rank, msg)
        if mode == "stall":
            release.set()
            assert results.get(timeout=HANG_GUARD_S)[:2] == (bad, "stalled")
        else:
            procs[bad].join(timeout=HANG_GUARD_S)
            assert procs[bad].exitcode == 17
    finally:
        release.set()
        for p in procs:
            p.join(timeout=5)
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


@settings(max_examples=ci_examples(20), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=14), shape=group_shapes,
       placement=st.sampled_from(["contiguous", "zigzag", "balanced", "auto"]),
       heads=st.sampled_from([(4, 1), (4, 2), (4, 4), (8, 2)]),
       budget=st.one_of(st.none(), st.integers(1, 50)), seed=st.integers(0, 2**31 - 1))
def test_stress_random_layouts_and_groups(pools, lengths, shape, placement, heads, budget, seed):
    """Property test; HSAP_HYPOTHESIS_PROFILE=long for a long run (see conftest.py)."""
    world, U = shape
    if sum(lengths) < world:
        lengths = lengths + [world]
    res = pools(world).run(check_attention, cu_of(lengths), world, U, placement, *heads, 8, "float64", seed, budget)
    assert_exact(res, "float64")
