"""HSAP hierarchy: Ulysses all-to-all inside intra groups x SAP across inter peers, and DP x SP.

Each case compares out, lse, dq, dk, dv on every rank with the float64 reference, checks that the
intra all-to-all moved exactly the formula's bytes and the inter P2P exactly the plan's minimum.
"""
import pytest

from helpers import assert_exact, cu_of
from workers.sap import check_attention

LAYOUT = [1, 45, 3, 1, 30, 2, 60, 9]  # T = 151: 1-token docs, docs longer than a shard


@pytest.mark.parametrize("world,U", [(2, 2), (4, 4), (4, 1), (4, 2)])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1), (8, 2)])
@pytest.mark.parametrize("placement", ["balanced", "zigzag"])
def test_hierarchy_matches_reference(pools, world, U, heads, placement):
    hq, hkv = heads
    res = pools(world).run(check_attention, cu_of(LAYOUT), world, U, placement, hq, hkv, 8, "float64", 3)
    assert_exact(res, "float64")
    for r in res:
        assert r["a2a_bytes"] == r["a2a_expected"], r
        if U == 1:
            assert r["a2a_bytes"] == 0 and r["a2a_tokens"] == 0
    if world // U > 1:
        assert any(r["fwd_rows"] > 0 for r in res)


def test_hierarchy_float32(pools):
    res = pools(4).run(check_attention, cu_of(LAYOUT), 4, 2, "auto", 4, 2, 16, "float32", 8)
    assert_exact(res, "float32")


def test_dp2_x_sp2_each_replica_own_layout(pools):
    layouts = [cu_of([7, 40, 1, 12]), cu_of([3, 3, 50, 2, 9, 1])]
    res = pools(4).run(check_attention, None, 2, 1, "auto", 4, 2, 8, "float64", 21, None, layouts)
    assert_exact(res, "float64")
    assert sorted((r["dp_rank"], r["sp_rank"]) for r in res) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_dp2_x_sp2_ulysses(pools):
    layouts = [cu_of([17, 40, 1, 12]), cu_of([30, 3, 50, 2])]
    res = pools(4).run(check_attention, None, 2, 2, "auto", 4, 1, 8, "float64", 22, None, layouts)
    assert_exact(res, "float64")


@pytest.mark.parametrize("budget", [None, 7])
def test_hierarchy_by_peer_rounds_u2_r3(pools, budget):
    """Ulysses 2 x SAP over 3 parts, one ring distance per round (2 rounds), with and without a budget."""
    res = pools(6).run(check_attention, cu_of(LAYOUT + [40, 5]), 6, 2, "zigzag", 4, 2, 8, "float64", 13, budget,
                       None, None, "by_peer")
    assert_exact(res, "float64")
    assert all(r["round_order"] == "by_peer" for r in res)
    assert res[0]["rounds"] >= 2
    for r in res:
        assert r["a2a_bytes"] == r["a2a_expected"], r
