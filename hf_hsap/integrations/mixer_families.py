"""Which hybrid families hf_hsap runs exactly, and how a config shows recurrent token mixers (data only).

A family joins :data:`MIXER_FAMILIES` after its exactness run in the zoo (``python scripts/model_zoo.py``) and
``tests/model/test_zoo.py``; its recurrent layers are prepared by :mod:`.mixer_hooks`.
"""
from __future__ import annotations

__all__ = ["FAMILY_REASONS", "MIXER_CLASS_WORDS", "MIXER_FAMILIES", "MIXER_FIELDS", "NON_MIXING_LAYER_TYPES", "NO_HOOK"]

# `config.layer_types` entries of layers that mix no tokens (Nemotron-H's MLP-only layers).
NON_MIXING_LAYER_TYPES = frozenset({"mlp", "moe"})
# Families whose recurrent layers all run through the kernel hooks hf_hsap replaces (`mixer_hooks`), exact against
# their documents run alone (the zoo: fp32 / fp64, SP 1 / 2 / 4, U 1 / 2; tests/model/test_zoo.py).
MIXER_FAMILIES = frozenset({
    "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "olmo_hybrid", "lara_mini", "qwen4_exp_text",  # gated delta rule
    "kimi_linear", "bailing_hybrid", "glm5_next_text",  # KDA
    "nemotron_h", "bamba", "granitemoehybrid", "falcon_h1", "zamba2", "mamba2",  # Mamba2 (SSD)
    "zamba", "jamba", "falcon_mamba", "mamba",  # Mamba
    "lfm2", "lfm2_moe", "lfm3",  # short convolutions
    "minimax",  # lightning attention (no kernel hook: the layer's forward replaced per instance)
    "inkling_text", "inkling2_text", "inkling2_loop_text",  # short (+ dynamic) convolutions; their attention's
    # per-query relative position bias: integrations/relative_bias.py
})
# Why a hybrid family's recurrent layers have no kernel hook (what its refusal says).
NO_HOOK = {
    "recurrent_gemma": "the recurrent block's convolution and RG-LRU run in its forward",
    "zaya": "its layers' token mixing runs in their forward",
}
# Hybrid families refused for their attention, not their recurrent layers.
FAMILY_REASONS: dict[str, str] = {}
# Config fields that only models with non-attention token mixers have (Mamba / SSM, convolutions, linear
# attention, recurrent blocks), for the families whose config has no `layer_types`.
MIXER_FIELDS = ("mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_n_heads", "mamba_d_ssm", "ssm_state_size",
                 "state_size", "conv_L_cache", "conv_kernel", "d_conv", "linear_conv_kernel_dim", "linear_num_key_heads",
                 "attn_layer_indices", "attn_layer_period", "layers_block_type", "hybrid_override_pattern",
                 "block_types", "lru_width", "time_step_rank")
# Module class-name fragments of non-attention token mixers (what `check_model` looks for in the modules).
MIXER_CLASS_WORDS = ("Mamba", "Mixer", "GatedDeltaNet", "DeltaNet", "LinearAttention", "ShortConv", "Lightning",
                      "Recurrent", "RGLRU", "SSM", "Rwkv", "RWKV", "XLSTM", "Mlstm", "Slstm")
