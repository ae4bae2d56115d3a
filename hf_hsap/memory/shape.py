"""The sizes of a decoder-only LM that its training step's memory depends on, read from a Transformers config (or a
dict of its fields): what :mod:`.model` prices (pure)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..config import text_config

__all__ = ["ModelShape", "model_shape"]

QK_NORM_TYPES = ("qwen3", "qwen3_moe")  # families with per-head q / k RMSNorms


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only LM that its memory depends on.

    Args:
        hidden, intermediate, layers, q_heads, kv_heads, head_dim, vocab: the config's sizes.
        tied: input and output embeddings share one matrix.
        experts, top_k, moe_intermediate: MoE layers (``experts == 0``: dense).
        shared_intermediate: a shared expert's intermediate size (0: none).
        qk_norm: per-head RMSNorms of queries and keys (Qwen3).
    """

    hidden: int
    intermediate: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    shared_intermediate: int = 0
    qk_norm: bool = False

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (projections, norms, MLP or experts and router)."""
        H, D = self.hidden, self.head_dim
        attn = H * D * (2 * self.q_heads + 2 * self.kv_heads)
        if self.experts:
            mlp = self.experts * 3 * H * self.moe_intermediate + self.experts * H + 3 * H * self.shared_intermediate
        else:
            mlp = 3 * H * self.intermediate
        return attn + mlp + 2 * H + (2 * D if self.qk_norm else 0)

    @property
    def params(self) -> int:
        """All parameters: embeddings, layers, final norm."""
        emb = self.vocab * self.hidden * (1 if self.tied else 2)
        return emb + self.layers * self.layer_params + self.hidden


def _get(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def model_shape(config: Any) -> ModelShape:
    """:class:`ModelShape` of a Transformers config (or a dict with the same keys).

    Args:
        config: ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``,
            ``num_key_value_heads`` (default: the query heads), ``head_dim`` (default ``hidden / heads``),
            ``vocab_size``, ``tie_word_embeddings``; MoE: ``num_experts`` or ``num_local_experts``,
            ``num_experts_per_tok``, ``moe_intermediate_size`` (default ``intermediate_size``),
            ``shared_expert_intermediate_size``.

    Returns:
        The shape.
    """
    config = text_config(config)
    H, heads = int(_get(config, "hidden_size")), int(_get(config, "num_attention_heads"))
    experts = int(_get(config, "num_experts", None) or _get(config, "num_local_experts", None) or 0)
    inter = int(_get(config, "intermediate_size", 0) or 0)
    return ModelShape(
        hidden=H, intermediate=inter, layers=int(_get(config, "num_hidden_layers")), q_heads=heads,
        kv_heads=int(_get(config, "num_key_value_heads", None) or heads),
        head_dim=int(_get(config, "head_dim", None) or H // heads), vocab=int(_get(config, "vocab_size")),
        tied=bool(_get(config, "tie_word_embeddings", False)), experts=experts,
        top_k=int(_get(config, "num_experts_per_tok", 0) or 0) if experts else 0,
        moe_intermediate=int(_get(config, "moe_intermediate_size", None) or inter) if experts else 0,
        shared_intermediate=int(_get(config, "shared_expert_intermediate_size", 0) or 0) if experts else 0,
        qk_norm=bool(_get(config, "qk_norm", _get(config, "model_type", "") in QK_NORM_TYPES)))
