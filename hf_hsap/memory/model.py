"""The peak memory of one training step per GPU, term by term (pure: no torch, no device query).

:func:`predict_step_memory` models a Transformers decoder-only causal LM (dense Llama / Qwen / Mistral-like or
Qwen3-MoE / Mixtral-like) trained on packed rows sharded over ``sp_size`` ranks with hf_hsap, under the
:class:`~.levers.MemoryLevers`. Every per-token figure is the tensors the implementation holds (found with
``benchmarks/tensor_memory.py``'s ``at_peak`` on CPU; ``benchmarks/suites/memory_model.py`` checks the sum):

* **a layer's saved tensors** (per token, ``a`` = bytes of the activations' dtype): per RMSNorm (two per layer,
  :func:`_norm_saved`) its output (``a H``, the next projection's input), the normalised value cast back
  (``a H``), one float32 ``rsqrt`` and its float32 input: in 16-bit a float32 copy (``4 H``; the 16-bit input is
  then held by nothing), in float32 the input itself (the layer's input and the first residual sum). With
  ``recompute_norms`` a norm keeps only its input (``a H``: the layer's input, which the checkpoint holds anyway,
  and the first residual sum). Then the rotated query, rotated key and value that the attention keeps
  (``a (Hq + 2 Hkv) D``); the attention output (``a Hq D``) and its float32 logsumexp (``4 Hq``); the gated MLP's
  gate, up, activation and product (``4 a I``; MoE: the router's logits and float32 probabilities and, per routed
  copy of a token, the gathered input, the expert's gate|up, activation, product and weighted output:
  ``k (2 a H + 4 a I_moe)``); the rotary cos / sin (``2 a D``, once).
* **the last layer's backward** (beside the saved tensors; with checkpointing the layer is recomputed first, all but
  its input), the largest of three phases: the MLP's (the residual stream's gradient ``a H``, the MLP's gradient
  temporaries ``2 a I``; tiled: one tile of ``mlp_tile_tokens`` tokens with its intermediates and their gradients
  ``6 a I`` per tile token, the input's gradient ``a H``, the tiles' float32 weight-gradient sums, the previous
  tile's input and weight gradients and the first of this tile's); the second norm's (the MLP's and that norm's saved
  tensors consumed; its float32 input and five float32 temporaries alive at once, ``6 x 4 H``: ``g * rsqrt``, the
  mean's expanded gradient, ``pow``'s ``x``, ``2 x`` and their product; recomputed, for one tile of rows, beside the
  input's gradient); the attention's (the residual's and the output's gradients and the kernel's backward: on CPU
  float32 dQ|dK|dV and their casts, on CUDA flash's float32 ``dQ``, dQ|dK|dV and under GQA dK|dV over the query
  heads; under SP a float32 ``dQ`` and SAP's working set; with ``tiled_attention`` at SP 1 the row's ``dQ`` and float32
  ``dK|dV`` sums and one tile's buffers, :func:`_tiled_attention_backward`). Without checkpointing the final norm's
  backward takes the second norm's place (every layer's tensors still alive). The gradients formed by then: the head's
  and the layer's own for the first layer to run its backward, every other layer's too for the last (which has
  released every other layer's saved tensors): the larger.
* **the loss**: without the chunked head the float32 log-softmax, the gradient of the loss by it and by the
  logits (``3 x 4`` bytes per logit; 16-bit logits are freed by then); with it (:mod:`.fused_ce`, the gradients
  formed in the forward) one tile of ``loss_tile_tokens x V`` float32 logits, one float32 temporary of the tile
  (``logsumexp``'s exponentials) and, in 16-bit, the tile's matmul output before its float32 cast; the gradient
  of the hidden states ``[t, H]`` (``a``), the head's float32 gradient ``[V, H]`` and the head's weights cast to
  the compute dtype when they differ; a few bytes per token (labels, their clamp, the mask); the final norm's
  saved tensors and output.
* **SAP's buffers** (``sp_size > 1``): :mod:`hf_hsap.plan.memory`'s per-token factors for the worst rank of one
  causal document spread over all ranks (it needs the K|V of every other rank: ``(P - 1) t`` tokens, or the
  receive budget's double-buffered rounds), with the runtime's gradient accumulators in float32 and the kernel's
  dK|dV of a round in the activations' dtype, plus the Ulysses all-to-all copies when ``ulysses_size > 1``.
  Without a budget the received K|V stay alive through the layer's backward.

The stages and what is alive at each (the peak is the largest):

* ``"loss"``: the weights, optimizer states, every layer's saved tensors (with checkpointing only the layers'
  inputs: with ``checkpoint_layers`` ``b``, the ``ceil(L / b)`` blocks' inputs; offloaded, on the host but for the
  checkpoints made in the last ``layers_kept_on_device`` layers) and the loss's working set;
* ``"layer"``: the same saved tensors, the last layer's backward (above; with blocks of ``b`` layers, beside the
  recomputed saved tensors, and SAP's kept K|V, of the block's ``b - 1`` other layers), SAP's buffers, and the
  gradients;
* ``"optimizer"``: the weights, all gradients, the optimizer states and its temporaries (one parameter-sized
  list of ``torch.optim.AdamW``'s ``foreach`` path on CUDA; one tensor's on CPU).

Weights are ``param_dtype``; gradients too; AdamW holds two moments per parameter in the dtype of the weights it
steps: float32 with ``master_weights`` (a float32 master copy of 16-bit weights), else the weights' own. DDP keeps
everything whole, plus its gradient buckets (a second copy of the gradients: ``gradient_as_bucket_view=False``,
the default); FSDP2 / ZeRO-3 divide weights, gradients and states by ``world`` and add the largest layer's
unsharded weights and gradient while it runs. With ``offload`` the optimizer states, master weights and gradient
shards (and with ``"params"`` the weights' shard) move to the host (:mod:`.host`): the optimizer stage on the device
then holds the weights alone.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..model_shape import ModelShape
from ..plan.memory import A2A_KV, A2A_Q, OWN_KV, OWN_Q, RECV, SEND, kv_heads_held
from .blocks import block_starts, checkpoints_kept
from .head import loss_tile_tokens
from .host import place_states
from .offload import slab_bytes
from .levers import MemoryLevers

__all__ = ["StepMemory", "predict_step_memory", "DTYPE_BYTES", "TERMS"]

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
LOSS_TILE_TEMPS = 1  # float32 [tile, V] temporaries beside the tile's logits (logsumexp's exp)
LOSS_TOKEN_STATS = 24  # bytes per token of the loss's own (flattened labels, their clamp, the mask)
NORM_BACKWARD_F32 = 6  # float32 [t, width] tensors of one RMSNorm's backward at its peak (module docstring)
TERMS = ("weights", "grads", "optimizer", "activations", "working", "loss", "sap")


@dataclass(frozen=True)
class StepMemory:
    """One step's modelled peak per GPU, in bytes, at its largest stage (module docstring).

    Attributes:
        weights: parameters (sharded part + the unsharded layer in use).
        grads: gradients alive at the stage (DDP: with its buckets).
        optimizer: AdamW moments and master weights (and, at the optimizer stage, its temporaries).
        activations: tensors saved for backward (every layer's, or with checkpointing the layers' or blocks'
            inputs; offloaded, only the last ``layers_kept_on_device`` layers').
        working: the recomputed layer and one layer's backward working set (or the MLP tile).
        loss: the loss's working set.
        sap: SAP's receive / send buffers and Ulysses' all-to-all copies.
        host: the step's tensors in host memory (not in :attr:`total`): offloaded activations (hf_hsap's pinned
            slab: each saved tensor's bytes, :mod:`.offload`), offloaded optimizer states, gradients and parameters
            (:mod:`.host`); ``host_terms`` by term.
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
    host_terms: dict = field(default_factory=dict, compare=False)

    @property
    def total(self) -> float:
        """The modelled peak (bytes on the device)."""
        return float(sum(getattr(self, t) for t in TERMS))

    def limiting_term(self) -> str:
        """The largest term."""
        return max(TERMS, key=lambda t: getattr(self, t))

    def as_dict(self) -> dict[str, Any]:
        """Every term, the total and the limiting term (bytes)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("stages", "host_terms")}
        d.update(total=self.total, limiting_term=self.limiting_term())
        return d

    def table(self) -> str:
        """A plain-text table of the terms in GiB."""
        rows = [f"{t:<12s}{getattr(self, t) / 2**30:10.2f} GiB" for t in TERMS]
        rows += [f"{'total':<12s}{self.total / 2**30:10.2f} GiB  (stage {self.stage}, {self.tokens} tokens/rank)",
                 f"{'host':<12s}{self.host / 2**30:10.2f} GiB"]
        return "\n".join(rows)


def _norm_saved(width: int, a: int, recompute: bool, keeps_input: bool) -> float:
    """Bytes per token one RMSNorm of ``width`` saves for its backward beside its output (its consumer's input).

    Transformers' RMSNorm casts its input to float32, squares it (``pow`` saves the float32 input), scales it by a
    float32 ``rsqrt`` (``mul`` saves both) and multiplies the weight by the normalised value cast back (``mul``
    saves it): in 16-bit the float32 copy (``4 w``), the ``rsqrt`` (4) and the normalised value (``a w``); in
    float32 the cast is the input itself, saved as is (``keeps_input``: counted here unless it is held elsewhere).
    Recomputed (``recompute_norms``), the norm saves only its input.
    """
    if recompute:
        return a * width if keeps_input else 0.0
    return (4.0 * width if a < 4 else (a * width if keeps_input else 0.0)) + 4 + a * width


def _layer_parts(s: ModelShape, a: int, levers: MemoryLevers) -> dict[str, float]:
    """Bytes per token one decoder layer saves, by part (module docstring): ``input`` (the layer's input, kept by
    its first norm; with checkpointing the checkpoint's own), ``norm1`` (the first norm's other tensors and its
    output), ``attention``, ``norm2`` (the second norm's, its input being the first residual sum) and ``mlp``."""
    H, D, rn = s.hidden, s.head_dim, levers.recompute_norms
    keeps = rn or a >= 4  # the norm's input itself is saved (recomputed, or float32: the cast is a no-op)
    attention = a * (2 * s.q_heads + 2 * s.kv_heads) * D + 4 * s.q_heads  # q, k rotated, v, out; float32 lse
    if s.qk_norm:  # per-head q / k norms: their input is the projection's output, held by nothing else
        attention += (s.q_heads + s.kv_heads) * _norm_saved(D, a, rn, True)
    return {"input": a * H if keeps else 0.0, "norm1": _norm_saved(H, a, rn, False) + a * H,
            "attention": attention, "norm2": _norm_saved(H, a, rn, True) + a * H,
            "mlp": _mlp_saved(s, a, levers.tiled_mlp and not s.experts)}


def _mlp_saved(s: ModelShape, a: int, tiled_mlp: bool) -> float:
    """Bytes per token the MLP (or MoE block) saves; a tiled dense MLP saves only its input (counted as the norm's)."""
    if s.experts:
        router = s.experts * (a + 4)  # logits, float32 probabilities
        routed = s.top_k * (2 * a * s.hidden + 4 * a * s.moe_intermediate)
        return router + routed + 4 * a * s.shared_intermediate
    return 0.0 if tiled_mlp else 4.0 * a * s.intermediate


def _mlp_params(s: ModelShape) -> int:
    """Parameters of one layer's MLP (or experts, router and shared expert)."""
    H = s.hidden
    if s.experts:
        return s.experts * (3 * H * s.moe_intermediate + H) + 3 * H * s.shared_intermediate
    return 3 * H * s.intermediate


def _mlp_width(s: ModelShape) -> int:
    """The MLP's intermediate width a token touches."""
    return s.top_k * s.moe_intermediate + s.shared_intermediate if s.experts else s.intermediate


def _layer_working(s: ModelShape, a: int, w: int, t: int, levers: MemoryLevers) -> float:
    """Bytes of one layer's MLP backward working set beside its saved tensors, for ``t`` tokens (``w``: bytes of
    a weight's gradient)."""
    H = s.hidden
    if levers.tiled_mlp and not s.experts:  # TiledMLP leaves MoE blocks alone
        tile = min(t, levers.mlp_tile_tokens)  # the input's gradient accumulates beside the residual's; over tiles
        # the float32 weight-gradient sums, the previous tile's input and weight gradients (own_grad), down's of this
        grads = w * _mlp_params(s) if t <= tile else tile * a * H + 4 * _mlp_params(s) + w * H * s.intermediate
        return 2 * t * a * H + tile * 6 * a * s.intermediate + grads
    return t * (a * H + 2 * a * _mlp_width(s))


def _attention_backward(s: ModelShape, a: int, sp: int, device: str) -> float:
    """Bytes per token of the attention kernel's backward beside ``dO`` (module docstring; SAP's: its own)."""
    q, kv = s.q_heads * s.head_dim, 2 * s.kv_heads * s.head_dim
    if sp > 1:
        return 4.0 * q
    if device == "cpu":  # float32 accumulators, cast back to 16-bit at the end
        return (4.0 + (a if a < 4 else 0)) * (q + kv)
    return 4.0 * q + a * (q + kv) + (2 * a * q if s.kv_heads < s.q_heads else 0)


def _tiled_attention_backward(s: ModelShape, a: int, t: int, tile: int, device: str) -> float:
    """Bytes of the tiled attention's backward beside ``dO`` for ``t`` tokens (``tiled_attention`` at SP 1,
    :class:`~hf_hsap.kernels.TiledKernel`): the row's ``dQ`` and float32 ``dK|dV`` sums, and the larger of one tile's
    buffers (its float32 ``dQ`` sum and the kernel's backward of one call: ``n`` queries, at most ``n`` keys; on CPU
    float32 ``dQ|dK|dV`` and their casts, on CUDA flash's float32 ``dQ``, ``dQ|dK|dV`` and under GQA ``dK|dV`` over
    the query heads) and ``dK``'s cast back at the end."""
    q, kv = s.q_heads * s.head_dim, 2 * s.kv_heads * s.head_dim
    n = min(t, tile)
    cast = a if a < 4 else 0  # float32 inputs: the float32 sums are the results
    if device == "cpu":
        call = n * (4.0 + cast) * (q + kv)
    else:
        call = n * (4.0 * q + a * (q + kv) + (2 * a * q if s.kv_heads < s.q_heads else 0))
    return t * (a * q + 4.0 * kv) + max(n * 4.0 * q + call, t * cast * kv / 2)


def _loss_bytes(s: ModelShape, t: int, a: int, w: int, levers: MemoryLevers) -> float:
    """The loss's working set for ``t`` tokens (module docstring); ``w`` = bytes of the head's weights."""
    V, H = s.vocab, s.hidden
    if not levers.chunked_loss:  # float32 log-softmax and its two gradients; 16-bit logits are freed by then
        return t * V * 3 * 4
    n = min(t, loss_tile_tokens(V, levers.loss_tile_tokens))
    tile = n * V * (4 + LOSS_TILE_TEMPS * 4 + (a if a < 4 else 0))
    grads = t * H * a + V * H * 4 + (V * H * a if w != a else 0)  # grad_h, float32 grad_w, the weight's cast
    return tile + grads + LOSS_TOKEN_STATS * t


def _sap_bytes(s: ModelShape, t: int, a: int, sp: int, U: int, recv_budget: int | None) -> tuple[float, float]:
    """SAP's buffers of the worst rank: ``(kept, working)`` in bytes: the received K|V a layer keeps for its backward
    (none under a receive budget: its rounds are recomputed) and the attention's backward working set."""
    if sp <= 1:
        return 0.0, 0.0
    hkv = kv_heads_held(s.kv_heads, U)
    unit = s.head_dim * a  # one token of one head
    parts = sp // U
    recv = (parts - 1) * U * t  # part tokens received from every other part (one causal document, worst rank)
    g = 4 / a  # the runtime's gradient accumulators (dK|dV of the received rows, its own dK|dV) are float32
    # per received token and K|V half: the buffer(s), the float32 gradient and the kernel's dK|dV of the round
    if recv_budget is not None and parts > 2:  # two K|V buffers and one gradient in flight
        kv_work = RECV / 2 * (3 + g) * min(recv_budget, recv) + 2 * SEND * min(recv_budget, recv)
        kv_saved = 0.0
    else:  # every round's K|V buffer and its gradient
        kv_work = RECV / 2 * (2 + g) * recv + SEND * recv / max(parts - 1, 1)
        kv_saved = 2 * recv  # K and V buffers kept for the backward
    own = t * (OWN_KV - 2 + 2 * g) * hkv  # dK|dV accumulators and the K|V send rows (output and dQ: the layer's)
    a2a = t * (A2A_Q * s.q_heads + A2A_KV * hkv) if U > 1 else 0.0
    return kv_saved * hkv / U * unit, (kv_work * hkv / U + own + a2a) * unit


def predict_step_memory(config: Any, row_tokens: int, *, world: int, sp_size: int, ulysses_size: int = 1,
                        sharding: str = "ddp", levers: MemoryLevers = MemoryLevers(), param_dtype: str = "bf16",
                        compute_dtype: str = "bf16", optimizer: str = "adamw", master_weights: bool = True,
                        recv_budget_tokens: int | None = None, device: str = "cuda",
                        offload: str = "none", pinned_round_limit_mb: float | None = None) -> StepMemory:
    """The modelled per-GPU peak of one step (forward, backward, optimizer step), term by term.

    Args:
        config: a Transformers config or a dict of its sizes (:meth:`hf_hsap.model_shape.ModelShape.from_config`).
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
        offload: ``"none"``, ``"optimizer"`` (ZeRO-3 offload_optimizer: master weights, moments and gradient
            partitions on the host) or ``"params"`` (the parameters too: ZeRO-3 offload_param, FSDP2's
            CPUOffloadPolicy); :mod:`.host` says what each engine holds where.
        pinned_round_limit_mb: the engines' pinned host allocations (DeepSpeed's and FSDP2's offload buffers; the
            activations' slab is exact) above this many MiB are not rounded up to a power of two
            (``PYTORCH_ALLOC_CONF=pinned_max_round_threshold_mb:N,pinned_max_cached_size_mb:N``; None: torch's
            default, all rounded).

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
    s = ModelShape.from_config(config)
    w, a = DTYPE_BYTES[param_dtype], DTYPE_BYTES[compute_dtype]
    t = math.ceil(row_tokens / sp_size)
    P = s.params
    shard = world if sharding in ("fsdp2", "zero3") else 1
    layer_w = s.layer_params * w
    # the weights, gradients and optimizer states: on the device and on the host
    place = place_states(s, w=w, shard=shard, sharding=sharding, optimizer=optimizer, master_weights=master_weights,
                         offload=offload, device=device, pinned_round_limit_mb=pinned_round_limit_mb)
    weights, grads_all, states, opt_tmp = place.weights, place.grads_all, place.states, place.opt_tmp
    # the gradients while a layer runs its backward: the head's and, for the first layer to run it, no other layer's;
    # for the last, every other parameter's but the input embedding's (sharded as they form); beside the layer's own
    # (its MLP's when unsharded; the gathered layer's under FSDP)
    own_grad = layer_w if shard > 1 else _mlp_params(s) * w
    head_grad = s.vocab * s.hidden * place.grad_per_param + own_grad
    emb_in = 0 if s.tied else s.vocab * s.hidden
    last_grads = (P - emb_in - s.layer_params) * place.grad_per_param + own_grad

    ckpt = levers.gradient_checkpointing
    offload_acts = levers.activation_offloading and device == "cuda"
    H = s.hidden
    parts = _layer_parts(s, a, levers)
    saved_layer = sum(parts.values())
    sap_kept, sap_work = _sap_bytes(s, t, a, sp_size, ulysses_size, recv_budget_tokens)
    norm_width = max(H, s.q_heads * s.head_dim if s.qk_norm else 0)
    if levers.recompute_norms:  # tiled: the input's gradient whole, the float32 temporaries for one tile of rows
        rows = min(t * (s.q_heads if s.qk_norm else 1), levers.mlp_tile_tokens)
        widest = max(H * min(t, levers.mlp_tile_tokens), rows * s.head_dim if s.qk_norm else 0)
        norm_backward = t * 2 * a * norm_width + NORM_BACKWARD_F32 * 4 * widest
    else:
        norm_backward = t * (a * H + NORM_BACKWARD_F32 * 4 * norm_width)  # the residual's gradient beside
    attn_kernel = (_tiled_attention_backward(s, a, t, levers.attention_tile_tokens, device)
                   if levers.tiled_attention and sp_size == 1 else t * _attention_backward(s, a, sp_size, device))
    attn_grads = t * (a * H + a * s.q_heads * s.head_dim) + attn_kernel
    # the phases of the last layer's backward, (working, sap) each: the MLP's (every tensor of the layer alive),
    # the second norm's (the MLP's and the norm's saved tensors consumed; its float32 input and temporaries),
    # the attention's (SAP's working set)
    b = min(levers.checkpoint_layers, s.layers) if ckpt else 1
    if ckpt:  # each block of checkpoint_layers keeps its input; the last block is recomputed in backward
        n_saved, per_saved = len(block_starts(s.layers, b)), t * a * H
        stack = n_saved * per_saved
        # the block's other layers' recomputed tensors, alive through its last layer's backward (module docstring)
        rest, rest_sap = (b - 1) * t * saved_layer, (b - 1) * sap_kept
        recomputed = rest + t * (saved_layer - parts["input"])  # the checkpoint holds the input already
        before_mlp = rest + t * (parts["norm1"] + parts["attention"])
        phases = [(recomputed + _layer_working(s, a, w, t, levers), sap_kept + rest_sap),
                  (before_mlp + norm_backward, sap_kept + rest_sap), (before_mlp + attn_grads, sap_work + rest_sap)]
    else:  # every layer's tensors alive; the final norm's backward, the last layer's MLP and attention
        n_saved, per_saved = s.layers, t * saved_layer + sap_kept
        stack = s.layers * (t * saved_layer + sap_kept)
        consumed = t * (parts["norm2"] + parts["mlp"]) + sap_kept
        phases = [(norm_backward, 0.0), (_layer_working(s, a, w, t, levers), 0.0),
                  (max(0.0, attn_grads - consumed), sap_work)]
    working, sap_layer = max(phases, key=sum)
    stack += t * 2 * a * s.head_dim  # rotary cos / sin
    # the final norm's saved tensors and output (the head's input): alive until the loss's backward is done
    final = t * (_norm_saved(H, a, levers.recompute_norms, True) + a * H)
    # offloaded: the checkpoints (or layers) of the last layers_kept_on_device layers stay on the device; they are
    # the first freed in backward, so none is left by the last layer's backward unless all are kept
    kept = (checkpoints_kept(s.layers, b, levers.layers_kept_on_device) if ckpt
            else min(levers.layers_kept_on_device, s.layers)) if offload_acts else 0
    device_stack = kept * per_saved if offload_acts else stack
    last_stack = (per_saved if kept == n_saved else 0.0) if offload_acts else stack - (n_saved - 1) * per_saved
    # the offloading slab holds each saved tensor at its bytes (rounded up to 512: .offload), the kept ones aside
    off = n_saved - kept
    offloaded = [per_saved] * off if ckpt else [t * v for v in parts.values()] * off
    acts = sum(slab_bytes(x) for x in offloaded + [t * 2 * a * s.head_dim, final])
    acts += 0 if ckpt else off * sap_kept
    host_terms = {"activations": acts if offload_acts else 0.0, **place.host}
    host = sum(host_terms.values())
    loss = _loss_bytes(s, t, a, w, levers)

    stages = {
        "loss": StepMemory(weights, 0.0, states, device_stack if offload_acts else stack + final, 0.0, loss, 0.0, host,
                           "loss", t),
        "layer": max((StepMemory(weights, head_grad, states, device_stack, working, 0.0, sap_layer, host, "layer", t),
                      StepMemory(weights, last_grads, states, last_stack, working, 0.0, sap_layer, host, "layer", t)),
                     key=lambda m: m.total),
        "optimizer": StepMemory(weights, grads_all, states + opt_tmp, 0.0, 0.0, 0.0, 0.0, host, "optimizer", t),
    }
    best = max(stages.values(), key=lambda m: m.total)
    return StepMemory(**{k: v for k, v in asdict(best).items() if k not in ("stages", "states", "host_terms")},
                      states=states, stages={k: m.total for k, m in stages.items()}, host_terms=host_terms)
