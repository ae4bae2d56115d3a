"""How the heads all-to-all mode (:mod:`.heads`) shards the arguments of every recurrent kernel of :data:`.ops.OPS`.

A recurrent kernel computes every head (or channel) independently of the others, so under SP a group of ``U`` ranks
can trade its sequence shards for head shards: rank ``u`` gets every token of the group for the ``u``-th contiguous
block of heads, runs whole documents, and trades back. :data:`HEADS_SPECS` says, per kernel, what each argument is:

- ``heads``: a token tensor split along its head (or channel) dimension, e.g. the delta rule's ``q, k, v, g, beta``,
  Mamba2's ``x, dt``, Mamba's ``x, dt, z``, the short convolution's input;
- ``groups``: a token tensor of per-group values shared by consecutive heads (Mamba2's ``B, C``): split along the
  groups when they divide ``U`` (rank ``u``'s heads then use exactly its block of groups), else every rank gets
  every group and picks, for each of its heads, the head's group;
- ``whole``: a token tensor every rank gets whole (Mamba's ``B, C [B, N, L]``, shared by all channels);
- ``param``: a per-head (per-channel) parameter, sliced along its first dimension (``A, D, dt_bias``, the
  convolution's ``weight [C, k]`` and ``bias``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["HEADS_SPECS", "KernelSpec", "Shard"]

KINDS = ("heads", "groups", "whole", "param")


@dataclass(frozen=True)
class Shard:
    """How one argument is distributed in the heads mode.

    Attributes:
        kind: one of ``heads``, ``groups``, ``whole``, ``param`` (module docstring).
        tokens: the token dimension (``None`` for a parameter); the batch dimension is always 0.
        split: the head / channel / group dimension (``None`` for ``whole``).
        heads_of: for ``groups``, the argument whose dimension ``split`` counts the heads.
    """

    kind: str
    tokens: int | None = None
    split: int | None = None
    heads_of: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown shard kind {self.kind!r}; one of {KINDS}")


@dataclass(frozen=True)
class KernelSpec:
    """A kernel's arguments as the heads mode reads them.

    Attributes:
        names: the kernel's leading parameters in positional order (Transformers' torch function's names, which
            :mod:`.ops` binds by).
        shards: how each tensor argument is distributed (an argument not listed is passed as it is, and may not be
            a tensor unless it describes the local layout, which whole documents make moot).
        out: the token and head dimensions of the output (the first output when the kernel returns a tuple).
        out_like: the argument whose per-token shape the output has (what the byte count reads).
        refused: keywords that must be ``None`` / false: a cached state continues one document, and a final state
            under SP ends no document of this rank's own.
    """

    names: tuple[str, ...]
    shards: Mapping[str, Shard]
    out: Shard
    out_like: str
    refused: tuple[str, ...] = field(default=())


_HEAD = Shard("heads", tokens=1, split=2)  # [B, L, H, ...]
_CHANNEL = Shard("heads", tokens=2, split=1)  # [B, C, L]
_PARAM = Shard("param", split=0)

_DELTA_RULE = KernelSpec(
    names=("query", "key", "value", "g", "beta", "chunk_size", "initial_state", "output_final_state"),
    # q, k [B, L, Hk, dk]; v [B, L, Hv, dv]; g [B, L, Hv] (KDA: [B, L, H, dk]); beta [B, L, Hv]: splitting Hk and Hv
    # alike keeps the kernel's grouping (value head h reads key head h // (Hv / Hk))
    shards=MappingProxyType({n: _HEAD for n in ("query", "key", "value", "g", "beta")}),
    out=_HEAD, out_like="value", refused=("initial_state", "output_final_state"))

_MAMBA2 = KernelSpec(
    names=("hidden_states", "dt", "A", "B", "C", "chunk_size", "D", "dt_bias", "initial_states", "dt_softplus",
           "dt_limit", "return_final_states"),
    # x, z [B, L, H, P]; dt [B, L, H]; B, C [B, L, G, N]; A, dt_bias [H]; D [H] or [H, P]
    shards=MappingProxyType({"hidden_states": _HEAD, "dt": _HEAD, "z": _HEAD,
                             "B": Shard("groups", tokens=1, split=2, heads_of="hidden_states"),
                             "C": Shard("groups", tokens=1, split=2, heads_of="hidden_states"),
                             "A": _PARAM, "D": _PARAM, "dt_bias": _PARAM}),
    out=_HEAD, out_like="hidden_states", refused=("initial_states", "return_final_states"))

_SELECTIVE_SCAN = KernelSpec(
    names=("hidden_states", "dt", "A", "B", "C", "D", "z", "delta_bias", "delta_softplus", "return_last_state"),
    # x, dt, z [B, D, L]; B, C [B, N, L] (every channel reads them); A [D, N]; D, delta_bias [D]
    shards=MappingProxyType({"hidden_states": _CHANNEL, "dt": _CHANNEL, "z": _CHANNEL,
                             "B": Shard("whole", tokens=2), "C": Shard("whole", tokens=2),
                             "A": _PARAM, "D": _PARAM, "delta_bias": _PARAM}),
    out=_CHANNEL, out_like="hidden_states", refused=("return_last_state",))

_CONV1D = KernelSpec(
    names=("hidden_states", "weight", "bias", "activation"),
    # x [B, C, L]; weight [C, k]; bias [C]: depthwise, so any contiguous block of channels runs alone
    shards=MappingProxyType({"hidden_states": _CHANNEL, "weight": _PARAM, "bias": _PARAM}),
    out=_CHANNEL, out_like="hidden_states")

HEADS_SPECS: Mapping[str, KernelSpec] = MappingProxyType({
    "chunk_gated_delta_rule": _DELTA_RULE,
    "chunk_kda": _DELTA_RULE,
    "mamba_chunk_scan_combined": _MAMBA2,
    "selective_scan_fn": _SELECTIVE_SCAN,
    "causal_conv1d_fn": _CONV1D,
})
