"""The plan is pure data made from a layout and a plain group description; binding it to process groups
is the runtime side's (``hf_hsap.sp_plan``)."""
from __future__ import annotations

import ast
import dataclasses
import pathlib
import warnings

import numpy as np
import pytest

import hf_hsap
from hf_hsap.plan import planner
from hf_hsap.plan.group import GroupSpec
from hf_hsap.plan.plan import Plan
from hf_hsap.plan.stats import PlanStats
from hf_hsap.sp_plan import SPPlan

PLAN_DIR = pathlib.Path(hf_hsap.__file__).parent / "plan"
# what the planner package may not reach: process groups, the runtime side, device queries
FORBIDDEN_MODULES = ("torch.distributed", "hf_hsap.topology", "hf_hsap.sp_plan", "hf_hsap.runtime",
                     "hf_hsap.attention", "hf_hsap.comm", "hf_hsap.integrations", "hf_hsap.devices",
                     "hf_hsap.kernels.select")
FORBIDDEN_CALLS = ("cuda", "get_device_name", "is_available", "device_count", "get_rank", "get_world_size")


def _imports(path: pathlib.Path) -> list[str]:
    """Absolute names of every module a file imports (relative imports resolved)."""
    pkg = ["hf_hsap", "plan"]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out += [mod] + [f"{mod}.{a.name}" for a in node.names]
    return out


def test_plan_package_imports_nothing_above_it() -> None:
    files = sorted(PLAN_DIR.glob("*.py"))
    assert len(files) >= 10  # the scan really sees the package
    for f in files:
        for mod in _imports(f):
            assert not any(mod == b or mod.startswith(b + ".") for b in FORBIDDEN_MODULES), f"{f.name} imports {mod}"


def test_plan_package_queries_no_device() -> None:
    for f in sorted(PLAN_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Attribute):
                assert node.attr not in FORBIDDEN_CALLS, f"{f.name}:{node.lineno} uses .{node.attr}"


def test_the_scan_catches_a_violation(tmp_path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfrom ..topology import SPGroup\nx = torch.cuda.is_available()\n")
    assert "hf_hsap.topology" in _imports(bad)
    attrs = {n.attr for n in ast.walk(ast.parse(bad.read_text())) if isinstance(n, ast.Attribute)}
    assert {"cuda", "is_available"} <= attrs


def test_a_plan_is_data_from_a_layout_and_a_group() -> None:
    cu = [0, 40, 41, 200, 260]
    spec = GroupSpec(4, 2, rank=3, link="nvlink")
    a = planner.plan_sequence(cu, spec)
    b = planner.plan_sequence(cu, 4, ulysses_size=2, gpus_per_node=4)  # offline: same group but no rank
    assert type(a) is Plan and a.group == spec and a.rank == 3 and b.rank is None and b.group.link == "nvlink"
    assert a.stats() == b.stats()
    assert a.num_local_tokens() == a.num_local_tokens(3)
    assert not any(f.name == "sp" for f in dataclasses.fields(Plan))
    assert a.intra_sizes(1) == tuple(int(x) for x in np.diff(a.intra_bounds(1)))
    assert sum(a.intra_sizes(1)) == a.part_token_indices(1).shape[0]
    with pytest.raises(ValueError, match="multiple of ulysses_size"):
        GroupSpec(4, 3)
    with pytest.raises(ValueError, match="out of range"):
        GroupSpec(4, 1, rank=4)
    with pytest.raises(ValueError, match="hf_hsap.plan_sequence"):
        planner.plan_sequence(cu, hf_hsap.SPGroup.single())  # the pure planner does not take process groups


def test_binding_keeps_the_data_and_the_cache() -> None:
    sp = hf_hsap.SPGroup.single()
    cu = [0, 5, 30]
    bound = hf_hsap.plan_sequence(cu, sp)
    assert isinstance(bound, SPPlan) and isinstance(bound, Plan) and bound.sp is sp
    assert bound is hf_hsap.plan_sequence(cu, sp)  # cached on the group
    assert bound.stats() == planner.plan_sequence(cu, 1).stats()
    x = np.arange(30.0)
    import torch

    assert torch.equal(bound.gather(bound.shard(torch.from_numpy(x))), torch.from_numpy(x))


def test_stats_are_typed() -> None:
    st = hf_hsap.plan_sequence([0, 100, 300], 2, "zigzag").stats()
    assert isinstance(st, PlanStats) and st.placement == "zigzag" and sum(st.tokens) == 300
    assert st.to_dict()["tokens"] == st.tokens and set(st.to_dict()) == {f.name for f in dataclasses.fields(PlanStats)}
    with pytest.warns(FutureWarning, match=r"Plan.stats\(\).tokens"):
        assert st["tokens"] == st.tokens  # the old spelling, for one release
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(KeyError):
            st["nope"]


def test_dict_style_stats_still_work_for_one_release() -> None:
    st = hf_hsap.plan_sequence([0, 100, 300], 2, "zigzag").stats()
    with pytest.warns(FutureWarning):
        assert "tokens" in st and "nope" not in st
    with pytest.warns(FutureWarning):
        assert st.get("rounds") == st.rounds and st.get("nope", 7) == 7
    with pytest.warns(FutureWarning):
        assert dict(st) == st.to_dict()
    with pytest.warns(FutureWarning):
        assert dict(st.items()) == st.to_dict() and list(st.keys()) == list(st.to_dict())


@pytest.mark.parametrize("module,name,new", [
    ("hf_hsap.plan.pipeline", "split_rounds", "hf_hsap.plan.rounds"),
    ("hf_hsap.plan.pipeline", "round_tables", "hf_hsap.plan.rounds"),
    ("hf_hsap.plan.pipeline", "piece_remote_work", "hf_hsap.plan.rounds"),
    ("hf_hsap.plan.schedule", "split_rounds", "hf_hsap.plan.rounds"),
    ("hf_hsap.plan.cost", "detect_hardware", "hf_hsap.devices"),
    ("hf_hsap.plan.cost", "simulated_time", "hf_hsap.plan.simulation"),
    ("hf_hsap.plan.cost", "round_order_times", "hf_hsap.plan.simulation"),
    ("hf_hsap.plan.cost", "round_order", "hf_hsap.plan.simulation"),
    ("hf_hsap.plan.planner", "check_same_layout", "hf_hsap.sp_plan"),
    ("hf_hsap.comm.loopback", "run_plan_loopback", "hf_hsap.loopback"),
])
def test_moved_names_work_for_one_release(module: str, name: str, new: str) -> None:
    import importlib

    with pytest.warns(FutureWarning, match=new.replace(".", r"\.")):
        got = getattr(importlib.import_module(module), name)
    assert got is getattr(importlib.import_module(new), name)


def test_the_old_all_to_all_classes_warn_and_forward(monkeypatch) -> None:
    import torch

    from hf_hsap.comm import all_to_all as a2a

    calls = []
    monkeypatch.setattr(a2a, "all_to_all", lambda x, direction, *rest: calls.append(direction) or x)
    x = torch.randn(5, 6)
    for name, direction in (("SeqToHead", "seq_to_head"), ("HeadToSeq", "head_to_seq")):
        with pytest.warns(FutureWarning, match=f"all_to_all\\(x, '{direction}'"):
            assert getattr(a2a, name).apply(x, None, (5,), 0) is x
    assert calls == ["seq_to_head", "head_to_seq"]
    with pytest.raises(AttributeError):
        a2a.Nope  # noqa: B018
