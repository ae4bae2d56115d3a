"""Which layers of a model are recurrent token mixers hf_hsap makes document-exact (a pure reading of the modules)."""
from __future__ import annotations

import torch

from .ops import LAYER_OPS, OPS
from .ple import METHOD_OPS

__all__ = ["mixer_layers"]


def mixer_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers :func:`hf_hsap.prepare_model` makes document-exact: those holding a private wrapper of a kernel in
    :data:`~.ops.OPS` (Transformers' kernel hooks), and those of a class in :data:`~.ops.LAYER_OPS` or
    :data:`~.ple.METHOD_OPS`.

    Args:
        model: a Transformers model.

    Returns:
        The layers, in module order.
    """
    return [m for m in model.modules() if type(m).__name__ in LAYER_OPS or type(m).__name__ in METHOD_OPS
            or any(name in OPS for name in (m.__dict__.get("_kernel_funcs") or {}))]
