"""How :mod:`.ops` and :mod:`.scans` read a kernel call and run it over a batch's segments (shared helpers)."""
from __future__ import annotations

from typing import Any

import torch

from ..plan.chain import Chain
from .handoff import SegmentOp, StateExchange, Summary, run_segments, run_with_final

__all__ = ["LAYOUT_KWARGS", "MODEL_KWARGS", "bind", "refuse_cache", "run_call", "state_dtype"]

# Keyword arguments that describe the packed layout to a kernel (hf_hsap gives each run its own call instead), and the
# model's own inputs that a layer forwards with its ``**kwargs`` and no kernel reads: a call drops both.
LAYOUT_KWARGS = ("cu_seqlens", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
MODEL_KWARGS = ("labels", "shift_labels", "position_ids", "attention_mask", "cache_position", "input_ids",
                "inputs_embeds", "token_type_ids", "logits_to_keep", "num_items_in_batch", "past_key_values",
                "position_embeddings", "output_attentions", "output_hidden_states", "use_cache", "return_dict")


def bind(names: tuple[str, ...], args: tuple, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(named, rest)``: the leading positional ``args`` and keywords of ``names``, and the other keywords
    (layout keywords and the model's own inputs dropped)."""
    named = dict(zip(names, args))
    rest = {}
    for k, v in kwargs.items():
        if k in names:
            named[k] = v
        elif k not in LAYOUT_KWARGS and k not in MODEL_KWARGS and not k.startswith("hsap_"):
            rest[k] = v
    return named, rest


def state_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype summaries, folds and corrections use: the kernels keep their states in float32 at least."""
    return torch.promote_types(dtype, torch.float32)


def refuse_cache(what: str) -> None:
    """Raise: a kernel call continued from a cached state (generation), which packed rows and SP cannot serve."""
    raise ValueError(f"hf_hsap: {what} on packed rows / under SP: a cached state continues one document, not a "
                     "packed row; generate with one document per row (no packing)")


def run_call(tensors: list[tuple[torch.Tensor | None, int | None]], rec: Any, *, out_dim: int, chain: Chain,
         exchange: StateExchange | None, rows: int, length: int, final: bool = False) -> Any:
    """:func:`run_segments` over the non-``None`` tensors (``(tensor, token dim)`` pairs) with the recurrence
    ``rec``, whose methods get them back in the same places (``None`` kept). ``final``: also the final state of every
    row's last document (:func:`run_with_final`): ``(out, states)``."""
    present = [i for i, (t, _) in enumerate(tensors) if t is not None]
    op = SegmentOp([tensors[i][0] for i in present], [tensors[i][1] for i in present],  # type: ignore[misc]
                   _Placed(rec, present, len(tensors)), out_dim, rows, length)
    return run_with_final(op, chain) if final else run_segments(op, chain, exchange)


class _Placed:
    """A recurrence whose methods take every call tensor in its place (``None`` where the call had none), seen
    through :class:`~.handoff.Recurrence`'s methods, which get the present tensors only."""

    def __init__(self, rec: Any, present: list[int], n: int) -> None:
        self.rec, self.present, self.n = rec, present, n
        self.state_shape, self.transition_shape, self.state_dtype = (rec.state_shape, rec.transition_shape,
                                                                     rec.state_dtype)

    def _full(self, parts: list[torch.Tensor]) -> list[torch.Tensor | None]:
        full: list[torch.Tensor | None] = [None] * self.n
        for i, p in zip(self.present, parts):
            full[i] = p
        return full

    def run(self, parts: list[torch.Tensor], init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rec.run(self._full(parts), init)

    def summarize(self, parts: list[torch.Tensor]) -> Summary:
        return self.rec.summarize(self._full(parts))

    def correct(self, summary: Summary, init: torch.Tensor) -> torch.Tensor:
        return self.rec.correct(summary, init)

    def transit(self, transition: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.rec.transit(transition, state)
