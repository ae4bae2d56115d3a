"""Memory levers of a training step (the chunked LM loss, gradient checkpointing, activation offloading, the
sequence-tiled MLP, recomputed norms) and the model of a step's peak memory per GPU.

Applied with :func:`apply_memory_levers` before the model is wrapped; the loss of a chunked head comes from
:func:`hf_hsap.integrations.hsap_model_loss`.
"""
from .head import ChunkedLMHead, enable_chunked_loss, find_chunked_head, logit_transform, verify_chunked_head
from .levers import MemoryLevers, apply_memory_levers
from .norms import disable_norm_recompute, enable_norm_recompute
from .tiled_mlp import disable_tiled_mlp, enable_tiled_mlp, tiled_apply

__all__ = [
    "ChunkedLMHead",
    "MemoryLevers",
    "apply_memory_levers",
    "disable_norm_recompute",
    "disable_tiled_mlp",
    "enable_chunked_loss",
    "enable_norm_recompute",
    "enable_tiled_mlp",
    "find_chunked_head",
    "logit_transform",
    "tiled_apply",
    "verify_chunked_head",
]
