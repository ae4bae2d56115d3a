"""Registering ``"hsap"`` with Hugging Face Transformers (registry only, no patching).

``register()`` adds ``"hsap"`` to ``AttentionInterface`` (the attention function,
:func:`~.transformers.hsap_attention_forward`) and to ``AttentionMaskInterface`` (the mask function,
:func:`~.mask.hsap_mask_function`, which never builds a dense 4D mask). Afterwards
``from_pretrained(..., attn_implementation="hsap")`` and ``model.set_attn_implementation("hsap")`` work for
every model whose attention goes through ``ALL_ATTENTION_FUNCTIONS`` (Llama, Qwen2/3, Mistral, ...).
"""
from __future__ import annotations

from ..log import get_logger
from .mask import hsap_mask_function
from .transformers import hsap_attention_forward

__all__ = ["ATTN_NAME", "is_registered", "register"]

ATTN_NAME = "hsap"

logger = get_logger(__name__)


def register(name: str = ATTN_NAME) -> str:
    """Register the hsap attention and mask functions with Transformers (idempotent).

    Args:
        name: the ``attn_implementation`` name to register (default ``"hsap"``).

    Returns:
        ``name``, to pass as ``attn_implementation``.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    new = not is_registered(name)
    AttentionInterface.register(name, hsap_attention_forward)
    AttentionMaskInterface.register(name, hsap_mask_function)
    if new:
        logger.debug("registered attn_implementation=%r with Transformers' attention and mask interfaces", name)
    return name


def is_registered(name: str = ATTN_NAME) -> bool:
    """Whether both registries map ``name`` to the hsap functions.

    Args:
        name: the ``attn_implementation`` name.

    Returns:
        True when ``AttentionInterface`` and ``AttentionMaskInterface`` both hold the hsap functions under it.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    return (
        AttentionInterface._global_mapping.get(name) is hsap_attention_forward
        and AttentionMaskInterface._global_mapping.get(name) is hsap_mask_function
    )
