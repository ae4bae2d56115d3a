"""SAP attention with sliding windows, soft-capping and sinks across spawned gloo ranks equals the float64
single-process reference (out, lse, dq, dk, dv, and the sinks' gradient summed over the group), and the
forward receives exactly the plan's minimum for the window: only the keys a window sees."""
from functools import partial

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers import assert_exact, ci_examples, cu_of
from workers.sap import check_attention

PLACEMENTS = ["contiguous", "zigzag", "balanced", "auto"]


@pytest.mark.parametrize("world,ulysses", [(2, 1), (4, 1), (4, 2)])
@settings(max_examples=ci_examples(5), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=6), placement=st.sampled_from(PLACEMENTS),
       window=st.one_of(st.integers(1, 5), st.integers(6, 70)), softcap=st.sampled_from([None, 2.0]),
       sinks=st.booleans(), dtype=st.sampled_from(["float64", "float32"]), seed=st.integers(0, 2**31 - 1))
@example(lengths=[64, 64], placement="zigzag", window=16, softcap=None, sinks=False, dtype="float64", seed=1)
@example(lengths=[97], placement="contiguous", window=1, softcap=None, sinks=True, dtype="float64", seed=2)
@example(lengths=[3, 61, 2], placement="balanced", window=7, softcap=3.0, sinks=True, dtype="float32", seed=3)
def test_windowed_sap_matches_reference(pools, world, ulysses, lengths, placement, window, softcap, sinks, dtype,
                                        seed):
    if sum(lengths) < world:
        lengths = lengths + [world]
    res = pools(world).run(partial(check_attention, window=window, softcap=softcap, sinks=sinks), cu_of(lengths),
                           world, ulysses, placement, 4, 2, 8, dtype, seed)
    assert_exact(res, dtype)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_window_moves_at_most_the_window(pools, placement):
    """Long documents, a short window: every rank receives at most W - 1 keys before each segment it holds,
    far less than the unwindowed plan of the same layout."""
    lengths = [200, 3, 150, 41]
    win = pools(4).run(partial(check_attention, window=8), cu_of(lengths), 4, 1, placement, 4, 2, 8, "float64", 7)
    full = pools(4).run(check_attention, cu_of(lengths), 4, 1, placement, 4, 2, 8, "float64", 7)
    assert_exact(win, "float64")
    assert sum(r["fwd_rows"] for r in win) < sum(r["fwd_rows"] for r in full)
    assert all(r["fwd_rows"] <= 7 * 2 * 4 for r in win), [r["fwd_rows"] for r in win]


def test_window_not_planned_for_is_planned_on_demand(pools):
    """A layer whose window the plan was not made for: its kind is planned when the layer asks, exactly."""
    res = pools(4).run(partial(check_attention, window=12, plan_windows=False), cu_of([90, 30, 50]), 4, 1, "auto",
                       4, 2, 8, "float64", 9)
    assert_exact(res, "float64")


def test_receive_budget_with_a_window(pools):
    res = pools(4).run(partial(check_attention, window=10), cu_of([150, 3, 60, 31]), 4, 1, "zigzag", 4, 2, 8,
                       "float64", 5, 3)
    assert_exact(res, "float64")
    assert res[0]["rounds"] > 1
