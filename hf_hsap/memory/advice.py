"""Does a row fit, and if not, which lever makes it fit: the check the recipes run before their first step, and the
lines ``hsap-plan --max-length`` prints (pure: the device's memory is an argument).
"""
from __future__ import annotations

from typing import Any

from ..model_shape import MODEL_SHAPES, ModelShape
from .fit import longest_row
from .levers import LEVER_ORDER, MemoryLevers
from .model import predict_step_memory

__all__ = ["LEVER_ORDER", "check_row_fits", "levers_from_names", "max_length_lines", "MEMORY_MODELS"]

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


def check_row_fits(config: Any, row_tokens: int, *, memory_gib: float, world: int, sp_size: int,
                   levers: MemoryLevers, sharding: str = "ddp", spelling: dict[str, str] | None = None,
                   **kw: Any) -> None:
    """Refuse, before the first step, a row whose modelled step does not fit ``memory_gib`` per device.

    Args:
        config: the model's config. row_tokens: tokens of one packed row. memory_gib: one device's memory.
        world, sp_size, levers, sharding, **kw: as for :func:`~.model.predict_step_memory`.
        spelling: how the caller's users turn each lever on (e.g. ``{"gradient_checkpointing":
            "--gradient_checkpointing"}``); default ``MemoryLevers(name=True)``.

    Raises:
        ValueError: it does not fit; the message names the levers that would make it fit (each added in
            :data:`LEVER_ORDER`), else the longest row that fits with every lever.
    """
    need = predict_step_memory(config, row_tokens, world=world, sp_size=sp_size, sharding=sharding, levers=levers,
                               **kw)
    if need.total <= memory_gib * GIB:
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


def max_length_lines(config: Any, *, gpus: int, memory_gib: float, levers: MemoryLevers, sharding: str,
                     sp_size: int | None = None, ulysses_size: int = 1, recv_budget_tokens: int | None = None,
                     compare: bool = True, **kw: Any) -> list[str]:
    """``hsap-plan --max-length``'s answer: the longest row, its memory by term, what limits it and (``compare``)
    the same for the other SAP set-ups worth knowing (Ulysses inside an 8-GPU node; a 64K-token receive budget)."""
    def fit_of(U: int, budget: int | None) -> Any:
        return longest_row(config, gpus=gpus, memory_per_gpu_gib=memory_gib, levers=levers, sharding=sharding,
                           sp_size=sp_size, ulysses_size=U, recv_budget_tokens=budget, **kw)

    fit = fit_of(ulysses_size, recv_budget_tokens)
    sp = sp_size or gpus
    counts = [f"{n} {getattr(levers, n)}" for n, off in (("checkpoint_layers", 1), ("layers_kept_on_device", 0))
              if getattr(levers, n) != off]
    on = ", ".join(levers.names + counts) or "none"
    lines = [f"longest packed row: {fit.tokens:,} tokens on {gpus} GPUs of {memory_gib:g} GiB (SP {sp}, U "
             f"{ulysses_size}, receive budget {recv_budget_tokens or 'none'}, {sharding}; levers: {on})",
             f"per GPU at that length ({fit.tokens // sp:,} tokens per rank):", fit.memory.table(),
             f"what stops a longer row: {fit.limiting_term}"]
    heads = int(config.get("num_attention_heads", 0) if isinstance(config, dict)
                else getattr(config, "num_attention_heads", 0))
    others = [(U, b) for U, b in ((1, None), (1, 65536), (min(8, sp), None))
              if (U, b) != (ulysses_size, recv_budget_tokens) and sp % U == 0 and (heads % U == 0 or not heads)]
    if compare and others:
        lines.append("other set-ups: " + "; ".join(
            f"--U {U}" + (f" --budget {b}" if b else "") + f": {fit_of(U, b).tokens:,} tokens"
            for U, b in dict.fromkeys(others)))
    return lines
