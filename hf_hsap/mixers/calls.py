"""How :mod:`.ops` and :mod:`.scans` read a kernel call and run it over a batch's segments (shared helpers)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..plan.chain import Chain
from .handoff import SegmentOp, StateExchange, Summary, run_segments, run_with_final

__all__ = ["LAYOUT_KWARGS", "MODEL_KWARGS", "PAD_WASTE", "batched_runs", "bind", "buckets", "pad_stack", "refuse_cache", "run_call", "state_dtype"]

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


# A call over several runs pads them to its longest: runs join one call while the padded tokens stay within this share
# of the real ones (runs of very different lengths take separate calls rather than pad a short one to a long one).
PAD_WASTE = 0.25


def buckets(lengths: list[int], waste: float = PAD_WASTE) -> list[list[int]]:
    """Runs grouped into kernel calls: indices of ``lengths``, longest first, a run joining the current call while
    ``calls x longest <= (1 + waste) x tokens``.

    Args:
        lengths: every run's tokens. waste: the padded share allowed.

    Returns:
        The calls, each a list of run indices (every run once).
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    total = 0
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= (1 + waste) * (total + lengths[i]):
            out[-1].append(i)
            total += lengths[i]
        else:
            out.append([i])
            total = lengths[i]
    return out


def pad_stack(ts: list[torch.Tensor], dim: int, n: int, *, left: bool) -> torch.Tensor:
    """One-row tensors padded with zeros to ``n`` along ``dim`` (before their tokens when ``left``), stacked along
    dim 0 (``[1, ..., n_i, ...]`` each -> ``[len(ts), ..., n, ...]``)."""
    padded = []
    for t in ts:
        gap = n - t.shape[dim]
        if gap:
            zeros = t.new_zeros((*t.shape[:dim], gap, *t.shape[dim + 1:]))
            t = torch.cat([zeros, t] if left else [t, zeros], dim=dim)
        padded.append(t)
    return torch.cat(padded, dim=0)


def batched_runs(parts: list[list[Any]], dims: tuple[int | None, ...], *, left: bool,
                 call: Callable[[list[Any]], Any], split: Callable[[Any, int, int, int], Any]) -> list[Any]:
    """Several runs of one kernel in as few calls as :func:`buckets` allows.

    Args:
        parts: every run's call tensors (``None`` kept), in the kernel's places. dims: each place's token dimension
            (``None``: the same tensor in every run, e.g. a weight; the first run's is used).
        left: pad before the tokens (a scan whose state stays zero over zero inputs) or after them (a kernel whose
            state the zero inputs leave unchanged, or whose state is read from the run's own tokens).
        call: ``call(stacked places) -> result`` of one kernel call over a bucket's padded rows.
        split: ``split(result, row, tokens, padded length) -> the run's result``.

    Returns:
        Every run's result, in ``parts``' order.
    """
    token = next(j for j, d in enumerate(dims) if d is not None and parts[0][j] is not None)
    lengths = [p[token].shape[dims[token]] for p in parts]
    out: list[Any] = [None] * len(parts)
    for idx in buckets(lengths):
        n = max(lengths[i] for i in idx)
        stacked = [pad_stack([parts[i][j] for i in idx], d, n, left=left)
                   if d is not None and parts[idx[0]][j] is not None else parts[idx[0]][j]
                   for j, d in enumerate(dims)]
        res = call(stacked)
        for row, i in enumerate(idx):
            out[i] = split(res, row, lengths[i], n)
    return out


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
        self.rerun = bool(getattr(rec, "rerun", False))  # the handoff reads it: a continued run's output rerun

    def _full(self, parts: list[torch.Tensor]) -> list[torch.Tensor | None]:
        full: list[torch.Tensor | None] = [None] * self.n
        for i, p in zip(self.present, parts):
            full[i] = p
        return full

    def run(self, parts: list[torch.Tensor], init: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rec.run(self._full(parts), init)

    def run_many(self, parts: list[list[torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        many = getattr(self.rec, "run_many", None)
        full = [self._full(p) for p in parts]
        return many(full) if many is not None else [self.rec.run(f, None) for f in full]

    def summarize_many(self, parts: list[list[torch.Tensor]], ends: list[bool] | None = None) -> list[Summary]:
        many = getattr(self.rec, "summarize_many", None)
        full = [self._full(p) for p in parts]
        if many is None:
            return [self.rec.summarize(f) for f in full]
        return many(full) if ends is None else many(full, ends=ends)  # handoff.summaries gives ends to rerun ones

    def summarize(self, parts: list[torch.Tensor]) -> Summary:
        return self.rec.summarize(self._full(parts))

    def correct(self, summary: Summary, init: torch.Tensor) -> torch.Tensor:
        return self.rec.correct(summary, init)

    def transit(self, transition: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.rec.transit(transition, state)
