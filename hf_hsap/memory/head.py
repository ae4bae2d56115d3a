"""A causal-LM loss that never materialises the ``[T, V]`` logits: the LM head and the cross-entropy run in tiles of
tokens (:mod:`.fused_ce`: the gradients are formed in the forward, one tile at a time, and handed to autograd in the
backward).

:class:`ChunkedLMHead` takes the place of the model's output embedding (same parameters, same state dict, tied
embeddings stay tied) and, while a loss is requested (:meth:`ChunkedLMHead.loss_for`), computes the loss inside
its own forward and returns an empty ``[B, T, 0]`` tensor computed from the loss as the logits. Without a request it
is the plain linear head (generation, evaluation with logits). Computing inside the head's own forward keeps every
wrapper's hooks in place (DDP's forward, FSDP2's unsharded parameters, ZeRO-3's gather) without replacing the
model's ``forward``.

The logits' transform of the family (Gemma's ``final_logit_softcapping``, Cohere's ``logit_scale``, Granite's
``logits_scaling``, ...) is read from the config and checked once against the model's own logits
(:func:`verify_chunked_head`): a family whose head does something else is refused, never trained wrong.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..data.packing import IGNORE_INDEX
from ..model_shape import text_config
from ..log import get_logger
from ..model_state import ModelChanges
from .fused_ce import TokenMetrics, fused_linear_cross_entropy, tile_tokens_for

__all__ = ["ChunkedLMHead", "LossRequest", "enable_chunked_loss", "find_chunked_head", "logit_transform",
           "verify_chunked_head", "loss_tile_tokens", "DEFAULT_TILE_ELEMENTS"]

logger = get_logger(__name__)

DEFAULT_TILE_ELEMENTS = 1 << 24  # logits of one tile: 64 MiB in float32 (128 tokens of Llama-3's 128,256 vocabulary)


def loss_tile_tokens(vocab: int, tile_tokens: int | None = None) -> int:
    """Tokens per tile of the chunked loss: ``tile_tokens``, else a ``[tile, vocab]`` tile of about
    ``DEFAULT_TILE_ELEMENTS`` logits."""
    return int(tile_tokens or tile_tokens_for(vocab, DEFAULT_TILE_ELEMENTS))


def logit_transform(config: Any) -> tuple[float | None, float]:
    """``(softcap, scale)`` of a family's logits: ``softcap * tanh(scale * z / softcap)`` (no cap: ``scale * z``).

    Args:
        config: the model config (its text config is read for multimodal ones).

    Returns:
        ``final_logit_softcapping`` (or None) and the multiplier before it (``logit_scale``, ``output_multiplier``,
        ``lm_head_multiplier``, ``1 / logits_scaling``; 1.0 when none is set).
    """
    text = text_config(config)
    softcap = getattr(text, "final_logit_softcapping", None)
    scale = None
    for name in ("logit_scale", "output_multiplier", "lm_head_multiplier"):
        scale = getattr(text, name, None)
        if scale is not None:
            break
    if scale is None and getattr(text, "logits_scaling", None) is not None:
        scale = text.logits_scaling if getattr(text, "model_type", "") == "hyperclovax" else 1.0 / text.logits_scaling
    return (float(softcap) if softcap else None), (1.0 if scale is None else float(scale))


@dataclass
class LossRequest:
    """One forward's loss request to a :class:`ChunkedLMHead` (see :meth:`ChunkedLMHead.loss_for`).

    Attributes:
        shift_labels: ``[B, T]`` next-token targets of the rows the head sees (``-100`` = none).
        num_items: the divisor ``N`` (global valid targets; values < 1 count as 1).
        grad_scale: multiplies the loss (``W`` under a DP wrapper averaging over ``W`` ranks).
        metrics: the token metrics to fill (entropy, top-1 accuracy; ``None``: not asked for).
        loss: filled by the head's forward: ``grad_scale * sum(CE) / N``, 0-dim float32.
    """

    shift_labels: torch.Tensor
    num_items: torch.Tensor | int
    grad_scale: float = 1.0
    metrics: TokenMetrics | None = None
    loss: torch.Tensor | None = None


class ChunkedLMHead(nn.Linear):
    """The output embedding with a tiled loss (module docstring). Shares ``weight`` / ``bias`` with the head it
    replaces, so tied embeddings stay tied and checkpoints keep their keys.

    Args:
        head: the model's ``nn.Linear`` output embedding.
        softcap: the family's logit soft-cap (:func:`logit_transform`).
        scale: the family's logit scale (:func:`logit_transform`).
        tile_tokens: tokens per tile (default: a ``[tile, V]`` tile of about ``DEFAULT_TILE_ELEMENTS`` logits).
    """

    def __init__(self, head: nn.Linear, softcap: float | None, scale: float, tile_tokens: int | None = None):
        nn.Module.__init__(self)  # not nn.Linear's: the parameters are the head's own
        self.in_features, self.out_features = head.in_features, head.out_features
        self.weight = head.weight
        self.bias = head.bias
        self.softcap, self.scale = softcap, scale
        self.tile_tokens = loss_tile_tokens(head.out_features, tile_tokens)
        self._request: LossRequest | None = None

    @contextmanager
    def loss_for(self, shift_labels: torch.Tensor, num_items: torch.Tensor | int, grad_scale: float = 1.0, *,
                 metrics: TokenMetrics | None = None) -> Iterator[LossRequest]:
        """Within the block, the next forward through this head computes the loss instead of the logits.

        Args:
            shift_labels: ``[B, T]`` targets, one per position the head sees.
            num_items: ``N``, the loss's divisor. grad_scale: the loss's factor.
            metrics: token metrics to fill from the same tiles (entropy, top-1 accuracy), or ``None``.

        Yields:
            The :class:`LossRequest`, whose ``loss`` is set once the model's forward has run.

        Raises:
            RuntimeError: (on exit) the forward did not reach the head.
        """
        request = LossRequest(shift_labels, num_items, grad_scale, metrics)
        self._request = request
        try:
            yield request
        finally:
            self._request = None
        if request.loss is None:
            raise RuntimeError("the model's forward did not reach its output embedding (the chunked LM head)")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[..., V]`` without a request; with one, the loss into the request and ``[..., 0]`` as logits.

        Shapes:
            hidden: ``[B, T, H]``; the request's ``shift_labels``: ``[B, T]``.
        """
        request, self._request = self._request, None  # one forward consumes the request
        if request is None:
            return F.linear(hidden, self.weight, self.bias)
        flat = hidden.reshape(-1, hidden.shape[-1])  # [B, T, H] -> [B*T, H]
        labels = request.shift_labels.reshape(-1).to(flat.device)  # [B*T]
        if labels.numel() != flat.shape[0]:
            raise ValueError(f"shift_labels hold {labels.numel()} targets for {flat.shape[0]} hidden states")
        valid = labels != IGNORE_INDEX
        nll = fused_linear_cross_entropy(flat, self.weight, self.bias, labels, self.tile_tokens,
                                         softcap=self.softcap, scale=self.scale, metrics=request.metrics)
        n = torch.as_tensor(request.num_items, device=nll.device).clamp_min(1)
        request.loss = nll * request.grad_scale / n
        # The empty logits hang off the loss: a wrapper that finds the used parameters by walking the graph from
        # the forward's outputs (DDP's find_unused_parameters, Trainer's default without checkpointing) finds them,
        # and hsap_model_loss's backward runs through the hooks wrappers put on them. A copy, not a view (empty: free):
        # FSDP2's hooks on a view would be lost to an in-place op
        return request.loss.reshape(1, 1, 1).expand(*hidden.shape[:-1], 0).clone()  # [B, T, 0]


def find_chunked_head(model: nn.Module) -> ChunkedLMHead | None:
    """The :class:`ChunkedLMHead` inside ``model`` (through DDP / FSDP / Accelerate wrappers), or None."""
    for module in model.modules():
        if isinstance(module, ChunkedLMHead):
            return module
    return None


def enable_chunked_loss(model: nn.Module, changes: ModelChanges, *, tile_tokens: int | None = None,
                        verify: bool = True) -> ChunkedLMHead:
    """Put a :class:`ChunkedLMHead` in place of ``model``'s output embedding (before wrapping).

    Args:
        model: a causal LM (``get_output_embeddings()`` an ``nn.Linear``).
        changes: ``prepare_model``'s journal (its ``undo()`` puts the model's own head back).
        tile_tokens: tokens per tile (default: about ``DEFAULT_TILE_ELEMENTS`` logits per tile).
        verify: check the head against the model's own logits on a short probe (:func:`verify_chunked_head`).

    Returns:
        The head (already there, its tile updated, when enabled before).

    Raises:
        ValueError: the model has no linear output embedding, or its logits are not what the head computes.
    """
    existing = find_chunked_head(model)
    if existing is not None:
        if tile_tokens:
            changes.set(existing, "tile_tokens", int(tile_tokens))
        return existing
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear:
        raise ValueError(f"{type(model).__name__}'s output embedding is {type(head).__name__}, not nn.Linear: the "
                         "chunked loss cannot replace it; train with the full logits (chunked_loss=False / "
                         "--no_chunked_loss)")
    softcap, scale = logit_transform(model.config)
    new = ChunkedLMHead(head, softcap, scale, tile_tokens)
    parent_name, _, attr = next(n for n, m in model.named_modules() if m is head).rpartition(".")
    changes.set(model.get_submodule(parent_name) if parent_name else model, attr, new)
    logger.info("hf_hsap: %s's LM head computes the loss in tiles of %d tokens (softcap %s, scale %s)",
                type(model).__name__, new.tile_tokens, softcap, scale)
    if verify:
        verify_chunked_head(model, new)
    return new


def _transform(z: torch.Tensor, softcap: float | None, scale: float) -> torch.Tensor:
    """The family's logits from the head's product (:func:`logit_transform`)."""
    z = z * scale
    return z if softcap is None else softcap * torch.tanh(z / softcap)


@torch.no_grad()
def verify_chunked_head(model: nn.Module, head: ChunkedLMHead, tokens: int = 6) -> None:
    """Check, on a short random row (single process, no plan: ``"hsap"`` runs packed attention locally), that the
    model's own logits are the head's transform of its product, and that the head's loss is their cross-entropy.

    For the probe the head's weight is scaled so that the logits are of order 10 (a soft-cap or a scale the
    head does not know changes them by far more than rounding), then restored bit for bit. Skipped when the
    weights are partitioned (ZeRO-3) or on the meta device.

    Raises:
        ValueError: they differ (the family transforms its logits in a way the head does not know).
    """
    if head.weight.numel() == 0 or head.weight.device.type == "meta":
        return
    device, vocab = head.weight.device, head.out_features
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, tokens), generator=gen).to(device)
    labels = torch.randint(0, vocab, (1, tokens), generator=gen).to(device)
    positions = torch.arange(tokens, device=device).unsqueeze(0)
    saved, was_training = head.weight.detach().clone(), model.training
    seen: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].detach()))
    model.eval()
    try:
        model(input_ids=ids, position_ids=positions, use_cache=False)
        product = F.linear(seen[0].float(), head.weight.float())  # [1, n, V] before any transform
        head.weight.mul_(10.0 / float(product.std().clamp_min(1e-6)))
        seen.clear()
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits.double()  # [1, n, V]
        mine = _transform(F.linear(seen[0].double(), head.weight.double(),
                                   None if head.bias is None else head.bias.double()), head.softcap, head.scale)
        with head.loss_for(labels, 1) as request:
            model(input_ids=ids, position_ids=positions, use_cache=False)
    finally:
        hook.remove()
        head.weight.copy_(saved)
        model.train(was_training)
    want = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), reduction="sum")
    rtol = 1e-4 if head.weight.dtype in (torch.float32, torch.float64) else 3e-2  # half precision: its rounding
    off_logits = float((mine - logits).abs().max() / logits.abs().max().clamp_min(1e-12))
    off_loss = abs(float(request.loss) - float(want)) / max(1.0, abs(float(want)))
    if off_logits > rtol or off_loss > rtol:
        raise ValueError(f"{type(model).__name__}: its logits are not what the chunked LM head computes (relative "
                         f"difference {off_logits:.2g} in the logits, {off_loss:.2g} in the loss): its head transforms "
                         "the logits in a way hf_hsap does not know; train with the full logits (chunked_loss=False "
                         "/ --no_chunked_loss)")
