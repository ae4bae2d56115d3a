"""Tiny configurations of every causal-LM family of Transformers, for the model-zoo harness (``zoo.py``).

A family's tiny config starts from its config class defaults and is shrunk generically (:data:`GENERIC`:
hidden 64, 4 query / 2 KV heads of 16, vocab 96, small MLP / expert / MLA / mamba sizes, dropouts 0); the
number of layers is the smallest prefix of the default per-layer patterns (``layer_types`` and the like)
that still contains every kind of layer the family mixes, at least 2. :data:`OVERRIDES` holds the
family-specific settings on top; :data:`SKIP` the families that are not run, with the reason. Generic rules
besides: multi-head latent attention (a ``kv_lora_rank`` field) gets 4 KV heads (K/V are expanded to every query
head), encoder families run with ``is_decoder=True``, a causal LM over a wrapper config gets a shrunk
``text_config``, and encoder-decoder / multimodal causal LMs are not run.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

VOCAB = 96
MAX_PARAMS = 1_500_000  # a tiny model larger than this means the shrinking missed a size field
MAX_LAYERS = 8  # patterns that need more layers than this to show every kind are cut (see _pattern_layers)

# canonical name -> tiny value (applied when the config class has the field, also through attribute_map)
GENERIC: dict[str, Any] = {
    "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "use_cache": False,
    # mixture of experts
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "num_experts": 4, "num_local_experts": 4,
    "n_routed_experts": 4, "moe_num_experts": 4, "num_experts_per_tok": 2, "moe_topk": 2, "moe_k": 2,
    "n_shared_experts": 1, "num_shared_experts": 1, "moe_num_shared_experts": 1, "n_group": 1, "topk_group": 1,
    "num_expert_group": 1, "first_k_dense_replace": 1, "num_dense_layers": 1, "expert_ffn_hidden_size": 32,
    "moe_shared_expert_intermediate_size": 32, "shared_intermediate_size": 32, "dense_intermediate_size": 96,
    "shared_experts_intermediate_size": 32, "num_experts_per_token": 2, "output_router_logits": False,
    # multi-head latent attention
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "qk_head_dim": 16,
    # state-space / linear-attention mixers
    "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_n_heads": 8, "mamba_d_head": 16,
    "mamba_n_groups": 1, "mamba_chunk_size": 16, "mamba_d_ssm": 128, "mamba_dt_rank": 8, "ssm_state_size": 16,
    "mamba_num_heads": 8, "mamba_head_dim": 16, "state_size": 16, "time_step_rank": 8, "chunk_size": 16,
    "n_groups": 1, "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_head_dim": 16, "linear_num_heads": 4,
    # other names of the MLP / head sizes
    "dff": 96, "dim_ff": 96, "ffn_dim": 96, "ffn_hidden_size": 96, "dim_head": 16, "rotary_dim": 8,
    "zero_expert_num": 2, "o_lora_rank": 16, "o_groups": 2,
    # sparse-attention indexers; a top-k of 8 keys, fewer than the longer documents' prefixes (the default 2048 keeps
    # every key, so the selection would never be tested)
    "index_head_dim": 16, "index_n_heads": 2, "index_topk": 8,
    # multi-token-prediction heads are not part of the forward
    "num_nextn_predict_layers": 0,
}
TOKEN_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
DROPOUT_WORDS = ("dropout", "pdrop", "layerdrop", "jitter")

# family -> why it is not run (recorded in the table as "skipped: reason")
SKIP: dict[str, str] = {
    "blt": "byte-latent transformer (entropy patcher + hash n-gram embeddings over bytes), not a token decoder",
    "gemma4_assistant": "speculative-decoding drafter: needs the backbone model's hidden states as input",
    "fuyu": "multimodal: the causal LM embeds image patches (vision projection built into the model)",
    "git": "multimodal: the causal LM builds a CLIP image encoder",
    "phi4_multimodal": "multimodal: the causal LM builds image and audio encoders",
    "reformer": "LSH / chunked local attention with axial position embeddings over rows of one fixed length",
    "gemma4_unified_assistant": "speculative-decoding drafter: needs the backbone model's hidden states as input",
}
# multimodal wrapper configs whose text model is its own family (run there)
TEXT_TWINS = {"llama4": "llama4_text", "qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text",
              "dots3_note": "dots3_note_text", "qwen4_exp": "qwen4_exp_text"}
SKIP.update({k: f"multimodal wrapper config; its text model runs as `{v}`" for k, v in TEXT_TWINS.items()})

# family -> config arguments on top of the generic shrinking
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
OVERRIDES: dict[str, dict[str, Any]] = {
    "big_bird": {"attention_type": "original_full"},  # block-sparse needs rows of many 64-token blocks
    "cohere_compass_text": {"rope_parameters": {"full_attention": dict(_ROPE)}},  # default has no per-layer rope
    "dbrx": {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},  # the model reads both
             "ffn_config": {"ffn_hidden_size": 96, "moe_num_experts": 4, "moe_top_k": 2}},
    "dots3_note_text": {"swa_num_attention_heads": 4, "swa_num_key_value_heads": 4, "swa_q_lora_rank": 32,
                        "swa_kv_lora_rank": 16, "swa_head_dim": 16, "swa_qk_nope_head_dim": 8, "swa_v_head_dim": 16},
    # sliding windows of 8 tokens, shorter than the 30-, 19- and 15-token documents (the defaults, 4096 / 128, hide
    # them); Gemma 2 with a logit cap of 1 and initializer 0.1, where the cap bends the scores (the default cap of 50
    # is linear at a tiny model's scores); GPT-OSS's sinks are on by construction
    "gemma2": {"sliding_window": 8, "attn_logit_softcapping": 1.0, "initializer_range": 0.1},
    "gemma3_text": {"sliding_window": 8},
    "gpt_oss": {"sliding_window": 8},
    "mistral": {"sliding_window": 8},
    "qwen2": {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1},  # layer 1 windowed
    "gemma3n_text": {"vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 16, "laurel_rank": 8,
                     "num_kv_shared_layers": 0},  # KV sharing needs both layer kinds among producers and users
    "gemma4_text": {"vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 16, "global_head_dim": 32},
    "gemma4_unified_text": {"global_head_dim": 32},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},  # one global + one local layer
    # the default makes every layer Mamba2: one attention layer too (the family's checkpoints mix them), whose
    # position_ids the model never hands on (no rotary positions): a direct packed call relays its documents
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    # the defaults' first layers are all Mamba: one attention layer too, as in the families' checkpoints
    "bamba": {"num_hidden_layers": 2, "attn_layer_indices": [1]},
    "jamba": {"num_hidden_layers": 2, "attn_layer_period": 2, "attn_layer_offset": 1},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},  # default None: one conv and one attention layer
    "lfm2": {"num_hidden_layers": 2, "full_attn_idxs": [1], "layer_types": ["conv", "full_attention"]},  # layer 0 a short causal convolution (the default makes every layer attention)
    "inkling_text": {"unpadded_vocab_size": VOCAB, "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
                     "swa_head_dim": 16, "rel_extent": 64,
                     "log_scaling_n_floor": 4},  # the full layers' log scale from the 4th token on (default: off)
    "inkling2_text": {"unpadded_vocab_size": VOCAB, "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
                      "swa_head_dim": 16, "rel_extent": 64},
    "inkling2_loop_text": {"unpadded_vocab_size": VOCAB, "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
                           "swa_head_dim": 16, "rel_extent": 64, "n_layers_per_attn_res_block": 2,
                           "loop_layer_index_start": 2, "loop_layer_index_end": 4, "loop_num_passes": 2,
                           "loop_gate_rank": 8},
    # chunked attention: the 30- and 19-token documents span several 16-token chunks (the default, 8192, hides it)
    "llama4_text": {"attention_chunk_size": 16},
    "longcat_flash": {"num_layers": 2, "head_dim": 8},  # head_dim is the rotary (qk_rope) part
    "mamba2": {"num_heads": 8, "head_dim": 16},  # num_heads * head_dim == expand * hidden
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
                       "indexer_compress_ratio": 4, "hc_lowrank": 16, "ple_layer_ids": [1, 3], "ple_embed_dim": 32,
                       "heads_per_ngram": 2, "ngram_vocab_size_base": 61, "make_ngram_vocab_size_divisible_by": 8,
                       "eos_token_id": 5},
    "roc_bert": {"shape_vocab_size": 32, "pronunciation_vocab_size": 32, "shape_embed_dim": 16,
                 "pronunciation_embed_dim": 16},
    # layers 2 and 4 hybrid: the shared transformer block is tied between at least two layers
    "zamba": {"num_hidden_layers": 5, "attn_layer_period": 2, "attn_layer_offset": 1, "layers_block_type": None},
    "zaya": {"num_experts_per_tok": 1},  # the only value it supports
}


class NotBuildable(Exception):
    """A family that the harness does not run (skipped by design, or no tiny config could be built)."""


def families() -> list[str]:
    """Every model type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, sorted.

    Returns:
        the family names (``config.model_type``).
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _fields(cls: type) -> dict[str, Any]:
    """Dataclass fields of a config class with their defaults (``MISSING`` when none)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = f.default_factory()  # type: ignore[misc]
        else:
            out[f.name] = dataclasses.MISSING
    return out


def _pattern_layers(default: Any, num_layers: int, names: list[str]) -> tuple[int, dict[str, Any]]:
    """Smallest layer count whose prefix of every per-layer pattern holds all its kinds, and the cut patterns.

    Args:
        default: the family's default config (patterns computed for ``num_layers`` layers).
        num_layers: its number of layers.
        names: the config fields to look at.

    Returns:
        ``(n, {field: pattern[:n]})`` with ``2 <= n <= min(num_layers, MAX_LAYERS)`` (``n = 2`` without patterns).
    """
    patterns = {}
    for name in names:
        try:
            value = getattr(default, name, None)
        except Exception:  # noqa: BLE001 - per-layer (heterogeneous) attributes refuse global reads
            continue
        if isinstance(value, (list, tuple, str)) and len(value) == num_layers and num_layers > 1 \
                and all(isinstance(x, (str, int, bool)) for x in value) and not name.endswith("_token_id"):
            patterns[name] = value
    n = 2
    for value in patterns.values():
        kinds = set(value)
        need = next(i for i in range(1, len(value) + 1) if set(value[:i]) == kinds)
        n = max(n, need)
    n = min(n, MAX_LAYERS, max(num_layers, 1))
    cut = {}
    for k, v in patterns.items():
        if k in GENERIC and not isinstance(v, str):  # a per-layer size (e.g. intermediate_size): the tiny one
            cut[k] = [GENERIC[k]] * n
        else:
            cut[k] = v[:n] if isinstance(v, str) else list(v[:n])
    return n, cut


def config_kwargs(family: str) -> dict[str, Any]:
    """The constructor arguments of a family's tiny config.

    Args:
        family: a model type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``.

    Returns:
        keyword arguments for the family's config class.

    Raises:
        NotBuildable: the family is skipped, or its default config cannot be built.
    """
    from transformers import CONFIG_MAPPING

    if family in SKIP:
        raise NotBuildable(SKIP[family])
    try:
        cls = CONFIG_MAPPING[family]
        default = cls()
    except Exception as e:  # noqa: BLE001 - any failure means "cannot be built"
        raise NotBuildable(f"default config fails: {type(e).__name__}: {_first_line(e)}") from e
    if getattr(default, "is_encoder_decoder", False):
        raise NotBuildable("encoder-decoder (the causal LM is the decoder half of a seq2seq model)")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family].endswith("ForConditionalGeneration"):
        raise NotBuildable("multimodal (its causal LM class is a ForConditionalGeneration model)")
    kwargs = _shrink(cls, default, OVERRIDES.get(family, {}))
    text_cls = (getattr(cls, "sub_configs", None) or {}).get("text_config")
    if text_cls is not None and getattr(text_cls, "model_type", "") and "text_config" not in kwargs:
        # a causal LM over a wrapper config (e.g. mllama, emu3) builds its text model from text_config
        text_default = text_cls()
        kwargs["text_config"] = _shrink(text_cls, text_default, OVERRIDES.get(text_cls.model_type, {}))
    return kwargs


def _shrink(cls: type, default: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments of ``cls`` shrunk generically (see the module docstring), then ``overrides``."""
    fields = _fields(cls)
    amap = dict(getattr(cls, "attribute_map", {}) or {})
    kwargs: dict[str, Any] = {}
    for name, value in GENERIC.items():
        aliases = [name, amap.get(name)] + [k for k, v in amap.items() if v == name]
        real = next((a for a in aliases if a in fields), None)
        if real is not None:
            kwargs[real] = value
    if "is_decoder" in fields:  # encoder families: their causal-LM head runs the stack as a causal decoder
        kwargs["is_decoder"] = True
    if "kv_lora_rank" in fields:  # multi-head latent attention expands K/V to every query head
        kwargs[next(a for a in ("num_key_value_heads", amap.get("num_key_value_heads")) if a)] = 4
    for name, value in TOKEN_IDS.items():
        if name in fields and fields[name] not in (None, dataclasses.MISSING):
            kwargs[name] = [value] if isinstance(fields[name], list) else value
    for name, value in fields.items():
        if any(w in name for w in DROPOUT_WORDS) and isinstance(value, (int, float)) and not isinstance(value, bool):
            kwargs[name] = 0.0
    layers_field = amap.get("num_hidden_layers", "num_hidden_layers")
    num_layers = int(getattr(default, "num_hidden_layers", 2) or 2)
    n, patterns = _pattern_layers(default, num_layers, [k for k in fields if k != layers_field])
    if layers_field in fields:
        kwargs[layers_field] = n
    kwargs.update(patterns)
    kwargs.update(overrides)
    return kwargs


def tiny_config(family: str) -> Any:
    """A family's tiny config (see the module docstring).

    Args:
        family: a model type of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``.

    Returns:
        the config instance (``use_cache=False``, dropouts 0).

    Raises:
        NotBuildable: skipped, or the config class refuses the tiny arguments.
    """
    from transformers import CONFIG_MAPPING

    kwargs = config_kwargs(family)
    try:
        config = CONFIG_MAPPING[family](**kwargs)
    except Exception as e:  # noqa: BLE001
        raise NotBuildable(f"tiny config refused: {type(e).__name__}: {_first_line(e)}") from e
    with torch.device("meta"):  # count the parameters without allocating them
        from transformers import AutoModelForCausalLM

        try:
            size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        except Exception as e:  # noqa: BLE001
            raise NotBuildable(f"model refuses the tiny config: {type(e).__name__}: {_first_line(e)}") from e
    if size > MAX_PARAMS:
        raise NotBuildable(f"tiny config still has {size:,} parameters (a size field is not shrunk)")
    return config


def _first_line(e: BaseException, limit: int = 160) -> str:
    """The first non-empty line of an exception's message, cut to ``limit`` characters."""
    lines = [x for x in str(e).strip().splitlines() if x.strip()]
    return (lines[0] if lines else "")[:limit]


def num_layers(config: Any) -> int:
    """The config's number of layers (``num_hidden_layers`` or its alias; a wrapper's text config)."""
    text = getattr(config, "text_config", None)
    return int(getattr(text if text is not None else config, "num_hidden_layers", 0) or 0)


# family -> what a user has to call on the built model before its first forward
POST_BUILD: dict[str, str] = {"xmod": "set_default_language('en_XX')"}


def build_model(config: Any, attn: str, dtype: torch.dtype = torch.float32, seed: int = 0,
                state_dict: dict[str, torch.Tensor] | None = None, draw: torch.dtype = torch.float32) -> torch.nn.Module:
    """The family's causal LM with random weights (seeded) or the given ``state_dict``, in train mode.

    Args:
        config: a tiny config from :func:`tiny_config`.
        attn: ``attn_implementation`` (``"hsap"``, ``"eager"``, ``"sdpa"``).
        dtype: parameter dtype (weights are drawn in ``draw``, float32 by default, then cast).
        seed: ``torch.manual_seed`` before the random init.
        state_dict: weights to load instead (strict), e.g. the reference's.
        draw: the dtype the model is built in (what its init computes tables such as decay factors in).

    Returns:
        the model, ``.train()`` (all dropouts are 0); float64 models use the eager (loop) MoE experts.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    extra = {"experts_implementation": "eager"} if dtype == torch.float64 else {}  # grouped_mm has no float64
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=draw, **extra)
    model.to(dtype)
    if state_dict is not None:  # after the cast: a float64 state (a hybrid's) keeps its precision in float64 runs
        model.load_state_dict(state_dict, strict=True)
    if config.model_type == "xmod":  # see POST_BUILD
        model.set_default_language("en_XX")
    return model.to(dtype).train()
