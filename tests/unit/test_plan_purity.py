"""The plan is pure data made from a layout and a plain group description; binding it to process groups
is the runtime side's (``hf_hsap.sp_plan``)."""
from __future__ import annotations

import ast
import dataclasses
import pathlib

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
    with pytest.raises(TypeError):  # the unreleased dict spelling is gone
        st["tokens"]  # noqa: B018


@pytest.mark.parametrize("module,name", [
    ("hf_hsap.plan.pipeline", "split_rounds"), ("hf_hsap.plan.schedule", "split_rounds"),
    ("hf_hsap.plan.cost", "detect_hardware"), ("hf_hsap.plan.cost", "simulated_time"),
    ("hf_hsap.plan.planner", "check_same_layout"), ("hf_hsap.comm.loopback", "run_plan_loopback"),
    ("hf_hsap.comm.all_to_all", "SeqToHead"),
])
def test_the_unreleased_aliases_are_gone(module: str, name: str) -> None:
    """Names that moved before the first release live only where they are now."""
    import importlib

    with pytest.raises(AttributeError):
        getattr(importlib.import_module(module), name)
