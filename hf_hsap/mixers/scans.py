"""The state-space scans of hybrid models (Mamba2's SSD, Mamba's selective scan) as affine maps of their initial state.

Both decay their state elementwise, so a run's transition is a decay fixed by its ``dt`` alone and the initial state's
contribution to the output has a closed form: a continued run is the kernel from the zero state plus that term,
added in the state dtype before the output gate ``z`` and the rounding (:class:`~.handoff.Recurrence`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..plan.chain import Chain
from .calls import batched_runs, bind, refuse_cache, run_call, state_dtype
from .handoff import StateExchange, Summary

__all__ = ["mamba2_scan", "selective_scan"]


class _Mamba2:
    """``mamba_chunk_scan_combined`` on one run ``(x [1, n, H, P], dt [1, n, H], A [H], B, C [1, n, G, N], D,
    dt_bias, z)``, state ``[1, H, P, N]``: ``y_t += exp(A_h Lambda_t) C_t . S0`` with ``Lambda_t`` the inclusive
    cumulative sum of the kernel's own ``dt`` (bias, softplus, clamp), and the transition ``exp(A_h Lambda_n)``
    (``[1, H]``)."""

    def __init__(self, orig: Callable, fixed: dict[str, Any], rest: dict[str, Any], x: torch.Tensor, n_state: int
                 ) -> None:
        self.orig, self.fixed, self.rest = orig, fixed, rest
        self.state_dtype = state_dtype(x.dtype)
        self.state_shape, self.transition_shape = (1, x.shape[2], x.shape[3], n_state), (1, x.shape[2])

    def run(self, t: list, init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        xs, dts, A, Bs, Cs, D, dtb, zs = t
        out, final = self.orig(xs, dts, A, Bs, Cs, D=D, dt_bias=dtb, z=zs, initial_states=init,
                               return_final_states=True, **self.fixed, **self.rest)
        return out, final

    _DIMS = (1, 1, None, 1, 1, None, None, 1)

    def _many(self, parts: list[list], *, gated: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Runs from the zero state in padded calls, padded BEFORE their tokens with zero ``x, B, C`` (the state
        stays zero there whatever ``dt`` decays it by); ``gated``: with ``z`` (else ``z`` is left to the
        correction)."""
        def call(t: list) -> tuple[torch.Tensor, torch.Tensor]:
            xs, dts, A, Bs, Cs, D, dtb, zs = t
            return self.orig(xs, dts, A, Bs, Cs, D=D, dt_bias=dtb, z=zs if gated else None, initial_states=None,
                             return_final_states=True, **self.fixed, **self.rest)

        return batched_runs(parts, self._DIMS, left=True, call=call,
                            split=lambda r, row, n, m: (r[0][row:row + 1, m - n:], r[1][row:row + 1]))

    def run_many(self, parts: list[list]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self._many(parts, gated=True)

    def summarize_many(self, parts: list[list]) -> list[Summary]:
        return [self._summary(t, out, final) for t, (out, final) in zip(parts, self._many(parts, gated=False))]

    def summarize(self, t: list) -> Summary:
        return self.summarize_many([t])[0]

    def _summary(self, t: list, out: torch.Tensor, final: torch.Tensor) -> Summary:
        xs, dts, A, Bs, Cs, D, dtb, zs = t
        sd = self.state_dtype
        dt = dts.to(sd) if dtb is None else dts.to(sd) + dtb.to(sd)
        if self.rest.get("dt_softplus", False):
            dt = F.softplus(dt)
        lo, hi = self.rest.get("dt_limit", (0.0, float("inf")))
        log_decay = A.to(sd) * torch.cumsum(torch.clamp(dt, min=lo, max=hi), dim=1)  # [1, n, H]
        return Summary(out, final.to(sd), torch.exp(log_decay[:, -1]), (log_decay, Cs, zs, xs.dtype))

    def correct(self, summary: Summary, init: torch.Tensor) -> torch.Tensor:
        log_decay, Cs, zs, dtype = summary.carry
        b, n, groups, _ = Cs.shape
        heads, p = init.shape[1], init.shape[2]
        # heads grouped as the kernel shares C among them (no [1, n, H, N] copy of C): [1, n, G, H / G, P]
        # C copied (``[1, n, G, N]``, small): the einsum saves it, and a view would keep the whole convolution
        # output it is cut from alive until backward
        c = Cs.to(init.dtype, memory_format=torch.contiguous_format, copy=True)
        ct = torch.einsum("btgn,bgkpn->btgkp", c, init.reshape(b, groups, heads // groups, p, -1))
        y = torch.addcmul(summary.out.to(init.dtype), torch.exp(log_decay)[..., None], ct.reshape(b, n, heads, p))
        if zs is not None:
            y = y * F.silu(zs.to(init.dtype))
        return y.to(dtype)

    def transit(self, transition: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return transition[..., None, None] * state


def mamba2_scan(orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain,
                exchange: StateExchange | None) -> Any:
    """``mamba_chunk_scan_combined(x [B, L, H, P], dt [B, L, H], A [H], B, C [B, L, G, N], chunk_size, D, dt_bias,
    initial_states, ..., return_final_states)``: ``out [B, L, H, P]`` (and every row's last document's final state
    ``[B, H, P, N]`` when asked)."""
    names = ("hidden_states", "dt", "A", "B", "C", "chunk_size", "D", "dt_bias")
    a, rest = bind(names, args, kwargs)
    if rest.pop("initial_states", None) is not None:
        refuse_cache("a Mamba2 layer continued from a cached state")
    want = bool(rest.pop("return_final_states", False))
    z = rest.pop("z", None)
    x, B = a["hidden_states"], a["B"]
    rec = _Mamba2(orig, {"chunk_size": a["chunk_size"]}, rest, x, B.shape[3])
    return run_call([(x, 1), (a["dt"], 1), (a["A"], None), (B, 1), (a["C"], 1), (a.get("D"), None),
                     (a.get("dt_bias"), None), (z, 1)], rec, out_dim=1, chain=chain, exchange=exchange,
                    rows=x.shape[0], length=x.shape[1], final=want)


class _Selective:
    """``selective_scan_fn`` on one run ``(x [1, D, n], dt [1, D, n], A [D, N], B, C [1, N, n], D, z, delta_bias)``
    (the kernel takes no initial state), state ``[1, D, N]``: the scan without ``D`` and ``z`` from the zero state,
    plus ``C_t . (exp(A * sum_{s <= t} dt_s) * h_0)``, then ``D`` and ``silu(z)``; the transition is
    ``exp(A * sum dt)`` (``[1, D, N]``)."""

    def __init__(self, orig: Callable, softplus: bool, rest: dict[str, Any], x: torch.Tensor, n_state: int) -> None:
        self.orig, self.softplus, self.rest = orig, softplus, rest
        self.state_dtype = state_dtype(x.dtype)
        self.state_shape = self.transition_shape = (1, x.shape[1], n_state)

    def run(self, t: list, init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if init is not None:
            s = self.summarize(t)
            return self.correct(s, init), s.final + s.transition * init
        xs, dts, As, Bs, Cs, D, zs, db = t
        out, final = self.orig(xs, dts, As, Bs, Cs, D=D, z=zs, delta_bias=db, delta_softplus=self.softplus,
                               return_last_state=True, **self.rest)
        return out, final

    _DIMS = (2, 2, None, 2, 2, None, 2, None)

    def _many(self, parts: list[list], *, plain: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Runs from the zero state in padded calls, padded BEFORE their tokens with zero ``x`` (the state stays
        zero there); ``plain``: with ``D`` and ``z`` (else they are left to the correction)."""
        def call(t: list) -> tuple[torch.Tensor, torch.Tensor]:
            xs, dts, As, Bs, Cs, D, zs, db = t
            return self.orig(xs, dts, As, Bs, Cs, D=D if plain else None, z=zs if plain else None, delta_bias=db,
                             delta_softplus=self.softplus, return_last_state=True, **self.rest)

        return batched_runs(parts, self._DIMS, left=True, call=call,
                            split=lambda r, row, n, m: (r[0][row:row + 1, :, m - n:], r[1][row:row + 1]))

    def run_many(self, parts: list[list]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return self._many(parts, plain=True)

    def summarize_many(self, parts: list[list]) -> list[Summary]:
        return [self._summary(t, y0, h0) for t, (y0, h0) in zip(parts, self._many(parts, plain=False))]

    def summarize(self, t: list) -> Summary:
        return self.summarize_many([t])[0]

    def _summary(self, t: list, y0: torch.Tensor, h0: torch.Tensor) -> Summary:
        xs, dts, As, Bs, Cs, D, zs, db = t
        sd = self.state_dtype
        dt = dts.to(sd) if db is None else dts.to(sd) + db.to(sd)[..., None]
        dt = F.softplus(dt) if self.softplus else dt
        decay = torch.exp(As.to(sd)[None, :, None, :] * torch.cumsum(dt, dim=-1)[..., None])  # [1, D, n, N]
        return Summary(y0, h0.to(sd), decay[:, :, -1], (decay, Cs, xs, D, zs, y0.dtype))

    def correct(self, summary: Summary, init: torch.Tensor) -> torch.Tensor:
        decay, Cs, xs, D, zs, dtype = summary.carry
        sd = init.dtype
        y = summary.out.to(sd) + torch.einsum("bdtn,bdn,bnt->bdt", decay, init, Cs.to(sd))  # [1, D, n]
        if D is not None:
            y = y + xs.to(sd) * D.to(sd)[None, :, None]
        if zs is not None:
            y = y * F.silu(zs.to(sd))
        return y.to(dtype)

    def transit(self, transition: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return transition * state


def selective_scan(orig: Callable, args: tuple, kwargs: dict[str, Any], chain: Chain,
                   exchange: StateExchange | None) -> Any:
    """``selective_scan_fn(x [B, D, L], dt [B, D, L], A [D, N], B, C [B, N, L], D, z [B, D, L], delta_bias,
    delta_softplus, return_last_state)``: ``[B, D, L]`` (and every row's last document's final state ``[B, D, N]``
    when asked)."""
    names = ("hidden_states", "dt", "A", "B", "C", "D", "z", "delta_bias", "delta_softplus")
    a, rest = bind(names, args, kwargs)
    want = bool(rest.pop("return_last_state", False))
    x, A = a["hidden_states"], a["A"]
    rec = _Selective(orig, bool(a.get("delta_softplus", False)), rest, x, A.shape[-1])
    return run_call([(x, 2), (a["dt"], 2), (A, None), (a["B"], 2), (a["C"], 2), (a.get("D"), None), (a.get("z"), 2),
                     (a.get("delta_bias"), None)], rec, out_dim=2, chain=chain, exchange=exchange, rows=x.shape[0],
                    length=x.shape[2], final=want)
