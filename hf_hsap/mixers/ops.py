"""The recurrent kernels of Transformers' hybrid models, cut at document boundaries.

Each entry of :data:`OPS` takes the original kernel (Transformers' function behind its kernel hook: the torch
path on CPU, fla / mamba-ssm / causal-conv1d where installed and the inputs are on their device), the call's
arguments and the batch's :class:`~hf_hsap.plan.chain.Chain`, and returns what the original returns, every run of a
document from its true initial state (:func:`~.handoff.run_segments`). Each kernel is a
:class:`~.handoff.Recurrence`: a run from the zero state, the transition of a continued run and the correction its
output takes from the folded initial state:

- ``causal_conv1d_fn``: the state is the run's last ``kernel - 1`` inputs (several earlier runs when they are
  shorter), the transition a shift; a continued run's output is the kernel rerun over them and its own inputs
  (:class:`_Conv`);
- ``chunk_gated_delta_rule`` / ``chunk_kda``: one call from the initial state ``I`` gives the transition
  (``[heads, d_k, d_k]``) and the query the initial state sees; a continued run's output is the kernel rerun from its
  true initial state (:class:`_DeltaRule`);
- ``mamba_chunk_scan_combined`` (Mamba2's SSD) and ``selective_scan_fn`` (Mamba's scan): closed forms of the
  initial state's term and decay (:mod:`.scans`);
- the fused training paths (``mamba_split_conv1d_scan_combined``, ``mamba_inner_fn``) return ``None``, which
  makes the layer take the path above (what Transformers does on CPU).

:data:`LAYER_OPS` lists the layers with no kernel hook, whose forward is replaced as a whole (MiniMax's lightning
attention: each run is the layer's own forward, a continued one rerun from its folded state through the one cache
method it reads).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..plan.chain import Chain
from .calls import batched_runs, bind, refuse_cache, run_call, state_dtype
from .dynamic_conv import dynamic_conv
from .handoff import StateExchange, Summary
from .scans import mamba2_scan, selective_scan

__all__ = ["LAYER_OPS", "OPS"]

class _Conv:
    """``causal_conv1d_fn`` on one run ``(x [1, C, n], weight [C, k], bias, activation)``: the state is the run's last
    ``k - 1`` inputs, the transition shifts it by ``n`` (zero once ``n >= k - 1``); both come from the inputs
    without a kernel call. A continued run's output is the kernel rerun over the inputs before it and its own
    (``rerun``; the activation is not affine), and its correction recomputes its first ``min(n, k - 1)`` outputs,
    which are all its initial state reaches."""

    rerun = True

    def __init__(self, orig: Callable, act: Any, rest: dict[str, Any], channels: int, k: int,
                 dtype: torch.dtype) -> None:
        self.orig, self.act, self.rest, self.k = orig, act, rest, k
        self.state_shape, self.transition_shape, self.state_dtype = (1, channels, k - 1), (k - 1, k - 1), dtype

    def _tail(self, init: torch.Tensor | None, xs: torch.Tensor) -> torch.Tensor:
        """The last ``k - 1`` inputs of ``[init | xs]`` (zeros for ``None``), a small copy: a view would keep the
        whole input alive as long as the state."""
        m = self.k - 1
        ctx = torch.cat([xs.new_zeros((*xs.shape[:2], m)) if init is None else init.to(xs.dtype),
                         xs[..., max(0, xs.shape[-1] - m):]], -1)
        return ctx[..., ctx.shape[-1] - m:].contiguous()

    def run(self, t: list, init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ws, bs = t
        if init is None:
            out = self.orig(xs, ws, bs, activation=self.act, **self.rest)
        else:  # the previous k - 1 inputs first, their outputs dropped (a copy: the longer output is freed)
            out = self.orig(torch.cat([init.to(xs.dtype), xs], dim=-1), ws, bs, activation=self.act,
                            **self.rest)[..., self.k - 1:].contiguous()
        return out, self._tail(init, xs)

    def run_many(self, parts: list[list]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Runs from the zero state, padded after their tokens (a causal output never reads what follows)."""
        outs = batched_runs(parts, (2, None, None), left=False,
                            call=lambda t: self.orig(*t, activation=self.act, **self.rest),
                            split=lambda y, row, n, _: y[row:row + 1, :, :n])
        return [(out, self._tail(None, p[0])) for out, p in zip(outs, parts)]

    def summarize(self, t: list) -> Summary:
        return self.summarize_many([t])[0]

    def summarize_many(self, parts: list[list], ends: list[bool] | None = None) -> list[Summary]:
        """Every continued run's final state from zero and transition (none for a run no later run continues, per
        ``ends``), and the inputs its correction reads (its first ``k - 1``)."""
        ends = [False] * len(parts) if ends is None else ends
        out = []
        for (xs, ws, bs), end in zip(parts, ends):
            n = xs.shape[-1]
            carry = (xs[..., :min(n, self.k - 1)].clone(), ws, bs, n)
            out.append(Summary(None, None, None, carry) if end else
                       Summary(None, self._tail(None, xs), self._shift(n, xs.device), carry))
        return out

    def _shift(self, n: int, device: torch.device) -> torch.Tensor:
        """The transition of a run of ``n`` tokens: ``S' = S @ shift`` moves ``S[..., j + n]`` to ``j``."""
        m = self.k - 1
        shift = torch.zeros(m, m, dtype=self.state_dtype, device=device)
        if n < m:
            shift[torch.arange(n, m), torch.arange(0, m - n)] = 1
        return shift

    def correct(self, summary: Summary, init: torch.Tensor) -> torch.Tensor:
        """The run's first ``min(n, k - 1)`` outputs from ``init``, zero after them: its output's dependence on its
        initial state (what the initial state's gradient reads)."""
        head_in, ws, bs, n = summary.carry
        head = self.run([head_in, ws, bs], init)[0]
        return F.pad(head, (0, n - head.shape[-1]))

    def transit(self, transition: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return state @ transition.to(state.dtype)


def conv1d(orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain, exchange: StateExchange | None) -> Any:
    """``causal_conv1d_fn(x [B, C, L], weight [C, k], bias, activation)``: ``[B, C, L]``."""
    a, rest = bind(("hidden_states", "weight", "bias", "activation"), args, kwargs)
    x, w = a["hidden_states"], a["weight"]
    rec = _Conv(orig, a.get("activation"), rest, x.shape[1], w.shape[-1], x.dtype)
    return run_call([(x, 2), (w, None), (a.get("bias"), None)], rec, out_dim=2, chain=chain, exchange=exchange,
                rows=x.shape[0], length=x.shape[2])


class _DeltaRule:
    """``chunk_gated_delta_rule`` / ``chunk_kda`` on one run ``(q, k, v [1, n, H, D], g, beta)``, state
    ``[1, H, D_k, D_v]``. The transition acts on the state's ``D_k`` rows from the left and every ``D_v`` column
    evolves alike, so a call with the initial state ``I`` and ``D_k`` zero value columns gives the transition ``A``
    (``[1, H, D_k, D_k]``) and the query the initial state sees, ``q~`` (``[1, n, H, D_k]``: ``out = out_0 + q~ S0``).
    A run that a later run continues also needs its final state from zero, so its call widens the value instead
    (``[v | 0]``, initial state ``[0 | I]``). Both run in the state dtype without autograd: the run's output is the
    plain kernel rerun from its true initial state (``rerun``), whose backward costs what a whole run's does, where
    the summarising call's would cost more; the summary gives the folds and the initial state's gradient
    (``q~^T dout``)."""

    rerun = True

    def __init__(self, orig: Callable, rest: dict[str, Any], heads: int, dk: int, dv: int,
                 dtype: torch.dtype) -> None:
        self.orig, self.rest, self.dk, self.dv = orig, rest, dk, dv
        self.state_dtype = state_dtype(dtype)
        self.state_shape, self.transition_shape = (1, heads, dk, dv), (1, heads, dk, dk)

    def run(self, t: list, init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        qs, ks, vs, gs, bs = t
        out, final = self.orig(qs, ks, vs, g=gs, beta=bs, initial_state=init, output_final_state=True, **self.rest)
        return out, final

    def run_many(self, parts: list[list]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Runs from the zero state, padded after their tokens with zero ``q, k, v, g, beta`` (an identity step: the
        state stays the run's final state)."""
        def call(t: list) -> tuple[torch.Tensor, torch.Tensor]:
            return self.orig(t[0], t[1], t[2], g=t[3], beta=t[4], initial_state=None, output_final_state=True,
                             **self.rest)

        return batched_runs(parts, (1,) * 5, left=False, call=call,
                            split=lambda r, row, n, _: (r[0][row:row + 1, :n], r[1][row:row + 1]))

    def summarize(self, t: list) -> Summary:
        return self.summarize_many([t])[0]

    def summarize_many(self, parts: list[list], ends: list[bool] | None = None) -> list[Summary]:
        """Every run's summary without its zero-state output (the rerun gives the output); ``ends[i]``: run ``i`` is
        continued by no later run (its transition and final state are not computed either)."""
        ends = [False] * len(parts) if ends is None else ends
        out: list[Summary] = [None] * len(parts)  # type: ignore[list-item]
        for last in (False, True):
            idx = [i for i, e in enumerate(ends) if e == last]
            if idx:
                for i, s in zip(idx, self._summaries([parts[i] for i in idx], whole=not last)):
                    out[i] = s
        return out

    def _summaries(self, parts: list[list], *, whole: bool) -> list[Summary]:
        """One batched summarising call (:meth:`summarize_many`); ``whole``: with the final state from zero and the
        transition (the value widened) or not (the value all zero columns)."""
        sd, dv = self.state_dtype, self.dv if whole else 0

        def call(t: list) -> tuple[torch.Tensor, torch.Tensor]:
            qs, ks, vs, gs, bs = (x.to(sd) for x in t)
            zeros = vs.new_zeros((*vs.shape[:-1], self.dk))
            eye = torch.eye(self.dk, dtype=sd, device=vs.device).expand(vs.shape[0], self.state_shape[1], -1, -1)
            if whole:
                vs, init = torch.cat([vs, zeros], dim=-1), torch.cat([eye.new_zeros((*eye.shape[:3], dv)), eye], -1)
            else:
                vs, init = zeros, eye.contiguous()
            return self.orig(qs, ks, vs, g=gs, beta=bs, initial_state=init, output_final_state=True, **self.rest)

        def split(r: tuple, row: int, n: int, _: int) -> Summary:
            out, final = r[0][row:row + 1, :n], r[1][row:row + 1]
            carry = (out[..., dv:].contiguous(), parts[0][0].dtype)  # not the widened output: only q~ is kept
            if not whole:
                return Summary(None, None, None, carry)
            return Summary(None, final[..., :dv], final[..., dv:], carry)

        return batched_runs(parts, (1,) * 5, left=False, call=call, split=split)

    def correct(self, summary: Summary, init: torch.Tensor) -> torch.Tensor:
        """``out_0 + q~ S0``: the output from ``init`` (the initial state's term alone for a summary without
        ``out``)."""
        q_seen, dtype = summary.carry
        term = torch.einsum("bthk,bhkv->bthv", q_seen, init)
        return (term if summary.out is None else summary.out + term).to(dtype)

    def transit(self, transition: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return transition @ state


def delta_rule(orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain,
               exchange: StateExchange | None) -> Any:
    """``chunk_gated_delta_rule`` / ``chunk_kda(q, k, v [B, L, H, D], g, beta, initial_state, output_final_state,
    ...)``: ``(out [B, L, H, Dv], final state of every row's last document [B, H, Dk, Dv] or None)``."""
    a, rest = bind(("query", "key", "value", "g", "beta"), args, kwargs)
    if rest.pop("initial_state", None) is not None:
        refuse_cache("a delta-rule layer continued from a cached state")
    want = bool(rest.pop("output_final_state", False))
    q, k, v = a["query"], a["key"], a["value"]
    rec = _DeltaRule(orig, rest, v.shape[2], k.shape[3], v.shape[3], q.dtype)
    out = run_call([(q, 1), (k, 1), (v, 1), (a["g"], 1), (a["beta"], 1)], rec, out_dim=1, chain=chain,
               exchange=exchange, rows=q.shape[0], length=q.shape[1], final=want)
    return out if want else (out, None)


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


class _Lightning:
    """MiniMax's lightning attention layer on one run ``(hidden [1, n, C], cos, sin, *parameters)``, state
    ``[1, H, D, D]`` (``K^T V``): its own forward, from the zero state or seeded with a state through the one cache
    method it reads. The transition is the data-free decay ``exp(-slope_h n)`` (``[1, H, 1, 1]``); the initial
    state's term comes before the layer's norm and output gate, so a continued run's output is the layer rerun
    from its true initial state."""

    def __init__(self, layer: torch.nn.Module, params: list[str], rest: dict[str, Any], dtype: torch.dtype) -> None:
        self.layer, self.params, self.rest = layer, params, rest
        heads, dim = layer.num_attention_heads, layer.head_dim
        self.state_dtype = state_dtype(dtype)
        self.state_shape, self.transition_shape = (1, heads, dim, dim), (1, heads, 1, 1)

    def run(self, t: list, init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        xs, cs, ss, *ps = t
        kw = {"position_embeddings": (cs, ss) if cs is not None else None, "attention_mask": None,
              "cache": None if init is None else _SeededState(init), **self.rest}
        out, final = torch.func.functional_call(self.layer, dict(zip(self.params, ps)), (xs,), kw, strict=False)
        return out, final

    def summarize(self, t: list) -> Summary:
        out, final = self.run(t, None)
        slope = self.layer.slope_rate.to(self.state_dtype).reshape(self.transition_shape)
        return Summary(out, final.to(self.state_dtype), torch.exp(-slope * t[0].shape[1]), t)

    def correct(self, summary: Summary, init: torch.Tensor) -> torch.Tensor:
        return self.run(summary.carry, init)[0]

    def transit(self, transition: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return transition * state


def lightning(layer: torch.nn.Module, orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain,
              exchange: StateExchange | None) -> Any:
    """MiniMax's lightning attention layer ``(hidden [B, L, C], position_embeddings, attention_mask, cache)``:
    ``(out [B, L, C], state)`` (:class:`_Lightning` per run)."""
    names = ("hidden_states", "position_embeddings", "attention_mask")
    a, rest = bind(names, args, kwargs)
    cache = rest.pop("cache", None)
    if cache is not None and cache.get_linear_cache(layer.layer_idx) is not None:
        refuse_cache("a lightning-attention layer continued from a cached state")
    x, pe = a["hidden_states"], a.get("position_embeddings")
    cos, sin = pe if pe is not None else (None, None)
    params = dict(layer.named_parameters())
    rec = _Lightning(layer, list(params), rest, x.dtype)
    tensors = [(x, 1), (cos, 1), (sin, 1), *[(p, None) for p in params.values()]]
    how = {"out_dim": 1, "chain": chain, "exchange": exchange, "rows": x.shape[0], "length": x.shape[1]}
    if cache is None:
        return run_call(tensors, rec, **how), None
    out, state = run_call(tensors, rec, final=True, **how)
    cache.set_linear_cache(layer.layer_idx, state)  # every row's last document continues from here
    return out, state


# Layers whose recurrence runs in their own forward, replaced per instance as a whole: class name -> op.
LAYER_OPS: dict[str, Callable[..., Any]] = {"MiniMaxLightningAttention": lightning,
                                             "Inkling2DynamicShortConvolution": dynamic_conv,
                                             "Inkling2LoopDynamicShortConvolution": dynamic_conv}
