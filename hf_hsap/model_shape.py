"""The one model-shape type: the sizes of a decoder-only LM, read from a Transformers config (pure: no torch).

:class:`ModelShape` is what the memory model prices (:mod:`hf_hsap.memory.model`), what the benchmarks' attention
schemes count bytes with (``benchmarks/analytic/schemes.py``) and what their cost model counts FLOPs with
(``benchmarks/analytic/cost_model.py``); :data:`MODEL_SHAPES` is the table of the benchmark models. :func:`text_config` is
the one place hf_hsap reads a model's language part from its config.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

__all__ = ["MODEL_SHAPES", "ModelShape", "QK_NORM_TYPES", "text_config"]

QK_NORM_TYPES = ("qwen3", "qwen3_moe")  # families with per-head q / k RMSNorms


def text_config(config: Any) -> Any:
    """The decoder's config of a Transformers config: ``get_text_config(decoder=True)`` of a composite
    (vision-language) config, else ``config`` itself (also when the call fails: an older signature, or several
    text configs). The one place hf_hsap reads a model's language part from its config."""
    get = getattr(config, "get_text_config", None)
    if not callable(get):
        return config
    try:
        return get(decoder=True)
    except (TypeError, ValueError):
        return config


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The sizes of a decoder-only LM: what its step's memory, its attention's bytes and its FLOPs depend on.

    Args:
        name: display name (``"Llama-3-8B"``; empty when read from a config).
        hidden, intermediate, layers, q_heads, kv_heads, head_dim, vocab: the config's sizes (``intermediate``: the
            gated MLP's, three matrices).
        tied: input and output embeddings share one matrix.
        experts, top_k, moe_intermediate: MoE layers (``experts == 0``: dense).
        shared_intermediate: a shared expert's intermediate size (0: none).
        qk_norm: per-head RMSNorms of queries and keys (Qwen3).
        dtype_bytes: bytes of one activation element (bf16: 2).
    """

    name: str = ""
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
    dtype_bytes: int = 2

    @property
    def kv_token_bytes(self) -> int:
        """Bytes of K and V of one token of one layer over all kv heads."""
        return 2 * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def q_token_bytes(self) -> int:
        """Bytes of Q (equally O) of one token of one layer over all q heads."""
        return self.q_heads * self.head_dim * self.dtype_bytes

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer, all of them (projections, norms, MLP or every expert and the router):
        what its weights, gradients and optimizer state hold."""
        H, D = self.hidden, self.head_dim
        if self.experts:
            mlp = self.experts * 3 * H * self.moe_intermediate + self.experts * H + 3 * H * self.shared_intermediate
        else:
            mlp = 3 * H * self.intermediate
        return self._attention_params + mlp + 2 * H + (2 * D if self.qk_norm else 0)

    @property
    def layer_linear_params(self) -> int:
        """Weights of one decoder layer's matrices a token is multiplied by (q, k, v, o projections and the gated
        MLP; with experts, the router, its ``top_k`` experts and the shared expert): a token's forward and backward
        through one layer's linear layers take ``6 ·`` this many FLOPs. No norms."""
        H = self.hidden
        if self.experts:
            mlp = self.top_k * 3 * H * self.moe_intermediate + self.experts * H + 3 * H * self.shared_intermediate
        else:
            mlp = 3 * H * self.intermediate
        return self._attention_params + mlp

    @property
    def params(self) -> int:
        """All parameters: embeddings, layers, final norm."""
        emb = self.vocab * self.hidden * (1 if self.tied else 2)
        return emb + self.layers * self.layer_params + self.hidden

    @property
    def _attention_params(self) -> int:
        """Weights of one layer's q, k, v and o projections."""
        return self.hidden * self.head_dim * (2 * self.q_heads + 2 * self.kv_heads)

    @classmethod
    def from_config(cls, config: Any) -> "ModelShape":
        """The shape of a Transformers config (its text config, :func:`text_config`), or of a dict with its keys.

        Args:
            config: ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``,
                ``num_key_value_heads`` (default: the query heads), ``head_dim`` (default ``hidden / heads``),
                ``vocab_size``, ``tie_word_embeddings``; MoE: ``num_experts`` or ``num_local_experts``,
                ``num_experts_per_tok``, ``moe_intermediate_size`` (default ``intermediate_size``),
                ``shared_expert_intermediate_size``; ``qk_norm`` (default: the family has them,
                :data:`QK_NORM_TYPES`).

        Returns:
            The shape (no name; activations of 2 bytes).
        """
        config = text_config(config)
        H, heads = int(_get(config, "hidden_size")), int(_get(config, "num_attention_heads"))
        experts = int(_get(config, "num_experts", None) or _get(config, "num_local_experts", None) or 0)
        inter = int(_get(config, "intermediate_size", 0) or 0)
        return cls(
            hidden=H, intermediate=inter, layers=int(_get(config, "num_hidden_layers")), q_heads=heads,
            kv_heads=int(_get(config, "num_key_value_heads", None) or heads),
            head_dim=int(_get(config, "head_dim", None) or H // heads), vocab=int(_get(config, "vocab_size")),
            tied=bool(_get(config, "tie_word_embeddings", False)), experts=experts,
            top_k=int(_get(config, "num_experts_per_tok", 0) or 0) if experts else 0,
            moe_intermediate=int(_get(config, "moe_intermediate_size", None) or inter) if experts else 0,
            shared_intermediate=int(_get(config, "shared_expert_intermediate_size", 0) or 0) if experts else 0,
            qk_norm=bool(_get(config, "qk_norm", _get(config, "model_type", "") in QK_NORM_TYPES)))


def _get(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


# Hugging Face configs of meta-llama/Llama-2-7b-hf and meta-llama/Meta-Llama-3-8B.
MODEL_SHAPES: Mapping[str, ModelShape] = MappingProxyType({
    "llama2-7b": ModelShape(name="Llama-2-7B", layers=32, hidden=4096, q_heads=32, kv_heads=32, head_dim=128,
                            intermediate=11008, vocab=32000),
    "llama3-8b": ModelShape(name="Llama-3-8B", layers=32, hidden=4096, q_heads=32, kv_heads=8, head_dim=128,
                            intermediate=14336, vocab=128256),
})
