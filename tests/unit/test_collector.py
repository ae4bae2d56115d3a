"""``hf_hsap.plan_sequence`` pauses Python's cyclic garbage collector while it plans (``hf_hsap.collector``) and
leaves it exactly as it found it: enabled or disabled, after a plan or an exception."""
from __future__ import annotations

import gc

import pytest

from helpers import cu_of
import hf_hsap
from hf_hsap.collector import collector_paused
from hf_hsap.plan.group import GroupSpec
from hf_hsap.plan.layout import make_layout


@pytest.fixture
def restore_gc():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_pause_restores_the_state_it_found(restore_gc, enabled):
    (gc.enable if enabled else gc.disable)()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: the inner one leaves it to the outer
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled() == enabled
    with pytest.raises(RuntimeError):
        with collector_paused():
            raise RuntimeError("planning failed")
    assert gc.isenabled() == enabled


@pytest.mark.parametrize("enabled", [True, False])
def test_a_plan_runs_with_the_collector_paused_and_restores_it(restore_gc, monkeypatch, enabled):
    import hf_hsap.plan.planner as planner

    seen = []
    place = planner._place

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return place(*args, **kwargs)

    monkeypatch.setattr(planner, "_place", spy)
    (gc.enable if enabled else gc.disable)()
    plan = hf_hsap.plan_sequence(cu_of([300, 20, 900, 45]), 4)
    assert seen == [False] and gc.isenabled() == enabled
    assert plan.placement.tokens_per_part().sum() == 1265
    monkeypatch.setattr(planner, "_place", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        hf_hsap.plan_sequence(cu_of([300, 20]), 2)
    assert gc.isenabled() == enabled


@pytest.mark.parametrize("lengths, P", [([300, 20, 900, 45] * 30, 8), ([5000, 3000, 40, 7, 2000] * 8, 6)])
def test_a_plan_leaves_no_cyclic_garbage(restore_gc, lengths, P):
    """What the pause relies on: everything a plan drops is freed by reference counting (a recursive closure in a
    greedy pass once kept its figures and passes alive in a cycle until the collector ran)."""
    import hf_hsap.plan.planner as planner

    layout = make_layout(cu_of(lengths))
    gc.collect()
    gc.disable()
    for link in ("nvlink", "network"):
        plan = planner.plan_layout(layout, GroupSpec.offline(P, 1, P if link == "nvlink" else 1), "auto")
        assert plan.placement.tokens_per_part().sum() == sum(lengths)
        del plan
    assert gc.collect() == 0
