"""Helpers shared by the test modules (test modules import this, never each other).

* :func:`rel_err`: the one relative error of the suite, ``max |a - b| / max(max |b|, tiny)`` in float64
  (``inf`` on a shape mismatch, a NaN or an infinity); defined in :mod:`hf_hsap.testing` because the library's
  own :func:`~hf_hsap.testing.check_kernel_against_reference` uses it too.
* :func:`cu_of`, :func:`assert_exact`, :data:`TOL`: the SAP attention checks (``workers/sap.py`` results).
* :func:`hypothesis_profile`, :func:`ci_examples`: the Hypothesis profiles (registered in ``conftest.py``).
* :func:`ring_step_matrix`: a benchmark scheme's ring work per (GPU, ring step) as a ``[P, P]`` matrix.
* :func:`layouts`, :data:`CPU_KERNEL`, :func:`cost_of`: the placement tests' rows and cost models.
* :func:`plans_with_and_without`: auto's plan with and without one of its refinements.
* :data:`DEVICE_NAMES`: device name strings and the hardware table's key for each.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

import numpy as np

from hf_hsap.plan.cost import CostModel
from hf_hsap.testing import rel_err

__all__ = ["CPU_KERNEL", "DEVICE_NAMES", "HYPOTHESIS_PROFILE_ENV", "TOL", "assert_covers_once", "assert_exact",
           "ci_examples", "cost_of", "cu_of", "hypothesis_profile", "layouts", "plans_with_and_without", "rel_err",
           "ring_step_matrix"]

HYPOTHESIS_PROFILE_ENV = "HSAP_HYPOTHESIS_PROFILE"  # "ci" (default) or "long"

TOL = {"float64": 1e-9, "float32": 2e-5}  # largest relative error of the SAP attention checks, per dtype

CPU_KERNEL = CostModel(token_cost=0.0, kv_token_cost=102.0, diag_block=512)  # attention only, CPU's key blocks

DEVICE_NAMES = {  # torch.cuda.get_device_name() strings -> the hardware table's key (None: unknown)
    "NVIDIA A100-SXM4-80GB": "A100", "NVIDIA A100-PCIE-40GB": "A100", "NVIDIA A800-SXM4-80GB": "A100",
    "NVIDIA H100 80GB HBM3": "H100", "NVIDIA H100 PCIe": "H100", "NVIDIA H200": "H100", "NVIDIA H800": "H100",
    "NVIDIA GH200 480GB": "H100", "NVIDIA B200": "B200", "NVIDIA GB200": "GB200", "NVIDIA L40S": "L40S",
    "NVIDIA L40": "L40", "NVIDIA L4": "L4", "NVIDIA A10G": "A10G", "NVIDIA GeForce RTX 4090": "RTX 4090",
    "Tesla V100-SXM2-16GB": "V100", "AMD Instinct MI300X": "MI300X",
    "NVIDIA A10": None, "Tesla T4": None, "NVIDIA H20": None, "cpu": None, "": None,
}


def assert_covers_once(layout, pl) -> None:
    """A placement holds every token of ``layout`` exactly once, each segment inside its document."""
    cover = np.zeros(layout.total_tokens, dtype=np.int64)
    for s, e, d in zip(pl.start, pl.end, pl.doc):
        assert layout.cu_seqlens[d] <= s < e <= layout.cu_seqlens[d + 1]
        cover[s:e] += 1
    assert (cover == 1).all()


def cu_of(lengths: Iterable[int]) -> list[int]:
    """Document lengths -> ``cu_seqlens`` (``[0, l0, l0 + l1, ...]``)."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def assert_exact(results: list[dict[str, Any]], dtype: str, plan_minimum: bool = True) -> None:
    """Every rank's out, lse, dq, dk, dv within :data:`TOL` of the float64 reference and (``plan_minimum``) the
    forward receiving exactly the planner's minimum rows and bytes (``workers.sap.check_attention`` records)."""
    for r in results:
        for key in ("out", "lse", "dq", "dk", "dv", "dsinks"):
            if key not in r:
                continue
            assert r[key] <= TOL[dtype], f"rank {r['rank']} {key} rel err {r[key]:.3g} > {TOL[dtype]} ({r})"
        if plan_minimum:
            assert r["fwd_rows"] == r["plan_recv"], r
            assert r["fwd_bytes"] == r["plan_recv"] * r["row_bytes"], r


def hypothesis_profile() -> str:
    """The Hypothesis profile to load: ``$HSAP_HYPOTHESIS_PROFILE``, default ``"ci"``."""
    return os.environ.get(HYPOTHESIS_PROFILE_ENV, "ci")


def ci_examples(n: int) -> int:
    """``max_examples`` of a property test that runs fewer examples than the ``ci`` profile's (slow examples,
    e.g. on spawned ranks): ``n`` under ``ci``, the loaded profile's own (larger) count under any other
    (``long``). Call it inside ``@settings(...)``: ``conftest.py`` loads the profile before test modules are
    imported."""
    from hypothesis import settings

    return n if hypothesis_profile() == "ci" else settings.default.max_examples


def ring_step_matrix(s: Any) -> np.ndarray:
    """``[P, P]`` pairs of GPU ``g``'s queries with its ring predecessors' shards, from a
    ``benchmarks.analytic.schemes.SchemeStats``'s ring pipeline (U = 1): row ``g``, column ``(g - step) mod P``."""
    P = s.P
    w = np.zeros((P, P))
    for step in range(P):
        w[np.arange(P), (np.arange(P) - step) % P] = s.ring.step_work[:, step]
    return w


def built_placements(layout, P: int, cost, slack: float) -> list:
    """Every placement the planner builds for ``layout`` over ``P`` parts within the token cap of ``slack``: the
    named ones and auto's plan, the priced contiguous cuts and the sliced cuts (each at no time limit) where they
    exist. What the lower-bound tests check every bound against."""
    from hf_hsap.plan.cutting import priced_cuts
    from hf_hsap.plan.placement import token_cap
    from hf_hsap.plan.planner import _place
    from hf_hsap.plan.search import Search
    from hf_hsap.plan.slicing import sliced_cuts

    cap = token_cap(layout.total_tokens, P, slack)
    out = [_place(Search(layout, P, cost, slack), name)[0]
           for name in ("contiguous", "zigzag", "balanced", "density", "auto")]
    cuts = (priced_cuts(layout, P, cost, cap, 1e30), sliced_cuts(layout, P, cost, cap, 1e30))
    return out + [c for c in cuts if c is not None]


def cost_of(link: str) -> CostModel:
    """The placement tests' cost model of ``link``: :data:`CPU_KERNEL` for ``"cpu"``, else the planner's default."""
    return CPU_KERNEL if link == "cpu" else CostModel.for_link(link)


def layouts(max_docs: int = 40) -> Any:
    """Hypothesis strategy of document lengths of several shapes: a few long documents among short ones, one or
    two dominant, many tiny, any (hypothesis is imported here: it is absent where only ``tests/cuda`` runs)."""
    from hypothesis import strategies as st

    @st.composite
    def rows(draw: Any) -> list[int]:
        kind = draw(st.sampled_from(["mixed", "dominant", "tiny", "any"]))
        if kind == "dominant":
            big = draw(st.lists(st.integers(500, 4000), min_size=1, max_size=2))
            rest = draw(st.lists(st.integers(1, 300), min_size=0, max_size=max_docs))
            return big + rest if draw(st.booleans()) else rest + big
        if kind == "tiny":
            return draw(st.lists(st.integers(1, 20), min_size=8, max_size=max_docs))
        if kind == "mixed":
            return draw(st.lists(st.one_of(st.integers(1, 200), st.integers(1000, 3000)), min_size=1,
                                 max_size=max_docs))
        return draw(st.lists(st.integers(1, 2000), min_size=1, max_size=max_docs))

    return rows()


def plans_with_and_without(layout, group, monkeypatch, refinement: str) -> tuple:
    """auto's plan of ``layout`` for ``group``, and its plan without one refinement (:func:`without_refinement`)."""
    import hf_hsap.plan.planner as planner

    plan = planner.plan_layout(layout, group, "auto")
    with monkeypatch.context() as m:
        without_refinement(m, refinement)
        without = planner.plan_layout(layout, group, "auto")
    return plan, without


def without_refinement(monkeypatch, name: str) -> None:
    """Leave one of ``auto``'s refinements (:data:`hf_hsap.plan.auto.REFINEMENTS`, by function name, e.g.
    ``"_sliced_cuts"``) out, so that a test sees the plan the search reaches without it."""
    import hf_hsap.plan.auto as auto

    kept = tuple(r for r in auto.REFINEMENTS if r.__name__ != name)
    assert len(kept) == len(auto.REFINEMENTS) - 1, f"no refinement {name!r}"
    monkeypatch.setattr(auto, "REFINEMENTS", kept)


def environ_kept(fn: Any) -> Any:
    """``fn`` with the process environment restored after it (a pool rank runs later tests: Accelerate's launch
    variables, e.g. ``LOCAL_WORLD_SIZE``, would change how they build their SP groups)."""
    import functools

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        saved = dict(os.environ)
        try:
            return fn(*args, **kwargs)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    return run


def adopt_process_group(sp_size: int) -> None:
    """Under SP, the launch variables that make Accelerate adopt a pool rank's existing process group."""
    import torch.distributed as dist

    if sp_size > 1 and "MASTER_ADDR" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="1", RANK=str(dist.get_rank()),
                          WORLD_SIZE=str(dist.get_world_size()), LOCAL_RANK=str(dist.get_rank()))

