"""A sequence-tiled MLP: the per-token feed-forward of every decoder layer runs over tiles of tokens, and its
backward recomputes one tile at a time, so the ``[T, intermediate]`` working set of an MLP (gate, up and their
product: about 3.5x the intermediate size per token, the largest per-token tensors of a layer once the loss is tiled)
never exists for more than one tile.

Why by hand: DeepSpeed's ``TiledMLP`` does this inside DeepSpeed (its gradient accumulation assumes ZeRO); Liger and
Transformers have none. Transformers offers no replacement point for MLPs (``LlamaMLP`` carries no
``use_kernel_forward_from_hub``), so :func:`enable_tiled_mlp` gives each MLP instance a forward of its own
(a :class:`TiledForward` instance attribute wrapping the class's forward, recorded in ``prepare_model``'s journal, whose
``undo()`` removes it): the class, the module tree and the state dict are unchanged. The parameter gradients of all tiles are summed inside the backward and handed to
autograd once, so DDP's and FSDP's per-parameter hooks fire once per step as without tiling.

Exact: a per-token function computed tile by tile gives the same values; the parameters' gradients are summed over
tiles in float32 (the rounding of a different summation order: ~1e-7 in float32 training).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ..log import get_logger
from ..model_state import ModelChanges

__all__ = ["TiledForward", "enable_tiled_mlp", "tiled_apply", "DEFAULT_TILE_TOKENS"]

logger = get_logger(__name__)

DEFAULT_TILE_TOKENS = 4096


class _TiledFunction(torch.autograd.Function):
    """``fn`` over row tiles of ``x``: forward without a graph, backward recomputing one tile at a time."""

    @staticmethod
    def forward(ctx: Any, fn: Callable[[torch.Tensor], torch.Tensor], tile: int, x: torch.Tensor,
                *params: torch.Tensor) -> torch.Tensor:
        ctx.fn, ctx.tile = fn, tile
        ctx.autocast = (x.device.type, torch.is_autocast_enabled(x.device.type),
                        torch.get_autocast_dtype(x.device.type))
        ctx.save_for_backward(x, *params)
        with torch.no_grad():
            return torch.cat([fn(part) for part in x.split(tile, dim=0)], dim=0)  # [N, H] in tiles of rows

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        x, *params = ctx.saved_tensors
        device, enabled, dtype = ctx.autocast
        wanted = [p for p, need in zip(params, ctx.needs_input_grad[3:]) if need]
        grad_x = torch.empty_like(x) if ctx.needs_input_grad[2] else None
        sums: list[torch.Tensor | None] = [None] * len(wanted)
        for start in range(0, x.shape[0], ctx.tile):
            part = x[start:start + ctx.tile].detach().requires_grad_(grad_x is not None)
            with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=enabled):
                out = ctx.fn(part)
            inputs = ([part] if grad_x is not None else []) + wanted
            grads = torch.autograd.grad(out, inputs, grad_out[start:start + ctx.tile], allow_unused=True)
            if grad_x is not None:
                grad_x[start:start + ctx.tile] = grads[0]
                grads = grads[1:]
            for i, g in enumerate(grads):  # summed over tiles in float32 (16-bit sums would round at every tile)
                if g is not None:
                    sums[i] = g.float() if sums[i] is None else sums[i].add_(g)
        it = iter(zip(sums, wanted))
        param_grads = []
        for need in ctx.needs_input_grad[3:]:
            g, p = next(it) if need else (None, None)
            param_grads.append(None if g is None else g.to(p.dtype))
        return (None, None, grad_x, *param_grads)


def tiled_apply(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, params: list[torch.Tensor],
                tile_tokens: int, always: bool = False) -> torch.Tensor:
    """``fn(x)`` for a per-token ``fn`` computed in tiles of ``tile_tokens`` tokens, recomputed in backward.

    Args:
        fn: maps ``[n, ..., H]`` to ``[n, ..., H_out]`` token by token (an MLP, a norm).
        x: ``[..., H]`` hidden states.
        params: every parameter ``fn`` uses (they get their gradients through this function).
        tile_tokens: tokens per tile.
        always: recompute in backward even when ``x`` fits one tile (a norm: only its input is kept).

    Returns:
        ``[..., H_out]``, equal to ``fn(x)``.
    """
    flat = x.reshape(-1, x.shape[-1])  # [..., H] -> [N, H]
    if flat.shape[0] <= tile_tokens and not always:
        return fn(x)
    out = _TiledFunction.apply(fn, int(tile_tokens), flat, *params)
    return out.reshape(*x.shape[:-1], out.shape[-1])  # [N, H_out] -> [..., H_out]


class TiledForward:
    """A module's own forward over tiles of tokens, recomputed in backward: the instance ``forward`` the tiled MLP and
    the recomputed norms give a module (the one tiled-recompute wrapper of hf_hsap).

    Args:
        module: the module (an MLP, an RMSNorm). tile_tokens: tokens per tile.
        keep_input_only: recompute in backward even when the tokens fit one tile, so that only the input is kept (a
            norm); then only while training with gradients (elsewhere the class's forward runs as it is).
    """

    def __init__(self, module: nn.Module, tile_tokens: int, *, keep_input_only: bool = False) -> None:
        self.module = module
        self.tile_tokens = int(tile_tokens)
        self.keep_input_only = keep_input_only

    def __call__(self, hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        forward = type(self.module).forward.__get__(self.module)
        if args or kwargs:  # not the per-token call this wraps
            return forward(hidden, *args, **kwargs)
        if self.keep_input_only and not (self.module.training and torch.is_grad_enabled()):
            return forward(hidden)
        # the parameters are read at every call: FSDP swaps sharded and unsharded ones around the forward
        return tiled_apply(forward, hidden, list(self.module.parameters()), self.tile_tokens,
                           always=self.keep_input_only)


def _is_dense_mlp(module: nn.Module) -> bool:
    """Only linear layers and parameter-free activations below it (no experts, norms, dropout or router)."""
    for sub in module.modules():
        if sub is module:
            continue
        if isinstance(sub, nn.Linear):
            continue
        if isinstance(sub, nn.Dropout) or any(True for _ in sub.parameters(recurse=False)):
            return False
    return any(isinstance(sub, nn.Linear) for sub in module.modules()) and not any(
        True for _ in module.parameters(recurse=False))


def enable_tiled_mlp(model: nn.Module, changes: ModelChanges, *, tile_tokens: int = DEFAULT_TILE_TOKENS) -> int:
    """Tile every dense decoder MLP (a submodule named ``mlp``) of ``model`` over ``tile_tokens`` tokens.

    Args:
        model: the model (before wrapping).
        changes: ``prepare_model``'s journal (its ``undo()`` gives the MLPs their class's forward back).
        tile_tokens: tokens per tile.

    Returns:
        The number of MLPs tiled. MoE blocks (experts, a router) and MLPs with dropout are left alone (logged).
    """
    if tile_tokens < 1:
        raise ValueError(f"tile_tokens must be positive, got {tile_tokens}")
    done, skipped = 0, set()
    for name, module in model.named_modules():
        if name.rpartition(".")[2] != "mlp":
            continue
        if not _is_dense_mlp(module):
            skipped.add(type(module).__name__)
            continue
        changes.set(module, "forward", TiledForward(module, tile_tokens))
        done += 1
    if skipped:
        logger.info("hf_hsap: tiled MLP leaves %s alone (not a dense MLP: experts, a router, dropout or norms)",
                    ", ".join(sorted(skipped)))
    logger.info("hf_hsap: %d MLPs of %s run in tiles of %d tokens", done, type(model).__name__, tile_tokens)
    return done
