"""Does a row fit, and if not, which lever makes it fit: the check the recipes run before their first step, and the
lines ``hsap-plan --max-length`` prints (pure: the device's memory is an argument).
"""
from __future__ import annotations

from typing import Any

from ..model_shape import MODEL_SHAPES, ModelShape
from .fit import longest_row
from .host import (DEFAULT_GPUS_PER_NODE, DEFAULT_HOST_MEMORY_GIB, DEFAULT_PROCESS_FOOTPRINT_GIB, HOST_RESERVE_FRACTION,
                   OFFLOADS, host_budget_bytes, host_memory)
from .levers import LEVER_ORDER, MemoryLevers
from .model import predict_step_memory

__all__ = ["LEVER_ORDER", "check_host_fits", "check_row_fits", "levers_from_names", "max_length_lines",
           "MEMORY_MODELS"]

GIB = 2**30



def _config(shape: ModelShape, model_type: str) -> dict[str, Any]:
    """A config dict (config.json's fields) of a dense model's shape."""
    return dict(model_type=model_type, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                num_hidden_layers=shape.layers, num_attention_heads=shape.q_heads, num_key_value_heads=shape.kv_heads,
                head_dim=shape.head_dim, vocab_size=shape.vocab, tie_word_embeddings=shape.tied)


# Models users train, as config.json fields (no hub): the Llama-3-8B of hf_hsap.model_shape's table, and two more
MEMORY_MODELS: dict[str, dict[str, Any]] = {
    "llama-3-8b": _config(MODEL_SHAPES["llama3-8b"], "llama"),
    "qwen3-8b": _config(ModelShape(name="Qwen3-8B", layers=36, hidden=4096, q_heads=32, kv_heads=8, head_dim=128,
                                   intermediate=12288, vocab=151936), "qwen3"),
    "llama-3-70b": _config(ModelShape(name="Llama-3-70B", layers=80, hidden=8192, q_heads=64, kv_heads=8,
                                      head_dim=128, intermediate=28672, vocab=128256), "llama"),
}


def levers_from_names(names: str, *, checkpoint_layers: int = 1, layers_kept_on_device: int = 0) -> MemoryLevers:
    """``"all"``, ``"none"`` or comma-separated lever names (:data:`LEVER_ORDER`) as :class:`MemoryLevers`, with
    the two counts (``hsap-plan --checkpoint-layers`` / ``--layers-kept-on-device``).

    Raises:
        ValueError: an unknown name, or a count its lever is not on for (:meth:`MemoryLevers.check_counts`).
    """
    chosen = {"all": set(LEVER_ORDER), "none": set()}.get(names)
    if chosen is None:
        chosen = {n.strip() for n in names.split(",") if n.strip()}
        unknown = chosen - set(LEVER_ORDER)
        if unknown:
            raise ValueError(f"unknown levers {sorted(unknown)}; use all, none or some of {', '.join(LEVER_ORDER)}")
    return MemoryLevers(**{n: n in chosen for n in LEVER_ORDER}, checkpoint_layers=checkpoint_layers,
                        layers_kept_on_device=layers_kept_on_device).check_counts()


def _with(levers: MemoryLevers, names: tuple[str, ...]) -> MemoryLevers:
    return levers.replace(**{n: True for n in names})


def _gib(n: float) -> str:
    """Bytes as GiB with at least two significant digits."""
    g = n / GIB
    return f"{g:.1f} GiB" if g >= 1 else f"{g:.2g} GiB"


def check_row_fits(config: Any, row_tokens: int, *, memory_gib: float | None, world: int, sp_size: int,
                   levers: MemoryLevers, sharding: str = "ddp", spelling: dict[str, str] | None = None,
                   host_memory_gib: float | None = None, gpus_per_node: int = 1,
                   footprint_gib: float = DEFAULT_PROCESS_FOOTPRINT_GIB, **kw: Any) -> None:
    """Refuse, before the first step, a row whose modelled step does not fit ``memory_gib`` per device, or (with
    ``host_memory_gib``) whose host memory does not fit the node's (:func:`check_host_fits`).

    Args:
        config: the model's config. row_tokens: tokens of one packed row. memory_gib: one device's memory (None:
            the device not checked).
        world, sp_size, levers, sharding, **kw: as for :func:`~.model.predict_step_memory` (``offload`` too).
        spelling: how the caller's users turn each lever on (e.g. ``{"gradient_checkpointing":
            "--gradient_checkpointing"}``; ``"offload"`` and ``"host_memory_gib"`` too); default
            ``MemoryLevers(name=True)``.
        host_memory_gib: one node's host memory (None: the host not checked). gpus_per_node: processes per node.
        footprint_gib: one process's own host footprint.

    Raises:
        ValueError: it does not fit; the message names the levers that would make it fit (each added in
            :data:`LEVER_ORDER`), else the longest row that fits with every lever.
    """
    need = predict_step_memory(config, row_tokens, world=world, sp_size=sp_size, sharding=sharding, levers=levers,
                               **kw)
    if memory_gib is None or need.total <= memory_gib * GIB:
        if host_memory_gib is not None:
            check_host_fits(config, row_tokens, host_memory_gib=host_memory_gib, gpus_per_node=gpus_per_node,
                            footprint_gib=footprint_gib, memory_gib=memory_gib, world=world, sp_size=sp_size,
                            levers=levers, sharding=sharding, spelling=spelling, **kw)
        return
    missing = tuple(n for n in LEVER_ORDER if not getattr(levers, n))
    advice = None
    for k in range(1, len(missing) + 1):
        more = _with(levers, missing[:k])
        if predict_step_memory(config, row_tokens, world=world, sp_size=sp_size, sharding=sharding, levers=more,
                               **kw).total <= memory_gib * GIB:
            spell = spelling or {}
            advice = "turn on " + ", ".join(spell.get(n, f"MemoryLevers({n}=True)") for n in missing[:k])
            break
    if advice is None:
        best = longest_row(config, gpus=world, memory_per_gpu_gib=memory_gib, levers=_with(levers, missing),
                           sharding=sharding, sp_size=sp_size, reserve_gib=0.0, **kw)
        advice = (f"even with every lever at most {best.tokens:,} tokens fit ({best.limiting_term} limits it): "
                  "use a shorter --max_length, or more GPUs per row (--sp_size)")
    raise ValueError(f"a row of {row_tokens:,} tokens needs about {_gib(need.total)} per device (largest term: "
                     f"{need.limiting_term()}, {_gib(getattr(need, need.limiting_term()))}) but the device has "
                     f"{_gib(memory_gib * GIB)}: {advice}")


def check_host_fits(config: Any, row_tokens: int, *, host_memory_gib: float, gpus_per_node: int,
                    footprint_gib: float, memory_gib: float | None, world: int, sp_size: int, levers: MemoryLevers,
                    sharding: str, spelling: dict[str, str] | None = None, offload: str = "none", **kw: Any) -> None:
    """Refuse a row whose host memory per process (:func:`~.host.host_memory`) exceeds the node's less
    :data:`~.host.HOST_RESERVE_FRACTION`, over ``gpus_per_node`` processes.

    Args:
        config, row_tokens, world, sp_size, levers, sharding, offload, **kw: as for :func:`check_row_fits`.
        host_memory_gib: one node's host memory. gpus_per_node: processes per node. footprint_gib: one process's
            own footprint. memory_gib: the device's memory (the fixes offered must fit it too; None: not checked).
        spelling: as for :func:`check_row_fits`.

    Raises:
        ValueError: it does not fit; the message names what fixes it: less offload, activation offloading off (where
            the device still fits), else the longest row both allow.
    """
    device = kw.get("device", "cuda")
    budget = host_budget_bytes(host_memory_gib, gpus_per_node=gpus_per_node)

    def step(lev: MemoryLevers, off: str) -> tuple[Any, Any]:
        m = predict_step_memory(config, row_tokens, world=world, sp_size=sp_size, sharding=sharding, levers=lev,
                                offload=off, **kw)
        return m, host_memory(m, gpus_per_node=gpus_per_node, footprint_gib=footprint_gib, device=device)

    need, host = step(levers, offload)
    if host.per_process <= budget:
        return
    spell = spelling or {}
    less = [o for o in ("optimizer", "none") if OFFLOADS.index(o) < OFFLOADS.index(offload)
            and not (o == "optimizer" and sharding != "zero3")]  # FSDP2 offloads the parameters or nothing
    tries = [(levers, o, f"{spell.get('offload', 'offload')}={o!r}") for o in less]
    if levers.activation_offloading:
        off_name = spell.get("activation_offloading", "MemoryLevers(activation_offloading=True)")
        tries.append((levers.replace(activation_offloading=False), offload, f"turn off {off_name}"))
    advice = None
    for lev, off, what in tries:
        m, h = step(lev, off)
        if h.per_process <= budget and (memory_gib is None or m.total <= memory_gib * GIB):
            advice = what
            break
    if advice is None:
        best = longest_row(config, gpus=world, memory_per_gpu_gib=memory_gib if memory_gib is not None else 1e12,
                           levers=levers, sharding=sharding, sp_size=sp_size, reserve_gib=0.0, offload=offload,
                           host_memory_gib=host_memory_gib, gpus_per_node=gpus_per_node, footprint_gib=footprint_gib,
                           **kw)
        advice = (f"at most {best.tokens:,} tokens fit ({best.limiting_term} limits it): use a shorter --max_length, "
                  f"a node with more memory ({spell.get('host_memory_gib', 'host_memory_gib')}), fewer processes "
                  "per node, or more GPUs per row (--sp_size)")
    raise ValueError(f"a row of {row_tokens:,} tokens needs about {_gib(host.per_process)} of host memory per process "
                     f"({_gib(host.per_node)} for {gpus_per_node} processes per node; largest term: "
                     f"{host.limiting_term()}, {_gib(getattr(host, host.limiting_term()))}) but the node has "
                     f"{_gib(host_memory_gib * GIB)} less {HOST_RESERVE_FRACTION:.0%} for the OS: {advice}")


def max_length_lines(config: Any, *, gpus: int, memory_gib: float, levers: MemoryLevers, sharding: str,
                     sp_size: int | None = None, ulysses_size: int = 1, recv_budget_tokens: int | None = None,
                     compare: bool = True, offload: str = "none",
                     host_memory_gib: float | None = DEFAULT_HOST_MEMORY_GIB, gpus_per_node: int | None = None,
                     footprint_gib: float = DEFAULT_PROCESS_FOOTPRINT_GIB,
                     **kw: Any) -> list[str]:
    """``hsap-plan --max-length``'s answer: the longest row the device allows and the longest the host allows side by
    side, which binds, the memory by term at the answer (device and host), and (``compare``) the same for the other
    SAP set-ups worth knowing (Ulysses inside an 8-GPU node; a 64K-token receive budget) and the other offloads."""
    per_node = gpus_per_node or min(gpus, DEFAULT_GPUS_PER_NODE)
    host_kw = dict(host_memory_gib=host_memory_gib, gpus_per_node=per_node, footprint_gib=footprint_gib)

    def fit_of(U: int, budget: int | None, off: str = offload) -> Any:
        return longest_row(config, gpus=gpus, memory_per_gpu_gib=memory_gib, levers=levers, sharding=sharding,
                           sp_size=sp_size, ulysses_size=U, recv_budget_tokens=budget, offload=off, **host_kw, **kw)

    fit = fit_of(ulysses_size, recv_budget_tokens)
    sp = sp_size or gpus
    counts = [f"{n} {getattr(levers, n)}" for n, off in (("checkpoint_layers", 1), ("layers_kept_on_device", 0))
              if getattr(levers, n) != off]
    on = ", ".join(levers.names + counts) or "none"
    lines = [f"longest packed row: {fit.tokens:,} tokens on {gpus} GPUs of {memory_gib:g} GiB (SP {sp}, U "
             f"{ulysses_size}, receive budget {recv_budget_tokens or 'none'}, {sharding}, offload {offload}; levers: "
             f"{on})"]
    if fit.host_tokens is not None:
        host_allows = (f"{fit.host_tokens:,} tokens" if fit.host_tokens < kw.get("max_tokens", 1 << 40)
                       else "any length (nothing on the host grows with the row)")
        lines.append(f"device allows {fit.device_tokens:,} tokens; host allows {host_allows} "
                     f"({host_memory_gib:g} GiB per node less {HOST_RESERVE_FRACTION:.0%} for the OS, {per_node} "
                     f"processes per node, {footprint_gib:g} GiB each of their own): the {fit.binds} binds")
    lines += [f"per GPU at that length ({fit.tokens // sp:,} tokens per rank):", fit.memory.table()]
    if fit.host is not None:
        lines += ["host memory at that length:", fit.host.table()]
    lines.append(f"what stops a longer row: {fit.limiting_term}")
    heads = int(config.get("num_attention_heads", 0) if isinstance(config, dict)
                else getattr(config, "num_attention_heads", 0))
    others = [(U, b) for U, b in ((1, None), (1, 65536), (min(8, sp), None))
              if (U, b) != (ulysses_size, recv_budget_tokens) and sp % U == 0 and (heads % U == 0 or not heads)]
    if compare and others:
        lines.append("other set-ups: " + "; ".join(
            f"--U {U}" + (f" --budget {b}" if b else "") + f": {fit_of(U, b).tokens:,} tokens"
            for U, b in dict.fromkeys(others)))
    offloads = [o for o in OFFLOADS if o != offload and not (sharding == "fsdp2" and o == "optimizer")]
    if compare and sharding != "ddp":
        lines.append("other offloads: " + "; ".join(
            f"--offload {o}: {f.tokens:,} tokens ({f.binds} binds)" for o in offloads
            for f in (fit_of(ulysses_size, recv_budget_tokens, o),)))
    return lines
