"""SPGroup construction: sub-groups, device mesh and refused sizes."""
import pytest

from workers.sap import bad_group_sizes, describe_groups


def test_groups_and_mesh_dp2_sp2_u2(pools):
    res = pools(4).run(describe_groups, 2, 2)
    for r in res:
        g = r["rank"]
        assert r["sp"] == [g - g % 2, g - g % 2 + 1] and r["intra"] == r["sp"] and r["inter"] is None
        assert r["dp"] == [g % 2, g % 2 + 2]
        assert r["mesh_dims"] == ("dp", "sp_inter", "sp_intra")
        assert r["mesh"] == [[[0, 1]], [[2, 3]]]


def test_groups_sp4_u2(pools):
    res = pools(4).run(describe_groups, 4, 2)
    for r in res:
        g = r["rank"]
        assert r["sp"] == [0, 1, 2, 3] and r["dp"] is None and r["sp_rank"] == g
        assert r["intra"] == ([0, 1] if g < 2 else [2, 3])
        assert r["inter"] == ([0, 2] if g % 2 == 0 else [1, 3])


@pytest.mark.parametrize("sp_size,U,match", [(3, 1, "does not divide the world size 4"),
                                             (4, 3, "does not divide sp_size=4"),
                                             (0, 1, "positive int")])
def test_bad_sizes(pools, sp_size, U, match):
    for msg in pools(4).run(bad_group_sizes, sp_size, U):
        assert match in msg


def test_heads_not_divisible_by_ulysses(pools):
    from workers.sap import heads_not_divisible

    for msg in pools(2).run(heads_not_divisible):
        assert "must divide the number of query heads" in msg
