"""The peak memory of one training step per GPU, term by term (pure: no torch, no device query).

:func:`predict_step_memory` models a Transformers decoder-only causal LM (dense Llama / Qwen / Mistral-like or
Qwen3-MoE / Mixtral-like) trained on packed rows sharded over ``sp_size`` ranks with hf_hsap, under the
:class:`~.levers.MemoryLevers`. Every per-token figure is the tensors the implementation holds (found with
``benchmarks/tensor_memory.py``'s ``at_peak`` on CPU; ``benchmarks/memory_model.py`` checks the sum):

* **a layer's saved tensors** (per token, ``a`` = bytes of the activations' dtype): per RMSNorm (two per layer) the
  normalised input and the scaled output (``2 a H``) and, in 16-bit, the float32 copy of the input (``4 H``) and
  one float32 ``rsqrt``; the two residual sums (``2 a H``); the rotated query, rotated key and value that the
  attention keeps (``a (Hq + 2 Hkv) D``); the attention output (``a Hq D``, a zero-initialised buffer of
  hf_hsap's kernel) and its float32 logsumexp (``4 Hq``); the gated MLP's gate, up, activation and product
  (``4 a I``; MoE: the router's logits and float32 probabilities and, per routed copy of a token, the gathered
  input, the expert's gate|up, activation, product and weighted output: ``k (2 a H + 4 a I_moe)``).
* **the backward working set of a layer** (beside its saved tensors): the residual stream's gradient (``a H``)
  and the MLP's gradient temporaries (``2 a I``: the product's gradient and one of gate / up); with checkpointing
  the recomputed layer's saved tensors (the recomputation stops before the layer's output: ``a H`` less); with the
  tiled MLP the MLP saves only its input and one tile of ``mlp_tile_tokens`` tokens holds its intermediates and
  their gradients (``6 a I`` per tile token) beside the input's gradient (``a H``).
* **the loss**: without the chunked head the float32 log-softmax, the gradient of the loss by it and by the
  logits (``3 x 4`` bytes per logit) and, in 16-bit, the ``[t, V]`` logits the model's output keeps and their
  gradient's cast (``2 a``); with it (:mod:`.fused_ce`, the gradients formed in the forward) one tile of
  ``loss_tile_tokens x V`` float32 logits, one float32 temporary of the tile (``logsumexp``'s exponentials) and,
  in 16-bit, the tile's matmul output before its float32 cast; the gradient of the hidden states ``[t, H]``
  (``a``), the head's float32 gradient ``[V, H]`` and the head's weights cast to the compute dtype when they
  differ; a few bytes per token (labels, their clamp, the mask).
* **SAP's buffers** (``sp_size > 1``): :mod:`hf_hsap.plan.memory`'s per-token factors for the worst rank of one
  causal document spread over all ranks (it needs the K|V of every other rank: ``(P - 1) t`` tokens, or the
  receive budget's double-buffered rounds), plus the Ulysses all-to-all copies when ``ulysses_size > 1``.

The stages and what is alive at each (the peak is the largest):

* ``"loss"``: the weights, optimizer states, every layer's saved tensors (with checkpointing only the layers'
  inputs, on the host when offloaded) and the loss's working set;
* ``"layer"``: the same saved tensors, the last layer's recomputation (checkpointing) and backward working set,
  SAP's buffers, and the head's gradient;
* ``"optimizer"``: the weights, all gradients, the optimizer states and its temporaries (one parameter-sized
  float32 list of ``torch.optim.AdamW``'s ``foreach`` path on CUDA; one tensor's on CPU).

Weights are ``param_dtype``; gradients too; AdamW holds two float32 moments per parameter and, with 16-bit weights
and ``master_weights``, a float32 master copy. DDP keeps everything whole, plus its gradient buckets (a second
copy of the gradients: ``gradient_as_bucket_view=False``, the default); FSDP2 / ZeRO-3 divide weights, gradients
and states by ``world`` and add the largest layer's unsharded weights and gradient while it runs.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from ..plan.memory import A2A_KV, A2A_Q, OWN_KV, OWN_Q, RECV, SEND, kv_heads_held
from .levers import MemoryLevers

__all__ = ["ModelShape", "StepMemory", "model_shape", "predict_step_memory", "DTYPE_BYTES", "TERMS"]

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
LOSS_TILE_ELEMENTS = 1 << 24  # the chunked head's default tile (hf_hsap.memory.head.DEFAULT_TILE_ELEMENTS)
LOSS_TILE_TEMPS = 1  # float32 [tile, V] temporaries beside the tile's logits (logsumexp's exp)
LOSS_TOKEN_STATS = 24  # bytes per token of the loss's own (flattened labels, their clamp, the mask)
QK_NORM_TYPES = ("qwen3", "qwen3_moe")
TERMS = ("weights", "grads", "optimizer", "activations", "working", "loss", "sap")


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
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
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


@dataclass(frozen=True)
class StepMemory:
    """One step's modelled peak per GPU, in bytes, at its largest stage (module docstring).

    Attributes:
        weights: parameters (sharded part + the unsharded layer in use).
        grads: gradients alive at the stage (DDP: with its buckets).
        optimizer: AdamW moments and master weights (and, at the optimizer stage, its temporaries).
        activations: tensors saved for backward (every layer's, or with checkpointing the layers' inputs; 0 when
            offloaded).
        working: the recomputed layer and one layer's backward working set (or the MLP tile).
        loss: the loss's working set.
        sap: SAP's receive / send buffers and Ulysses' all-to-all copies.
        host: bytes moved to host memory by activation offloading (not in :attr:`total`).
        stage: ``"loss"``, ``"layer"`` or ``"optimizer"``.
        tokens: tokens per rank.
        states: the optimizer states alone (resident between steps; not a term of its own).
        stages: every stage's total.
    """

    weights: float
    grads: float
    optimizer: float
    activations: float
    working: float
    loss: float
    sap: float
    host: float = 0.0
    stage: str = "layer"
    tokens: int = 0
    states: float = field(default=0.0, compare=False)
    stages: dict = field(default_factory=dict, compare=False)

    @property
    def total(self) -> float:
        """The modelled peak (bytes on the device)."""
        return float(sum(getattr(self, t) for t in TERMS))

    def limiting_term(self) -> str:
        """The largest term."""
        return max(TERMS, key=lambda t: getattr(self, t))

    def as_dict(self) -> dict[str, Any]:
        """Every term, the total and the limiting term (bytes)."""
        d = {k: v for k, v in asdict(self).items() if k != "stages"}
        d.update(total=self.total, limiting_term=self.limiting_term())
        return d

    def table(self) -> str:
        """A plain-text table of the terms in GiB."""
        rows = [f"{t:<12s}{getattr(self, t) / 2**30:10.2f} GiB" for t in TERMS]
        rows += [f"{'total':<12s}{self.total / 2**30:10.2f} GiB  (stage {self.stage}, {self.tokens} tokens/rank)",
                 f"{'host':<12s}{self.host / 2**30:10.2f} GiB"]
        return "\n".join(rows)


def _layer_saved(s: ModelShape, a: int, tiled_mlp: bool) -> float:
    """Bytes per token one decoder layer saves for its backward (module docstring)."""
    H, D = s.hidden, s.head_dim
    norm = 2 * (2 * a * H + (4 * H if a < 4 else 0) + 4)  # normalised, scaled, (float32 copy), rsqrt
    residual = 2 * a * H
    attention = a * (2 * s.q_heads + 2 * s.kv_heads) * D + 4 * s.q_heads  # q, k, v rotated/kept, out, lse
    if s.qk_norm:  # q / k norms: their input (float32 copy in 16-bit) and normalised value, a rsqrt per head
        attention += (s.q_heads + s.kv_heads) * (D * (a + 4) + 4)
    return norm + residual + attention + _mlp_saved(s, a, tiled_mlp)


def _mlp_saved(s: ModelShape, a: int, tiled_mlp: bool) -> float:
    """Bytes per token the MLP (or MoE block) saves; a tiled dense MLP saves only its input (counted as the norm's)."""
    if s.experts:
        router = s.experts * (a + 4)  # logits, float32 probabilities
        routed = s.top_k * (2 * a * s.hidden + 4 * a * s.moe_intermediate)
        return router + routed + 4 * a * s.shared_intermediate
    return 0.0 if tiled_mlp else 4.0 * a * s.intermediate


def _mlp_width(s: ModelShape) -> int:
    """The MLP's intermediate width a token touches."""
    return s.top_k * s.moe_intermediate + s.shared_intermediate if s.experts else s.intermediate


def _layer_working(s: ModelShape, a: int, t: int, levers: MemoryLevers) -> float:
    """Bytes of one layer's backward working set beside its saved tensors, for ``t`` tokens."""
    H = s.hidden
    if levers.tiled_mlp and not s.experts:  # TiledMLP leaves MoE blocks alone
        tile = min(t, levers.mlp_tile_tokens)
        return t * a * H + tile * 6 * a * s.intermediate
    return t * (a * H + 2 * a * _mlp_width(s))


def loss_tile_tokens(vocab: int, levers: MemoryLevers) -> int:
    """Tokens per tile of the chunked loss (the head's default: about ``2**24`` logits a tile)."""
    return int(levers.loss_tile_tokens or max(1, LOSS_TILE_ELEMENTS // max(1, vocab)))


def _loss_bytes(s: ModelShape, t: int, a: int, w: int, levers: MemoryLevers) -> float:
    """The loss's working set for ``t`` tokens (module docstring); ``w`` = bytes of the head's weights."""
    V, H = s.vocab, s.hidden
    if not levers.chunked_loss:
        return t * V * (3 * 4 + (2 * a if a < 4 else 0))
    n = min(t, loss_tile_tokens(V, levers))
    tile = n * V * (4 + LOSS_TILE_TEMPS * 4 + (a if a < 4 else 0))
    grads = t * H * a + V * H * 4 + (V * H * a if w != a else 0)  # grad_h, float32 grad_w, the weight's cast
    return tile + grads + LOSS_TOKEN_STATS * t


def _sap_bytes(s: ModelShape, t: int, a: int, sp: int, U: int, recv_budget: int | None,
               checkpointed: bool) -> tuple[float, float]:
    """SAP's buffers of the worst rank: ``(saved per layer, working set of the layer in backward)`` in bytes."""
    if sp <= 1:
        return 0.0, 0.0
    hkv = kv_heads_held(s.kv_heads, U)
    unit = s.head_dim * a  # one token of one head
    parts = sp // U
    recv = (parts - 1) * U * t  # part tokens received from every other part (one causal document, worst rank)
    if recv_budget is not None and parts > 2:
        kv_work = 1.5 * RECV * min(recv_budget, recv) + 2 * SEND * min(recv_budget, recv)
        kv_saved = 0.0
    else:
        kv_work = RECV * recv + SEND * recv / max(parts - 1, 1)
        kv_saved = 2 * recv  # K and V buffers kept for the backward
    own = t * (OWN_KV * hkv) / 1.0  # dK|dV accumulators and the K|V send rows (output and dQ: the layer's own)
    a2a = t * (A2A_Q * s.q_heads + A2A_KV * hkv) if U > 1 else 0.0
    saved = 0.0 if checkpointed else kv_saved * hkv / U * unit
    return saved, (kv_work * hkv / U + own + a2a) * unit


def predict_step_memory(config: Any, row_tokens: int, *, world: int, sp_size: int, ulysses_size: int = 1,
                        sharding: str = "ddp", levers: MemoryLevers = MemoryLevers(), param_dtype: str = "bf16",
                        compute_dtype: str = "bf16", optimizer: str = "adamw", master_weights: bool = True,
                        recv_budget_tokens: int | None = None, device: str = "cuda") -> StepMemory:
    """The modelled per-GPU peak of one step (forward, backward, optimizer step), term by term.

    Args:
        config: a Transformers config or a dict of its sizes (:func:`model_shape`).
        row_tokens: tokens of one packed row (sharded over ``sp_size`` ranks).
        world: GPUs in all (``world / sp_size`` data-parallel replicas).
        sp_size: ranks one row is sharded over; ulysses_size: the Ulysses degree within them.
        sharding: ``"ddp"``, ``"fsdp2"`` or ``"zero3"`` (both divide weights, gradients and states by ``world``);
            ``"none"``: no DP wrapper (one process, or ranks stepping alone: no buckets).
        levers: the memory levers.
        param_dtype: weights and gradients; compute_dtype: the activations (``"bf16"``, ``"fp16"``, ``"fp32"``).
        optimizer: ``"adamw"`` (two float32 moments) or ``"sgd"`` (none).
        master_weights: a float32 copy of 16-bit weights in the optimizer.
        recv_budget_tokens: SAP's receive budget (None: every round's K|V kept for the backward).
        device: ``"cuda"`` (offloading moves the saved tensors to the host; AdamW's ``foreach`` temporaries) or
            ``"cpu"`` (offloading is a no-op, activations already live in host memory; AdamW steps one tensor at a
            time).

    Returns:
        The :class:`StepMemory` of the largest stage.

    Raises:
        ValueError: unknown names or sizes that do not divide.
    """
    if sharding not in ("none", "ddp", "fsdp2", "zero3"):
        raise ValueError(f"sharding must be 'none', 'ddp', 'fsdp2' or 'zero3', got {sharding!r}")
    if optimizer not in ("adamw", "sgd"):
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if sp_size < 1 or world % sp_size or sp_size % ulysses_size:
        raise ValueError(f"need sp_size | world and ulysses_size | sp_size (world {world}, sp {sp_size}, "
                         f"ulysses {ulysses_size})")
    s = model_shape(config)
    w, a = DTYPE_BYTES[param_dtype], DTYPE_BYTES[compute_dtype]
    t = math.ceil(row_tokens / sp_size)
    P = s.params
    shard = world if sharding in ("fsdp2", "zero3") else 1
    layer_w = s.layer_params * w
    weights = P * w / shard + (layer_w if shard > 1 else 0)
    grads_all = P * w / shard + (layer_w if shard > 1 else P * w if sharding == "ddp" else 0)  # DDP: buckets
    state_b = (8 if optimizer == "adamw" else 0) + (4 if master_weights and w < 4 else 0)
    states = P * state_b / shard
    opt_tmp = (P * 4 / shard if device == "cuda" else max(s.vocab * s.hidden, s.layer_params) * 4 / shard) \
        if optimizer == "adamw" else 0.0
    head_grad = s.vocab * s.hidden * w / shard + (layer_w if shard > 1 else 0)

    ckpt = levers.gradient_checkpointing
    offload = levers.activation_offloading and device == "cuda"
    saved_layer = _layer_saved(s, a, levers.tiled_mlp and not s.experts)
    sap_saved, sap_work = _sap_bytes(s, t, a, sp_size, ulysses_size, recv_budget_tokens, ckpt)
    if ckpt:  # each layer keeps its input; the last one is recomputed in backward
        stack = s.layers * t * a * s.hidden
        recompute = t * (saved_layer - a * s.hidden)  # the recomputation stops before the layer's output
    else:
        stack = s.layers * (t * saved_layer + sap_saved)
        recompute = 0.0
    stack += t * (a * s.hidden + 4 * s.head_dim)  # the final norm's input; rotary cos / sin (float32)
    stack += t * (2 * a * s.hidden + (4 * s.hidden if a < 4 else 0))  # the final norm's saved tensors
    host = stack if offload else 0.0
    device_stack = 0.0 if offload else stack
    loss = _loss_bytes(s, t, a, w, levers)
    working = recompute + _layer_working(s, a, t, levers)

    stages = {
        "loss": StepMemory(weights, 0.0, states, device_stack, 0.0, loss, 0.0, host, "loss", t),
        "layer": StepMemory(weights, head_grad, states, device_stack, working, 0.0, sap_work, host, "layer", t),
        "optimizer": StepMemory(weights, grads_all, states + opt_tmp, 0.0, 0.0, 0.0, 0.0, host, "optimizer", t),
    }
    best = max(stages.values(), key=lambda m: m.total)
    return StepMemory(**{k: v for k, v in asdict(best).items() if k not in ("stages", "states")},
                      states=states, stages={k: m.total for k, m in stages.items()})
