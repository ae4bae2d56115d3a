"""``ulysses_size="per_batch"``: one set of groups per Ulysses degree, each batch run at the degree the cost model
prices fastest, exact against the float64 reference at every degree it picks. The groups here
choose by time alone (``per_batch_memory_cap=False``); the memory cap has its own test
(test_degree_memory_measured.py).

The cost models below are chosen so that one group meets all three degrees of world 4 (the choice is the pure
planner's :func:`hf_hsap.choose_ulysses_size`, asserted per case): many short documents stay flat SAP (U = 1,
nothing to move), a long document with cheap KV runs U = 2 x R = 2, and with dear KV it runs as Ulysses (U = 4).
"""
import numpy as np
import pytest

import hf_hsap
from helpers import assert_exact, cu_of
from workers.sap import check_attention, describe_degrees

KV_CHEAP = {"token_cost": 0.0, "kv_token_cost": 30.0, "round_cost": 50.0, "a2a_token_cost": 20.0}
KV_DEAR = dict(KV_CHEAP, kv_token_cost=100.0)
CASES = [  # (document lengths, cost fields, expected degree)
    ([8] * 20, KV_DEAR, 1),
    ([100, 60], KV_CHEAP, 2),
    ([160], KV_DEAR, 4),
    ([100] + [4] * 15, KV_DEAR, 4),
    ([1, 45, 3, 1, 30, 2, 60, 9], KV_DEAR, 2),
]


@pytest.mark.parametrize("ulysses", ["per_batch", None])
def test_groups_of_every_degree(pools, ulysses):
    """A per_batch group, and the default when the model's heads are known (the same groups)."""
    res = pools(4).run(describe_degrees, 4, ulysses)
    for r in res:
        assert r["mode"] == "per_batch"
        g = r["rank"]
        assert sorted(r["degrees"]) == [1, 2, 4]
        assert r["default"] == 1  # "auto"'s degree (the group fits in one node): flat SAP
        assert r["degrees"][1] == {"intra": None, "inter": [0, 1, 2, 3], "sp": [0, 1, 2, 3]}
        assert r["degrees"][2] == {"intra": [g - g % 2, g - g % 2 + 1], "inter": [g % 2, g % 2 + 2], "sp": [0, 1, 2, 3]}
        assert r["degrees"][4] == {"intra": [0, 1, 2, 3], "inter": None, "sp": [0, 1, 2, 3]}
        assert r["shared"], "the degrees share the SP group, the plan cache and the counters"


@pytest.mark.parametrize("lengths,cost,expected", CASES, ids=["sft-U1", "long-U2", "single-U4", "mixed-U4",
                                                                      "longtail-U2"])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2)])
def test_per_batch_degree_is_the_fastest_and_exact(pools, lengths, cost, expected, heads):
    cu = cu_of(lengths)
    U, times = hf_hsap.choose_ulysses_size(np.asarray(cu), 4, num_heads=8, gpus_per_node=4,
                                           cost=hf_hsap.CostModel(**cost), memory_cap=False)
    assert U == expected, times  # the case still meets the degree it is meant to
    hq, hkv = heads
    res = pools(4).run(check_attention, cu, 4, "per_batch", "auto", hq, hkv, 8, "float64", 5, None, None, None,
                       "auto", None, None, False, True, cost)
    assert_exact(res, "float64")
    for r in res:
        assert r["ulysses"] == expected, r
        assert r["a2a_bytes"] == r["a2a_expected"], r
        if expected == 1:
            assert r["a2a_bytes"] == 0


def test_per_batch_needs_the_heads(pools):
    from workers.sap import per_batch_without_heads

    for msg in pools(2).run(per_batch_without_heads):
        assert "needs the model's query heads" in msg and "num_heads=" in msg
