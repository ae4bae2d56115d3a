"""Memory levers of a training step (the chunked LM loss, gradient checkpointing, activation offloading, the
sequence-tiled MLP, recomputed norms) and the model of a step's peak memory per GPU.

The levers are applied by :func:`hf_hsap.prepare_model` (``levers=MemoryLevers(...)``) before the model is wrapped;
the loss of a chunked head comes from :func:`hf_hsap.integrations.hsap_model_loss`.
"""
from .head import ChunkedLMHead, find_chunked_head, logit_transform, verify_chunked_head
from .levers import LEVER_ORDER, MemoryLevers
from .tiled_mlp import TiledForward, tiled_apply

__all__ = [
    "ChunkedLMHead",
    "LEVER_ORDER",
    "MemoryLevers",
    "TiledForward",
    "find_chunked_head",
    "logit_transform",
    "tiled_apply",
    "verify_chunked_head",
]
