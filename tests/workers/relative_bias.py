"""Worker and float64 reference of the relative-position-bias attention tests (``hf_hsap.integrations.relative_bias``):
queries, keys, values, a per-query bias table and per-query sinks drawn on a packed row, the dense per-document
attention written out independently (one ``[H, T, T]`` score matrix of the whole row)."""
from __future__ import annotations

import torch

import hf_hsap
from hf_hsap.integrations.relative_bias import relative_forward
from hf_hsap.testing import rel_err
from workers.sap import get_sp

HQ, HKV, D, EXTENT = 4, 2, 8, 4


def draw(cu: list[int], seed: int, sinks: bool) -> dict[str, torch.Tensor]:
    """The row's float64 inputs: q ``[T, Hq, D]``, k / v ``[T, Hkv, D]``, table ``[T, Hq, E]``, sinks ``[T, Hq]``,
    dout ``[T, Hq, D]``."""
    g = torch.Generator().manual_seed(seed)
    t = cu[-1]
    out = {name: torch.randn(*shape, generator=g, dtype=torch.float64) for name, shape in
           (("q", (t, HQ, D)), ("k", (t, HKV, D)), ("v", (t, HKV, D)), ("table", (t, HQ, EXTENT)),
            ("dout", (t, HQ, D)))}
    if sinks:
        out["sinks"] = torch.randn(t, HQ, generator=g, dtype=torch.float64)
    return out


def dense_reference(x: dict[str, torch.Tensor], cu: list[int], scale: float, window: int | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [T, Hq, D], lse [T, Hq])``: the whole row's scores, a key seen by a query of its own document at
    distance ``0 <= d`` (``< window``), biased by ``table[q, h, d]`` for ``d < EXTENT``, the sink one more logit."""
    t = cu[-1]
    doc = torch.repeat_interleave(torch.arange(len(cu) - 1), torch.diff(torch.tensor(cu)))
    pos = torch.arange(t) - torch.tensor(cu)[doc]
    group = HQ // HKV
    k, v = x["k"].repeat_interleave(group, 1), x["v"].repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", x["q"], k) * scale
    dist = pos[:, None] - pos[None, :]
    bias = torch.zeros(HQ, t, t, dtype=torch.float64)
    for i in range(t):
        for j in range(t):
            if doc[i] == doc[j] and 0 <= dist[i, j] < EXTENT:
                bias[:, i, j] = x["table"][i, :, dist[i, j]]
    seen = (doc[:, None] == doc[None, :]) & (dist >= 0)
    if window is not None:
        seen &= dist < window
    scores = (scores + bias).masked_fill(~seen, float("-inf"))
    if "sinks" in x:
        scores = torch.cat([scores, x["sinks"].T.unsqueeze(-1)], -1)
    lse = torch.logsumexp(scores, -1)
    probs = torch.softmax(scores, -1)[..., :t]
    return torch.einsum("hqk,khd->qhd", probs, v), lse.T


def sp_check(cu: list[int], ulysses: int, window: int | None, sinks: bool, seed: int) -> dict:
    """This rank's part of the row under a 2-rank plan through ``relative_forward``: relative errors of its output
    and of the gradients of its queries, keys, values, table rows and sinks against :func:`dense_reference`."""
    torch.set_num_threads(1)
    sp = get_sp(2, ulysses)
    plan = hf_hsap.plan_sequence(torch.tensor(cu), sp)
    x = draw(cu, seed, sinks)
    scale = D ** -0.5
    full = {k: t.clone().requires_grad_(True) for k, t in x.items() if k != "dout"}
    ref, _ = dense_reference(full, cu, scale, window)
    (ref * x["dout"]).sum().backward()
    local = {k: plan.shard(t).clone().requires_grad_(True) for k, t in x.items() if k != "dout"}
    table = local["table"].transpose(0, 1)[None]  # [1, Hq, T_local, E]
    snk = local["sinks"].transpose(0, 1)[None, :, :, None] if sinks else None
    out = relative_forward(torch.nn.Identity(), local["q"].transpose(0, 1)[None], local["k"].transpose(0, 1)[None],
                           local["v"].transpose(0, 1)[None], None, table=table, sinks=snk, scaling=scale,
                           window=window, plan=plan, ids_mask=False, position_ids=None, cu_seq_lens_q=None)[0]
    (out * plan.shard(x["dout"])).sum().backward()
    errs = {"out": rel_err(out, plan.shard(ref))}
    for k in local:
        errs["d" + k] = rel_err(local[k].grad, plan.shard(full[k].grad), scale=full[k].grad)
    idx = plan.local_token_indices()
    starts = torch.tensor(cu)
    errs["docs"] = sorted({int(torch.searchsorted(starts, i, right=True)) - 1 for i in idx.tolist()})
    return errs
