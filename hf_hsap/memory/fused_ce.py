"""Linear + cross-entropy fused over token tiles, with the gradients computed in the forward.

Why by hand: the loss is the last operation of a step, so its gradient is known up to the scalar that comes back
(``grad_output``) as soon as its forward runs. Computing it there, one tile of tokens at a time over the whole
vocabulary, costs three matmuls per tile (the logits, the hidden states' and the head's gradients) and no
recompute; TRL's ``ChunkedLogProbFunction`` recomputes every tile in backward (four), DeepSpeed's
``TiledFusedLogitsLoss`` adds the head's gradient to ``.grad`` inside the forward (which DDP's and FSDP's hooks do
not expect), and Liger's fused linear cross-entropy is Triton only. Here the gradients are kept and handed to
autograd in the backward, scaled by ``grad_output``, so every wrapper sees one gradient per parameter.

Memory: one ``[tile, V]`` logits tile in the compute dtype (the softmax and its gradient are formed in place), the
``[T, H]`` gradient of the hidden states in their dtype and a ``[V, H]`` gradient of the head accumulated in float32
(the head's ``.grad`` holds as much from the backward on anyway). The compute dtype is float32, or float64 for
float64 inputs: a float64 model's loss is exact to float64 rounding.

The logits may be transformed as the family does: ``softcap * tanh(scale * z / softcap)`` (or ``scale * z``).

Token metrics (what TRL's SFT trainer logs: the mean entropy of the predicted distribution and the share of targets
that are its top-1) come from the same tiles when asked for (:class:`TokenMetrics`): sums over the valid tokens,
no gradient, one more ``[tile, V]`` temporary while a tile's entropy is formed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..data.packing import IGNORE_INDEX

__all__ = ["TokenMetrics", "fused_linear_cross_entropy", "tile_tokens_for"]


def tile_tokens_for(vocab: int, tile_elements: int) -> int:
    """Tokens per tile so that a ``[tile, vocab]`` tile holds about ``tile_elements`` logits (at least 1)."""
    return max(1, tile_elements // max(1, vocab))


@dataclass
class TokenMetrics:
    """Sums over the valid tokens of one fused loss, filled by :func:`fused_linear_cross_entropy` (no gradient).

    Attributes:
        entropy: sum of the entropy of each token's predicted distribution (the transformed logits' softmax).
        correct: tokens whose target is the logits' argmax.
        valid: tokens with a target.
    """

    entropy: torch.Tensor = field(default_factory=lambda: torch.zeros(()))
    correct: torch.Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.long))
    valid: torch.Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.long))


@dataclass(frozen=True)
class _Tiling:
    """How :class:`_FusedLinearCE` runs (one object: autograd takes no keywords).

    Attributes:
        tile: tokens per tile. softcap, scale: the logit transform. grads: the caller's grad mode (the gradients
        are computed in the forward only then). metrics: where to add the token metrics (``None``: not asked).
    """

    tile: int
    softcap: float | None
    scale: float
    grads: bool
    metrics: TokenMetrics | None = None


class _FusedLinearCE(torch.autograd.Function):
    """``sum over valid tokens of CE(transform(hidden @ weight.T + bias), labels)``; see the module docstring."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                labels: torch.Tensor, how: _Tiling) -> torch.Tensor:
        tile, softcap, scale = how.tile, how.softcap, how.scale
        grads = how.grads and any(ctx.needs_input_grad[:3])  # the caller's grad mode (a Function's forward runs without)
        compute = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        mm = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) \
            else hidden.dtype  # the matmuls' dtype, as the model's own head would run under autocast
        w = weight.to(mm)
        b = None if bias is None else bias.to(compute)
        total = torch.zeros((), dtype=compute, device=hidden.device)
        metrics = how.metrics
        if metrics is not None:
            entropy = torch.zeros((), dtype=compute, device=hidden.device)
            correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        need_h, need_w, need_b = (grads and n for n in ctx.needs_input_grad[:3])
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32 if compute == torch.float32 else compute,
                             device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=compute, device=bias.device) if need_b else None
        for start in range(0, hidden.shape[0], tile):
            h = hidden[start:start + tile].to(mm)  # [n, H]
            y = labels[start:start + tile]  # [n]
            valid = y != IGNORE_INDEX
            z = (h @ w.t()).to(compute)  # [n, V] the tile's logits before the transform
            if b is not None:
                z += b
            z *= scale
            if softcap is not None:
                z.div_(softcap).tanh_()  # z is now t = tanh(scale * z0 / softcap)
                t = z.clone() if grads else None
                z.mul_(softcap)
            lse = torch.logsumexp(z, dim=-1)  # [n]
            safe = y.clamp(min=0).unsqueeze(1)  # [n, 1]
            picked = z.gather(1, safe).squeeze(1)
            total += ((lse - picked) * valid).sum()
            if metrics is not None:  # the softmax's entropy, lse - sum(p * z), and whether the target is the argmax
                entropy += ((lse - torch.softmax(z, dim=-1).mul_(z).sum(-1)) * valid).sum()  # one [n, V] temporary
                correct += ((z.argmax(-1) == y) & valid).sum()
            if not grads:
                continue
            z.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place
            z.scatter_add_(1, safe, torch.full_like(picked, -1.0).unsqueeze(1))  # - one-hot of the target
            z *= valid.unsqueeze(1)
            if softcap is not None:
                z *= 1.0 - t * t  # d(softcap * tanh(u / softcap)) / du
            z *= scale  # dCE / d(hidden @ weight.T + bias), [n, V]
            if grad_h is not None:
                grad_h[start:start + tile] = (z.to(mm) @ w).to(grad_h.dtype)
            if grad_w is not None:
                grad_w.addmm_(z.t().to(grad_w.dtype), h.to(grad_w.dtype))
            if grad_b is not None:
                grad_b += z.sum(0)
        if metrics is not None:
            metrics.entropy = metrics.entropy.to(entropy) + entropy
            metrics.correct = metrics.correct.to(correct.device) + correct
            metrics.valid = metrics.valid.to(correct.device) + (labels != IGNORE_INDEX).sum()
        ctx.save_for_backward(*(g if g is not None else torch.empty(0) for g in (grad_h, grad_w, grad_b)))
        ctx.present = (grad_h is not None, grad_w is not None, grad_b is not None)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total.to(torch.float64 if compute == torch.float64 else torch.float32)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        if getattr(ctx, "spent", False):  # the gradients were scaled in place: a second backward would be wrong
            raise RuntimeError("the fused linear cross-entropy supports one backward per forward (no retain_graph)")
        ctx.spent = True
        out = []
        for g, present, dtype in zip(ctx.saved_tensors, ctx.present, ctx.dtypes):
            out.append(g.mul_(grad_out.to(g.dtype)).to(dtype) if present else None)  # in place: no [T, H] copy
        return (*out, None, None)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                               labels: torch.Tensor, tile_tokens: int, *, softcap: float | None = None,
                               scale: float = 1.0, metrics: TokenMetrics | None = None) -> torch.Tensor:
    """Summed cross-entropy of the head's logits without materialising them (module docstring).

    Args:
        hidden: ``[N, H]`` hidden states. weight: ``[V, H]`` the head. bias: ``[V]`` or None.
        labels: ``[N]`` targets (``-100``: none). tile_tokens: tokens per tile.
        softcap, scale: the family's logit transform.
        metrics: add this call's token metrics to it (``None``: none computed).

    Returns:
        0-dim sum of CE over the valid tokens (float32; float64 for float64 inputs).
    """
    return _FusedLinearCE.apply(hidden, weight, bias, labels,
                                _Tiling(int(tile_tokens), softcap, float(scale), torch.is_grad_enabled(), metrics))
