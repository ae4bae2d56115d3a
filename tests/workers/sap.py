"""Worker functions run on every spawned rank by the distributed SAP tests."""
from __future__ import annotations

import hashlib
import math

import torch
import torch.distributed as dist

import hf_hsap
from hf_hsap.kernels import reference_attention
from hf_hsap.testing import rel_err

_GROUPS: dict = {}  # per-process cache of SP groups (worker processes only; keyed by shape)


PER_BATCH_HEADS = 8  # the heads a "per_batch" group's degrees divide (every test's hq is a multiple of them)


def get_sp(sp_size: int, ulysses: int | str) -> hf_hsap.SPGroup:
    key = (sp_size, ulysses)
    if key not in _GROUPS:
        if ulysses in ("per_batch", None):  # the fastest degree by time alone (the cap: test_degree_memory_measured.py)
            config = hf_hsap.HSAPConfig(sp_size=sp_size, ulysses_size=ulysses, per_batch_memory_cap=False)
            _GROUPS[key] = hf_hsap.init_sequence_parallel(config, num_heads=PER_BATCH_HEADS)
        else:
            _GROUPS[key] = hf_hsap.init_sequence_parallel(sp_size, ulysses_size=ulysses)
    return _GROUPS[key]


ABS_FLOOR = 1e-3  # inputs are N(0, 1): every gradient that is not 0 by mathematics is far above it


def _shard_err(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor) -> float:
    """:func:`~hf_hsap.testing.rel_err` of this rank's shard over its finite entries (the non-finite ones, e.g.
    the lse ``-inf`` of rows that see no key, must sit at the same places, else ``inf``), relative to the
    largest finite magnitude of the global reference ``scale`` (a shard alone can be all ~0, e.g. the dq of
    1-token documents). The denominator is at least ``ABS_FLOOR``: a gradient that is 0 by mathematics
    (every document of 1 token: dq = dk = 0) is computed as rounding noise of the O(1) terms it cancels,
    which is exact, not a relative error."""
    fin = torch.isfinite(b)
    if not torch.equal(fin, torch.isfinite(a)):
        return float("inf")
    if not fin.any():
        return 0.0
    return rel_err(a[fin], b[fin], scale=scale[torch.isfinite(scale)], floor=ABS_FLOOR)


def check_attention(cu: list[int], sp_size: int, ulysses: int, placement: str, hq: int, hkv: int, d: int,
                    dtype_name: str, seed: int, budget: int | None = None, layouts_per_dp: list | None = None,
                    grad_comm_dtype: str | None = None, rounds: str = "auto", window: int | None = None,
                    softcap: float | None = None, sinks: bool = False, plan_windows: bool = True,
                    cost: dict | None = None) -> dict:
    """Run hsap_attn_func on the global batch drawn from ``seed`` and compare with the float64
    reference: returns the max relative errors of out, lse, dq, dk, dv (and of the sinks' gradient, summed
    over the SP group, with ``sinks``) and the comm counters. ``window`` / ``softcap``: the layer's sliding
    window and soft-capping; ``plan_windows``: the plan is made for the window (else planned on demand); ``cost``:
    the fields of the :class:`~hf_hsap.CostModel` to plan with (default: the group's)."""
    sp = get_sp(sp_size, ulysses)
    if layouts_per_dp is not None:
        cu = layouts_per_dp[sp.dp_rank]
        seed = seed + sp.dp_rank
    dtype = getattr(torch, dtype_name)
    T = cu[-1]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, hq, d, generator=g, dtype=torch.float64)
    k = torch.randn(T, hkv, d, generator=g, dtype=torch.float64)
    v = torch.randn(T, hkv, d, generator=g, dtype=torch.float64)
    dout = torch.randn(T, hq, d, generator=g, dtype=torch.float64)
    sink = torch.randn(hq, generator=g, dtype=torch.float64) if sinks else None
    plan = hf_hsap.plan_sequence(torch.tensor(cu), sp, placement, recv_budget_tokens=budget, rounds=rounds,
                                 windows=[window] if plan_windows else None,
                                 cost=None if cost is None else hf_hsap.CostModel(**cost))
    ql, kl, vl = (plan.shard(x).to(dtype).requires_grad_(True) for x in (q, k, v))
    sl = None if sink is None else sink.clone().to(dtype).requires_grad_(True)
    sp.comm_stats.reset()
    gdt = None if grad_comm_dtype is None else getattr(torch, grad_comm_dtype)
    out, lse = hf_hsap.hsap_attn_func(ql, kl, vl, plan, return_lse=True, grad_comm_dtype=gdt, window=window,
                                      softcap=softcap, sinks=sl)
    fwd_rows, fwd_bytes, fwd_msgs = sp.comm_stats.rows_recv, sp.comm_stats.bytes_recv, sp.comm_stats.messages
    fwd_a2a = sp.comm_stats.a2a_bytes_sent
    U = plan.ulysses_size  # the group's degree, or the one a "per_batch" group chose for this batch
    hkv_eff = math.lcm(hkv, U) if hkv % U else hkv
    t_u = plan.num_local_tokens()
    t_part = sum(plan.num_local_tokens(plan.sp.inter_rank * U + u) for u in range(U))
    a2a_expected = (t_u * (U - 1) * (hq + 2 * hkv_eff) // U * d + (t_part - t_u) * hq // U * d) * ql.element_size()
    out.backward(plan.shard(dout).to(dtype))
    bwd_bytes = sp.comm_stats.bytes_recv - fwd_bytes
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    sr = None if sink is None else sink.clone().requires_grad_(True)
    ref, ref_lse = reference_attention(qr, kr, vr, cu, window=window, softcap=softcap, sinks=sr)
    ref.backward(dout)
    sink_err = 0.0
    if sink is not None:
        d_sink = sl.grad.detach().double().clone()
        dist.all_reduce(d_sink, group=sp.group)  # each rank's gradient covers its queries (and heads)
        sink_err = rel_err(d_sink, sr.grad)
    st = plan.stats(window=window)
    digest = hashlib.sha256()
    for t in (out, lse, ql.grad, kl.grad, vl.grad):
        digest.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return {
        "digest": digest.hexdigest(), "max_recv_rows": sp.comm_stats.max_recv_rows,
        "out": _shard_err(out, plan.shard(ref), ref), "lse": _shard_err(lse, plan.shard(ref_lse), ref_lse),
        **{name: _shard_err(leaf.grad, plan.shard(full.grad), full.grad)
           for name, leaf, full in (("dq", ql, qr), ("dk", kl, kr), ("dv", vl, vr))},
        "fwd_rows": fwd_rows, "fwd_bytes": fwd_bytes, "fwd_msgs": fwd_msgs, "bwd_bytes": bwd_bytes,
        "plan_recv": st.recv_kv_tokens[sp.rank], "plan_send": st.send_kv_tokens[sp.rank], "rounds": st.rounds,
        "row_bytes": 2 * hkv_eff // U * d * kl.element_size(), "ulysses": U,
        "placement": plan.placement_name, "rank": dist.get_rank(), "round_order": plan.round_order,
        "bwd_rows": sp.comm_stats.rows_recv - fwd_rows,
        "a2a_bytes": fwd_a2a, "a2a_expected": a2a_expected, "a2a_tokens": st.a2a_tokens[sp.rank],
        "dp_rank": sp.dp_rank, "sp_rank": sp.rank, "dsinks": sink_err,
    }


def check_mismatched_layouts() -> str:
    """Rank 1 gets another layout: every rank must raise ValueError (not hang, not compute)."""
    sp = get_sp(dist.get_world_size(), 1)
    cu = [0, 4, 9] if sp.rank != 1 else [0, 5, 9]
    try:
        hf_hsap.plan_sequence(torch.tensor(cu), sp)
    except ValueError as e:
        return str(e)
    return "no error"


def check_one_rank_with_a_bad_layout() -> str:
    """Rank 2 gets invalid boundaries (not increasing): it raises its own error and the others learn of it
    from the layout check (nobody waits for the group timeout)."""
    sp = get_sp(dist.get_world_size(), 1)
    cu = [0, 4, 9] if sp.rank != 2 else [0, 6, 5, 9]
    try:
        hf_hsap.plan_sequence(torch.tensor(cu), sp)
    except ValueError as e:
        return str(e)
    return "no error"


def describe_groups(sp_size: int, ulysses: int) -> dict:
    """The groups and mesh this rank got from init_sequence_parallel."""
    sp = get_sp(sp_size, ulysses)
    ranks = lambda g: None if g is None else dist.get_process_group_ranks(g)  # noqa: E731
    mesh = sp.device_mesh
    return {"rank": dist.get_rank(), "sp": ranks(sp.group), "intra": ranks(sp.intra_group),
            "inter": ranks(sp.inter_group), "dp": ranks(sp.dp_group), "sp_rank": sp.rank,
            "mesh_dims": None if mesh is None else tuple(mesh.mesh_dim_names),
            "mesh": None if mesh is None else mesh.mesh.tolist()}


def bad_group_sizes(sp_size: int, ulysses: int) -> str:
    try:
        hf_hsap.init_sequence_parallel(sp_size, ulysses_size=ulysses)
    except ValueError as e:
        return str(e)
    return "no error"


def heads_not_divisible() -> str:
    """U=2 with 3 query heads must be refused on every rank."""
    sp = get_sp(dist.get_world_size(), 2)
    plan = hf_hsap.plan_sequence(torch.tensor([0, 16]), sp)
    n = plan.num_local_tokens()
    try:
        hf_hsap.hsap_attn_func(torch.randn(n, 3, 8), torch.randn(n, 1, 8), torch.randn(n, 1, 8), plan)
    except ValueError as e:
        return str(e)
    return "no error"


def describe_degrees(sp_size: int, ulysses: str | None = "per_batch") -> dict:
    """The groups of every degree of a ``ulysses_size="per_batch"`` group on this rank (``ulysses=None``: the
    default, the query heads given)."""
    sp = get_sp(sp_size, ulysses)
    ranks = lambda g: None if g is None else dist.get_process_group_ranks(g)  # noqa: E731
    degrees = {u: {"intra": ranks(g.intra_group), "inter": ranks(g.inter_group), "sp": ranks(g.group)}
               for u, g in sp.degrees.items()}
    shared = all(g.group is sp.group and g.plan_cache is sp.plan_cache and g.comm_stats is sp.comm_stats
                 and g.rank == sp.rank and g.ulysses_size == u for u, g in sp.degrees.items())
    return {"rank": dist.get_rank(), "degrees": degrees, "default": sp.ulysses_size, "shared": shared,
            "mode": sp.config.ulysses_size}


def per_batch_without_heads() -> str:
    """``ulysses_size="per_batch"`` without the model's heads must be refused on every rank."""
    try:
        hf_hsap.init_sequence_parallel(dist.get_world_size(), ulysses_size="per_batch")
    except ValueError as e:
        return str(e)
    return "no error"
