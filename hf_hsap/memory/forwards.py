"""Per-instance forwards: how the tiled MLP and the recomputed norms give one module a forward of its own (an
instance attribute wrapping the class's forward), and how they are taken away again. The class, the module tree and
the state dict stay as they are."""
from __future__ import annotations

from torch import nn

__all__ = ["has_forward", "remove_forwards"]


def has_forward(module: nn.Module, kind: type) -> bool:
    """``module`` has an instance forward of type ``kind``."""
    return isinstance(module.__dict__.get("forward"), kind)


def remove_forwards(model: nn.Module, kind: type) -> int:
    """Remove every instance forward of type ``kind`` below ``model``; returns how many."""
    n = 0
    for module in model.modules():
        if has_forward(module, kind):
            del module.forward
            n += 1
    return n
