"""The recurrent kernels of Transformers' hybrid models, cut at document boundaries.

Each entry of :data:`OPS` takes the original kernel (Transformers' function behind its kernel hook: the torch
path on CPU, fla / mamba-ssm / causal-conv1d where installed and the inputs are on their device), the call's
arguments and the batch's :class:`~hf_hsap.plan.chain.Chain`, and returns what the original returns, computed
segment by segment from each segment's initial state (:func:`~.handoff.run_segments`):

- ``causal_conv1d_fn``: the state is the segment's last ``kernel - 1`` inputs; a continued segment runs the
  kernel on those inputs followed by its own and drops the first ``kernel - 1`` outputs;
- ``chunk_gated_delta_rule`` / ``chunk_kda``: the kernel's own ``initial_state`` / final state
  (``[heads, d_k, d_v]``);
- ``mamba_chunk_scan_combined`` (Mamba2's SSD): the kernel's own ``initial_states`` / final states
  (``[heads, head_dim, d_state]``);
- ``selective_scan_fn`` (Mamba's scan, which takes no initial state): the scan from the zero state plus the
  initial state's exact contribution, ``y_t += C_t . (exp(A * sum_{s <= t} dt_s) * h_0)``, and the final state
  ``h_T + exp(A * sum dt) * h_0``;
- the fused training paths (``mamba_split_conv1d_scan_combined``, ``mamba_inner_fn``) return ``None``, which
  makes the layer take the path above (what Transformers does on CPU).

:data:`LAYER_OPS` lists the layers with no kernel hook, whose forward is replaced as a whole (MiniMax's lightning
attention: each segment runs the layer's own forward, from the zero state or from a handed-over state through the
one cache method it reads).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..plan.chain import Chain
from .handoff import SegmentOp, StateExchange, run_segments, run_with_final

__all__ = ["LAYER_OPS", "LAYOUT_KWARGS", "OPS"]

# Keyword arguments that describe the packed layout to a kernel: hf_hsap gives each segment its own call instead.
LAYOUT_KWARGS = ("cu_seqlens", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _bind(names: tuple[str, ...], args: tuple, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(named, rest)``: the leading positional ``args`` and keywords of ``names``, and the other keywords
    (layout keywords dropped)."""
    named = dict(zip(names, args))
    rest = {}
    for k, v in kwargs.items():
        if k in names:
            named[k] = v
        elif k not in LAYOUT_KWARGS and not k.startswith("hsap_"):
            rest[k] = v
    return named, rest


def _state_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype hand-offs carry: the kernels keep their states in float32 at least."""
    return torch.promote_types(x.dtype, torch.float32)


def _refuse_cache(what: str) -> None:
    raise ValueError(f"hf_hsap: {what} on packed rows / under SP: a cached state continues one document, not a "
                     "packed row; generate with one document per row (no packing)")


def _run(tensors: list[tuple[torch.Tensor | None, int | None]], fn: Callable, *, out_dim: int,
         state_shape: tuple[int, ...], state_dtype: torch.dtype, chain: Chain, exchange: StateExchange | None,
         rows: int, length: int, final: bool = False) -> Any:
    """:func:`run_segments` over the non-``None`` tensors (``(tensor, token dim)`` pairs); ``fn`` gets them back in
    the same places (``None`` kept). The other arguments as :class:`~.handoff.SegmentOp`'s and :func:`run_segments`'.
    ``final``: also the final state of every row's last document (:func:`run_with_final`): ``(out, states)``."""
    present = [i for i, (t, _) in enumerate(tensors) if t is not None]

    def seg_fn(parts: list[torch.Tensor], init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        full: list[torch.Tensor | None] = [None] * len(tensors)
        for i, p in zip(present, parts):
            full[i] = p
        return fn(full, init)

    op = SegmentOp([tensors[i][0] for i in present], [tensors[i][1] for i in present], seg_fn, out_dim,  # type: ignore[misc]
                   state_shape, state_dtype, rows, length)
    return run_with_final(op, chain) if final else run_segments(op, chain, exchange)


def conv1d(orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain, exchange: StateExchange | None) -> Any:
    """``causal_conv1d_fn(x [B, C, L], weight [C, k], bias, activation)``: ``[B, C, L]``."""
    a, rest = _bind(("hidden_states", "weight", "bias", "activation"), args, kwargs)
    x, w = a["hidden_states"], a["weight"]
    bias, act = a.get("bias"), a.get("activation")
    k = w.shape[-1]

    def fn(t: list, init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ws, bs = t
        if init is None:
            out = orig(xs, ws, bs, activation=act, **rest)
            init = xs.new_zeros((*xs.shape[:2], k - 1))
        else:  # the previous k - 1 inputs first, their outputs dropped
            out = orig(torch.cat([init.to(xs.dtype), xs], dim=-1), ws, bs, activation=act, **rest)[..., k - 1:]
        ctx = torch.cat([init.to(xs.dtype), xs], dim=-1)  # [1, C, k - 1 + n]
        return out, ctx[..., ctx.shape[-1] - (k - 1):]

    return _run([(x, 2), (w, None), (bias, None)], fn, out_dim=2, state_shape=(1, x.shape[1], k - 1),
                state_dtype=x.dtype, chain=chain, exchange=exchange, rows=x.shape[0], length=x.shape[2])


def delta_rule(orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain,
               exchange: StateExchange | None) -> Any:
    """``chunk_gated_delta_rule`` / ``chunk_kda(q, k, v [B, L, H, D], g, beta, initial_state, output_final_state,
    ...)``: ``(out [B, L, H, Dv], final state of every row's last document [B, H, Dk, Dv] or None)``."""
    a, rest = _bind(("query", "key", "value", "g", "beta"), args, kwargs)
    if rest.pop("initial_state", None) is not None:
        _refuse_cache("a delta-rule layer continued from a cached state")
    want = bool(rest.pop("output_final_state", False))
    q, k, v = a["query"], a["key"], a["value"]

    def fn(t: list, init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        qs, ks, vs, gs, bs = t
        out, final = orig(qs, ks, vs, g=gs, beta=bs, initial_state=init, output_final_state=True, **rest)
        return out, final

    state = (1, v.shape[2], k.shape[3], v.shape[3])
    out = _run([(q, 1), (k, 1), (v, 1), (a["g"], 1), (a["beta"], 1)], fn, out_dim=1, state_shape=state,
               state_dtype=_state_dtype(q), chain=chain, exchange=exchange, rows=q.shape[0], length=q.shape[1],
               final=want)
    return out if want else (out, None)


def mamba2_scan(orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain,
                exchange: StateExchange | None) -> Any:
    """``mamba_chunk_scan_combined(x [B, L, H, P], dt [B, L, H], A [H], B, C [B, L, G, N], chunk_size, D, dt_bias,
    initial_states, ..., return_final_states)``: ``out [B, L, H, P]`` (and every row's last document's final state
    ``[B, H, P, N]`` when asked)."""
    names = ("hidden_states", "dt", "A", "B", "C", "chunk_size", "D", "dt_bias")
    a, rest = _bind(names, args, kwargs)
    if rest.pop("initial_states", None) is not None:
        _refuse_cache("a Mamba2 layer continued from a cached state")
    want = bool(rest.pop("return_final_states", False))
    z = rest.pop("z", None)
    x, B = a["hidden_states"], a["B"]
    fixed = {"chunk_size": a["chunk_size"]}

    def fn(t: list, init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        xs, dts, A, Bs, Cs, D, dtb, zs = t
        return orig(xs, dts, A, Bs, Cs, D=D, dt_bias=dtb, z=zs, initial_states=init, return_final_states=True,
                    **fixed, **rest)

    state = (1, x.shape[2], x.shape[3], B.shape[3])
    return _run([(x, 1), (a["dt"], 1), (a["A"], None), (B, 1), (a["C"], 1), (a.get("D"), None),
                 (a.get("dt_bias"), None), (z, 1)], fn, out_dim=1, state_shape=state, state_dtype=_state_dtype(x),
                chain=chain, exchange=exchange, rows=x.shape[0], length=x.shape[1], final=want)


def selective_scan(orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain,
                   exchange: StateExchange | None) -> Any:
    """``selective_scan_fn(x [B, D, L], dt [B, D, L], A [D, N], B, C [B, N, L], D, z [B, D, L], delta_bias,
    delta_softplus, return_last_state)``: ``[B, D, L]`` (and every row's last document's final state ``[B, D, N]``
    when asked)."""
    names = ("hidden_states", "dt", "A", "B", "C", "D", "z", "delta_bias", "delta_softplus")
    a, rest = _bind(names, args, kwargs)
    want = bool(rest.pop("return_last_state", False))
    softplus = bool(a.get("delta_softplus", False))
    x, A = a["hidden_states"], a["A"]

    def fn(t: list, init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        xs, dts, As, Bs, Cs, D, zs, db = t
        if init is None:
            return orig(xs, dts, As, Bs, Cs, D=D, z=zs, delta_bias=db, delta_softplus=softplus,
                        return_last_state=True, **rest)
        y0, h0 = orig(xs, dts, As, Bs, Cs, D=None, z=None, delta_bias=db, delta_softplus=softplus,
                      return_last_state=True, **rest)
        sd = init.dtype
        dt = dts.to(sd) if db is None else dts.to(sd) + db.to(sd)[..., None]
        dt = F.softplus(dt) if softplus else dt
        decay = torch.exp(As.to(sd)[None, :, None, :] * torch.cumsum(dt, dim=-1)[..., None])  # [1, D, n, N]
        y = y0.to(sd) + torch.einsum("bdtn,bdn,bnt->bdt", decay, init, Cs.to(sd))  # [1, D, n]
        if D is not None:
            y = y + xs.to(sd) * D.to(sd)[None, :, None]
        if zs is not None:
            y = y * F.silu(zs.to(sd))
        return y.to(y0.dtype), h0.to(sd) + decay[:, :, -1] * init

    state = (1, x.shape[1], A.shape[-1])
    return _run([(x, 2), (a["dt"], 2), (A, None), (a["B"], 2), (a["C"], 2), (a.get("D"), None), (a.get("z"), 2),
                 (a.get("delta_bias"), None)], fn, out_dim=2, state_shape=state, state_dtype=_state_dtype(x),
                chain=chain, exchange=exchange, rows=x.shape[0], length=x.shape[2], final=want)


def fused_off(orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain,
              exchange: StateExchange | None) -> None:
    """A fused training kernel (conv + scan + projections in one): ``None``, so the layer takes the cut path."""
    return None


OPS: dict[str, Callable[..., Any]] = {
    "causal_conv1d_fn": conv1d,
    "chunk_gated_delta_rule": delta_rule,
    "chunk_kda": delta_rule,
    "mamba_chunk_scan_combined": mamba2_scan,
    "selective_scan_fn": selective_scan,
    "mamba_split_conv1d_scan_combined": fused_off,
    "mamba_inner_fn": fused_off,
}



class _SeededState:
    """The one cache method a lightning-attention layer reads and writes: its running ``K^T V`` state, seeded with
    the state a split document's previous run ended with (what Transformers' own cache path continues from)."""

    def __init__(self, state: torch.Tensor) -> None:
        self.state = state

    def get_linear_cache(self, layer_idx: int) -> torch.Tensor:
        return self.state

    def set_linear_cache(self, layer_idx: int, state: torch.Tensor) -> None:
        """The layer's final state comes back as its second output; nothing to keep here."""


def lightning(layer: torch.nn.Module, orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain,
              exchange: StateExchange | None) -> Any:
    """MiniMax's lightning attention layer ``(hidden [B, L, C], position_embeddings, attention_mask, cache)``:
    ``(out [B, L, C], state)``. Each segment runs the layer's own forward: its block algorithm from the zero state at a
    document's start, its cached recurrence from the handed-over ``[B, H, D, D]`` state otherwise."""
    names = ("hidden_states", "position_embeddings", "attention_mask")
    a, rest = _bind(names, args, kwargs)
    cache = rest.pop("cache", None)
    if cache is not None and cache.get_linear_cache(layer.layer_idx) is not None:
        _refuse_cache("a lightning-attention layer continued from a cached state")
    x, pe = a["hidden_states"], a.get("position_embeddings")
    cos, sin = pe if pe is not None else (None, None)
    params = dict(layer.named_parameters())

    def fn(t: list, init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        xs, cs, ss, *ps = t
        kw = {"position_embeddings": (cs, ss) if cs is not None else None, "attention_mask": None,
              "cache": None if init is None else _SeededState(init), **rest}
        return torch.func.functional_call(layer, dict(zip(params, ps)), (xs,), kw, strict=False)

    heads, dim = layer.num_attention_heads, layer.head_dim
    tensors = [(x, 1), (cos, 1), (sin, 1), *[(p, None) for p in params.values()]]
    how = {"out_dim": 1, "state_shape": (1, heads, dim, dim), "state_dtype": _state_dtype(x), "chain": chain,
           "exchange": exchange, "rows": x.shape[0], "length": x.shape[1]}
    if cache is None:
        return _run(tensors, fn, **how), None
    out, state = _run(tensors, fn, final=True, **how)
    cache.set_linear_cache(layer.layer_idx, state)  # every row's last document continues from here
    return out, state


# Layers whose recurrence runs in their own forward, replaced per instance as a whole: class name -> op.
LAYER_OPS: dict[str, Callable[..., Any]] = {"MiniMaxLightningAttention": lightning}
