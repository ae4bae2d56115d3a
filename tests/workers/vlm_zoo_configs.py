"""Tiny configurations of every vision-language family of Transformers, for the multimodal zoo (``vlm_zoo.py``,
``scripts/vlm_zoo.py``; the documents are ``vlm_zoo_docs.py``).

Families: every model type of ``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES``, plus Mllama (its own mapping).
The five families of :data:`hf_hsap.examples.vlm.TINY_VLMS` use :func:`hf_hsap.examples.vlm.tiny_vlm_config`.
Every other family starts from its config class defaults: the text
config is shrunk as the text zoo does (``zoo_configs``: hidden 64, 4 query / 2 KV heads of 16, vocab 96), every
other sub-config (vision tower, Q-Former, perceiver, audio, ...) by :data:`VISION` (hidden 32, 2 layers, 2 heads,
8-pixel images of 2-pixel patches), token ids of the wrapper config go to the top of the vocabulary, and
:data:`OVERRIDES` adds what a family needs on top.
"""
from __future__ import annotations

from typing import Any

import torch

from hf_hsap.examples import TINY_VLMS, tiny_vlm_config
from workers import zoo_configs as ZC
from workers.zoo_configs import NotBuildable

__all__ = ["NotBuildable", "audio_families", "build_model", "families", "tiny_config", "vision_families"]

EXTRA_FAMILIES = ("mllama",)  # vision-language families outside MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
# the auto mappings an audio-language model (a causal LM over an audio encoder's rows at placeholders) is listed in
AUDIO_MAPPINGS = ("MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
                  "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_PRETRAINING_MAPPING_NAMES")
MAX_PARAMS = 3_000_000  # a tiny model larger than this means the shrinking missed a size field
# canonical name -> tiny value for every sub-config other than the text model (vision, Q-Former, audio, ...)
VISION: dict[str, Any] = {
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "depth": 2, "num_attention_heads": 2,
    "num_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "embed_dim": 32, "image_size": 8, "patch_size": 2,
    "mlp_dim": 48, "projection_dim": 32, "num_position_embeddings": 16, "max_position_embeddings": 256,
    "num_patches": 16, "position_embedding_size": 64, "patch_embed_hidden_size": 32, "d_ff": 48, "d_kv": 16,
    "seq_len": 64, "output_channels": 16, "encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 48,
    "d_model": 32, "num_mel_bins": 16, "vocab_size": 32, "num_local_experts": 4, "num_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "window_size": 4, "mlp_ratio": 2,
    "num_query_tokens": 4, "cross_attention_frequency": 1, "resolution": 8, "base_channels": 8, "latent_channels": 4,
    "codebook_size": 32, "num_embeddings": 32, "num_res_blocks": 1, "channel_multiplier": [1, 2],
    "vision_output_dim": 32, "projector_input_dim": 64, "projector_output_dim": 64, "max_vit_seq_len": 256,
    "max_image_size": 16, "min_image_size": 8, "img_max_token_num": 64, "pos_emb_height": 8, "pos_emb_width": 8,
    "post_conv_in_channels": 16, "post_conv_mid_channels": 16, "post_conv_out_channels": 32,
    "decoder_hidden_size": 32, "downsample_hidden_size": 16, "conv_chunksize": 64, "n_window": 4,
    "max_source_positions": 64, "num_groups": 2, "codebook_dim": 32,
}
# top-level fields of the wrapper config: widths between the towers and the text model
TOP: dict[str, Any] = {"projector_hidden_size": 64, "alignment_intermediate_size": 64, "mm_tokens_per_image": 4,
                       "image_seq_length": 16, "num_query_tokens": 4, "vision_feature_layer": -1,
                       "vision_soft_tokens_per_image": 16, "projector_intermediate_size": 64}
TOP_TEXT_WIDTH = ("projection_dim",)  # top-level fields that are the text model's width (PaliGemma)
_TEXT_WIDTH = ("out_hidden_size", "text_hidden_size", "adapter_out_dim", "output_dim")
_VISION_WIDTH = ("adapter_in_dim", "adapter_input_size")  # a sub-model's own width, repeated
_RANDOM_WORDS = (*ZC.DROPOUT_WORDS, "drop_path")  # dropout and stochastic depth: off (the checks are deterministic)
SPECIAL_SUFFIXES = ("_token_id", "_token_index")
_PLAIN_TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "_pad_token_id")

ANYRES_PINPOINTS = [[8, 8], [8, 16], [16, 8], [16, 16]]
# family -> config arguments on top of the generic shrinking (``text_config`` / ``vision_config`` dicts merge)
OVERRIDES: dict[str, dict[str, Any]] = {
    "aria": {"projector_patch_to_query_dict": {16: 4}},  # 16 patches of a tiny image -> 4 queries
    # Apertus 1.5's VQ codes (embedded into its placeholders): 32 image codes from id 16, then 32 audio codes
    "apertus1p5": {"image_token_offset": 16, "audio_token_offset": 48,
                   "vision_config": {"base_channels": 32},  # its VQ encoder's group norms have 32 groups
                   # WavTokenizer: 4 filters doubled by each of 2 down-samplings, one LSTM layer
                   "audio_config": {"num_filters": 4, "upsampling_ratios": [2, 2], "num_lstm_layers": 1}},
    # Florence-2: a BART encoder-decoder (refused as one) of 1 + 1 layers; its DaViT stages 1 block each
    "florence2": {"text_config": {"encoder_layers": 1, "decoder_layers": 1, "encoder_ffn_dim": 64,
                                  "decoder_ffn_dim": 64, "decoder_attention_heads": 4},
                  "vision_config": {"depths": [1, 1, 1, 1]}},
    "gemma4": {"vision_config": {"pooling_kernel_size": 2}},  # 4x4 patches -> 4 soft tokens
    # Gemma 4 unified's encoder-free embedder: 4-pixel model patches (2x2 of 2 pixels) into 32 wide rows, a 16-entry
    # position table per axis; its audio frames of 16 samples
    "gemma4_unified": {"vision_config": {"pooling_kernel_size": 2, "mm_embed_dim": 32, "output_proj_dims": 32,
                                         "mm_posemb_size": 16}, "audio_config": {"audio_embed_dim": 16}},
    # DeepSeek-OCR 2's MoE text model names each layer's MLP (its default, None, builds nothing)
    # and its SAM's two stride-2 convolutions end at the 32-wide encoder's width
    "deepseek_ocr2": {"text_config": {"mlp_layer_types": ["dense", "sparse"]},
                      "vision_config": {"sam_config": {"downsample_channels": [16, 32]}}},
    "unlimited_ocr": {"vision_config": {"sam_config": {"downsample_channels": [16, 32]}}},  # its SAM: the same
    # Granite 4 Vision: its Q-Former has a head per 64 of the tower's width (so 64 wide), windows of 4x4 patches
    # pooled to 2x2 queries; any-resolution tiles of 8 pixels
    "granite4_vision": {"deepstack_layer_map": [[1, 1]], "spatial_target_layers": [0, 1, 0, 1],
                        "vision_config": {"hidden_size": 64}, "downsample_rate": "2/4",
                        "image_grid_pinpoints": ANYRES_PINPOINTS},
    "inkling2": {"vision_config": {"posemb_grid_size": 4}},
    "inkling2_loop": {"vision_config": {"posemb_grid_size": 4}},
    "llama4": {"vision_config": {"intermediate_size": 128, "projector_input_dim": 64, "projector_output_dim": 64,
                                 "vision_output_dim": 64}},  # the pixel shuffle (ratio 0.5) makes 4x the width
    # any-resolution: 1 to 4 tiles of 8 pixels (plus the base image) by the image's size (vlm_zoo_docs.SHAPES)
    "llava_next": {"image_grid_pinpoints": ANYRES_PINPOINTS},
    "llava_next_video": {"image_grid_pinpoints": ANYRES_PINPOINTS},
    "llava_onevision": {"image_grid_pinpoints": ANYRES_PINPOINTS},
    "lighton_ocr": {"vision_config": {"image_size": 32}},  # Pixtral: images up to 32 pixels a side
    "kosmos-2.5": {"latent_query_num": 16},  # 16 rows per image (2048 by default)
    "mistral3": {"vision_config": {"image_size": 32}},
    # Idefics 3 tiles of 16 pixels: 16 placeholders each (4 of 8 pixels), so that SP splits one
    "granite_docling": {"vision_config": {"image_size": 16, "scale_factor": 2}},
    "idefics3": {"vision_config": {"image_size": 16}},
    "smolvlm": {"vision_config": {"image_size": 16}},
    "mllama": {"vision_config": {"image_size": 8, "num_global_layers": 1, "intermediate_layers_indices": [0],
                                 "vision_output_dim": 64}, "text_config": {"cross_attention_layers": [1]}},
    "molmo2": {"vision_config": {"image_size": [8, 8]}, "adapter_config": {"vision_feature_layer": [-1, -2]},
               "image_patch_id": 150},  # a placeholder inside the tiny embedding table (96 + 128 extra rows)
    # RADIO's position table covers images up to max_img_size pixels a side; the projector's input is the tower's
    # width (vision_hidden_size) times the 2x2 pixel shuffle
    "nemotron_h_omni": {"vision_config": {"video_temporal_patch_size": 2, "max_img_size": 32},
                        "vision_hidden_size": 32},
    # Muse Spark: the adapter's input is the 32-wide tower after its 2x2 merge, its experts' own width; its waveform
    # pyramid 4 stages of 16
    "muse_spark": {"out_hidden_size": 128, "text_config": {"moe_hidden_size": 32},
                   "audio_config": {"hidden_sizes": [16] * 4, "depths": [1] * 4, "patch_sizes": [2] * 4}},
    # pools of 4 tokens, the best 2 pools and the incomplete tail kept (a selection inside the documents), and a layer
    # that reuses the previous layer's top-k ("shared")
    "glm5_next": {"text_config": {"qk_rope_head_dim": 0, "index_topk": 8, "index_kpool": 4,
                                  "layer_types": ["linear_attention", "linear_attention", "full_attention",
                                                  "full_attention"],
                                  "indexer_types": ["full", "full", "full", "shared"]}},
    "janus": {"vq_config": {"base_channels": 32},
              "vision_config": {"projection_dim": 64}},  # its aligner's output is the text model's width
    "kimi_k25": {"projection_hidden_size": 32},  # the projector's norm is over the tower's width
    "fuyu": {"patch_size": 2},  # its linear patch embedding's input is patch_size ** 2 * channels
    "muse_glimmer": {"out_hidden_size": 128},  # the merged 2x2 patches of the 32-wide tower
    # MiniCPM-V: the ViT window merger after the first of the 2 layers (its default, 6, is past them)
    "minicpm_ocr": {"insert_layer_id": 0},
    "minicpmv4_6": {"insert_layer_id": 0},
    "minicpmv4_7": {"insert_layer_id": 0,  # and its canvas rope index's markers (<image>, </image>, <slice>, ...)
                    "image_start_id": 90, "image_end_id": 89, "slice_start_id": 88, "slice_end_id": 87,
                    "newline_id": 86},
    "step3p7": {"text_config": {"sliding_window": 8}},
    # ERNIE-4.5-VL's rotary sections are (h, w, t), h == w (it interleaves them): 3 + 3 + 2 = half of the tiny head
    "ernie4_5_vl_moe": {"text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0,
                                                            "mrope_section": [3, 3, 2]}}},
    # the omni thinkers' rope index finds each image after its vision start token, which their checkpoints' configs
    # name (vision_start_token_id) and the config class's defaults leave out
    "qwen2_5_omni_thinker": {"vision_start_token_id": 89, "vision_end_token_id": 88},
    "qwen3_omni_moe_thinker": {"vision_start_token_id": 90, "vision_end_token_id": 89,
                               "audio_config": {"n_window": 50}},
    # audio-text: Qwen3's audio tower counts 13 rows per full chunk of 2 * n_window frames (its default, 50), and
    # Voxtral / GLM-ASR merge 4 encoder frames into one projector input (intermediate_size = 4 x the tower's width)
    "qwen3_asr": {"audio_config": {"n_window": 50}},
    "voxtral": {"audio_config": {"intermediate_size": 128}},
    "voxtral_realtime": {"audio_config": {"intermediate_size": 128}},
    "glmasr": {"audio_config": {"intermediate_size": 128}},
    "fun_asr_nano": {"adaptor_config": {"hidden_size": 64, "intermediate_size": 16}},  # its output: the text width
    # Granite Speech's Q-Former projector cross-attends to the conformer's rows (hidden_dim 32)
    "granite_speech": {"projector_config": {"encoder_hidden_size": 32}},
    "granite_speech_plus": {"projector_config": {"encoder_hidden_size": 32}},
    # the last of its 32 tiny classes; its diarization head reads the 32-wide diarization encoder
    "nemo_speechlm": {"word_timestamp_config": {"blank_token_id": 31},
                      "audio_config": {"diarization_config": {"head_config": {"audio_hidden_size": 32}}}},
    "omniasr": {"audio_config": {"conv_dim": [32] * 7}},  # its raw-audio feature encoder's channels
    # VibeVoice's two raw-audio tokenizer encoders: one block per stage, 8 filters (doubled per stage)
    "vibevoice_asr": {f"{kind}_tokenizer_encoder_config": {"depths": [1] * 7, "num_filters": 4}
                      for kind in ("semantic", "acoustic")},
}
# family -> sub-configs whose dtype the model reads to cast its inputs (Nemotron-H Omni's RADIO tower casts the pixels
# to vision_config.torch_dtype), set to the model's dtype after it is built
CONFIG_DTYPE: dict[str, tuple[str, ...]] = {"nemotron_h_omni": ("vision_config",)}
# families whose tiny model is not built, with the reason
_EARLY_FUSION = ("early fusion: images are VQ codes mapped into the text vocabulary by the tokenizer's "
                 "vocabulary_map (no image placeholder to fill)")
_ACTION = ("vision-language-action policy: a PaliGemma inside a flow-matching action expert (its forward takes robot "
           "states, noised actions and a time step, not a language-model row)")
SKIP: dict[str, str] = {
    "chameleon": _EARLY_FUSION, "emu3": _EARLY_FUSION, "pi0": _ACTION, "pi05": _ACTION,
    "t5gemma2": "encoder-decoder: its text model is a seq2seq decoder over an encoder's images and text, not a causal "
                "LM over packed rows",
}


def families() -> list[str]:
    """Every family of the zoo: :func:`vision_families`, then :func:`audio_families`."""
    return vision_families() + audio_families()


def vision_families() -> list[str]:
    """Every vision-language model type: ``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES`` and
    :data:`EXTRA_FAMILIES`, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return sorted(set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES) | set(EXTRA_FAMILIES))


def _audio_class_name(family: str) -> str | None:
    """The class of ``family`` in the first of :data:`AUDIO_MAPPINGS` that lists it whose model class has
    ``get_audio_features`` or an inline audio encoder (an audio encoder whose rows fill placeholders), or
    ``None``."""
    import transformers
    from transformers.models.auto import modeling_auto

    for mapping in AUDIO_MAPPINGS:
        name = getattr(modeling_auto, mapping, {}).get(family)
        try:
            cls = getattr(transformers, name) if isinstance(name, str) else None
        except (ImportError, AttributeError):  # a class whose backend is not installed
            cls = None
        if cls is not None and (callable(getattr(cls, "get_audio_features", None)) or _inline_audio(family, cls)):
            return name
    return None


def _inline_audio(family: str, cls: type) -> bool:
    """Whether ``family``'s model encodes its audio inline (Qwen2-Audio: no ``get_audio_features``): its config has
    an ``audio_config`` and an audio placeholder token, and its forward takes ``input_features``."""
    import inspect

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[family]()
    placeholder = any(getattr(config, n, None) is not None for n in ("audio_token_id", "audio_token_index"))
    return placeholder and getattr(config, "audio_config", None) is not None and \
        "input_features" in inspect.signature(cls.forward).parameters


def audio_families() -> list[str]:
    """Every audio-language model type of the installed Transformers, by rule: listed in one of
    :data:`AUDIO_MAPPINGS` with a model class that has ``get_audio_features`` (a causal LM taking an audio encoder's
    rows at its placeholders), and not a vision family (the omni thinkers' audio runs with their images). Speech
    encoder-decoders (Whisper, Speech2Text, SpeechT5, ...) have no ``get_audio_features``: their text is generated by
    a decoder cross-attending to the encoded audio, which is outside this set. Sorted."""
    from transformers.models.auto import modeling_auto

    vision = set(vision_families())
    names = {f for m in AUDIO_MAPPINGS for f in getattr(modeling_auto, m, {})}
    return sorted(f for f in names - vision if _audio_class_name(f) is not None)


def first_line(e: BaseException) -> str:
    """``"Type: first line of the message"`` of an exception (a validation error's cause after its colon)."""
    text = f"{type(e).__name__}: {ZC._first_line(e)}"
    if text.endswith(":") and e.__cause__ is not None:
        text += f" {type(e.__cause__).__name__}: {ZC._first_line(e.__cause__)}"
    return text.rstrip(":")


def _shrink_sub(cls: type, default: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments of a non-text sub-config, shrunk by :data:`VISION` (also through ``attribute_map``),
    per-layer patterns cut like the text zoo's, layer-index lists inside the 2 layers, dropouts 0."""
    fields = ZC._fields(cls)
    amap = dict(getattr(cls, "attribute_map", {}) or {})
    kwargs: dict[str, Any] = {}
    for name, value in VISION.items():
        aliases = [name, amap.get(name)] + [k for k, v in amap.items() if v == name]
        real = next((a for a in aliases if a in fields), None)
        if real is not None and not isinstance(fields[real], (dict, bool)):
            default_value = fields[real]
            if isinstance(default_value, (list, tuple)) and not isinstance(value, list):
                value = [value] * len(default_value)  # per-stage sizes (e.g. Florence's embed_dim)
            kwargs[real] = value
    for name, value in fields.items():
        if any(w in name for w in _RANDOM_WORDS) and isinstance(value, (int, float)) and not isinstance(value, bool):
            kwargs[name] = 0.0
        if name.endswith(("_indexes", "_indices")) and isinstance(value, (list, tuple)) and value:
            kwargs[name] = [1] if "deepstack" not in name else [0]
    layers_field = next((f for f in ("num_hidden_layers", "depth", "encoder_layers") if f in fields), None)
    num_layers = int(getattr(default, layers_field, 2) or 2) if layers_field else 2
    n, patterns = ZC._pattern_layers(default, num_layers, [k for k in fields if k != layers_field])
    if layers_field:
        kwargs[layers_field] = n
    kwargs.update({k: v for k, v in patterns.items() if k not in VISION})
    overrides = dict(overrides)  # the family's OVERRIDES entry stays as it is (tiny_config is called again)
    for sub in getattr(cls, "sub_configs", None) or {}:  # a tower of towers (DeepSeek-OCR 2's SAM + encoder)
        value = getattr(default, sub, None)
        if value is not None and hasattr(value, "to_dict"):
            kwargs[sub] = {"model_type": value.model_type,
                           **_shrink_sub(type(value), value, dict(overrides.pop(sub, {})))}
    kwargs.update(overrides)
    return _fit_types(fields, kwargs, default)


def _fit_types(fields: dict[str, Any], kwargs: dict[str, Any], instance: Any = None) -> dict[str, Any]:
    """Tiny values in the types of the defaults (the field's, else the default instance's): a per-entry list where
    the default is one (``[v] * len``), a float where it is a float."""
    for name, value in list(kwargs.items()):
        default = fields.get(name)
        if default is None and instance is not None:
            default = getattr(instance, name, None)
        if isinstance(default, (list, tuple)) and default and isinstance(value, int) and not isinstance(value, bool) \
                and all(isinstance(x, int) for x in default):
            kwargs[name] = [value] * len(default)
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            kwargs[name] = float(value)
    return kwargs


def _mrope(text: dict[str, Any], default: Any, grid: bool) -> None:
    """Multimodal rotary sections for the tiny rotary dimension (they must sum to half of it), where the default
    has them or the vision tower is Qwen-VL-like (``grid``: the model's own default sections are for its width)."""
    rope = getattr(default, "rope_parameters", None)
    if not isinstance(rope, dict) or not (grid or isinstance(rope.get("mrope_section"), list)):
        return
    head = int(text.get("qk_rope_head_dim") or text.get("head_dim") or 16)
    factor = rope.get("partial_rotary_factor") or getattr(default, "partial_rotary_factor", None) or 1.0
    n = int(head * float(factor)) // 2
    text["rope_parameters"] = {**rope, "mrope_section": [n - 2 * (n // 4), n // 4, n // 4]}


def _special_ids(config_fields: dict[str, Any], vocab: int) -> dict[str, Any]:
    """Every special token id of the wrapper config, moved to the top of the vocabulary (image first)."""
    names = [n for n, v in config_fields.items() if n.endswith(SPECIAL_SUFFIXES) and n not in _PLAIN_TOKENS
             and (v is None or isinstance(v, int)) and not isinstance(v, bool)]
    names.sort(key=lambda n: (not n.startswith("image_token"), not n.startswith("video_token"), n))
    out: dict[str, Any] = {n: vocab - 1 - i for i, n in enumerate(names)}
    for n, v in config_fields.items():
        if n.endswith("_token_ids") and isinstance(v, list) and v:  # e.g. Ovis's visual indicator tokens
            out[n] = [vocab - 1 - len(out) - i for i in range(len(v))]
    for n in _PLAIN_TOKENS:
        if config_fields.get(n) is not None:
            out[n] = {"bos_token_id": 1, "eos_token_id": 2}.get(n, 0)
    return out


def config_kwargs(family: str) -> dict[str, Any]:
    """The constructor arguments of a family's tiny config (see the module docstring).

    Raises:
        NotBuildable: the default config cannot be built.
    """
    from transformers import CONFIG_MAPPING

    if family in SKIP:
        raise NotBuildable(SKIP[family])
    try:
        cls = CONFIG_MAPPING[family]
        default = cls()
    except Exception as e:  # noqa: BLE001
        raise NotBuildable(f"default config fails: {first_line(e)}") from e
    overrides = dict(OVERRIDES.get(family, {}))
    kwargs: dict[str, Any] = {}
    fields = ZC._fields(cls)
    sub_fields: dict[str, dict[str, Any]] = {}
    for sub, sub_cls in (getattr(cls, "sub_configs", None) or {}).items():
        value = getattr(default, sub, None)
        if value is None and getattr(sub_cls, "model_type", ""):  # a tower the default leaves out (Gemma 4)
            value = sub_cls()
        if value is None or not hasattr(value, "to_dict"):
            continue
        real_cls = type(value)
        sub_fields[sub] = ZC._fields(real_cls)
        extra = overrides.pop(sub, {})
        if sub == "text_config":
            kw = _fit_types(ZC._fields(real_cls), ZC._shrink(real_cls, value, {}), value)
            vision = getattr(default, "vision_config", None)
            _mrope(kw, value, vision is not None and hasattr(vision, "spatial_merge_size"))
            kw.update({n: 0.0 for n, v in ZC._fields(real_cls).items() if "drop_path" in n and isinstance(v, float)})
            kw.update({**ZC.OVERRIDES.get(value.model_type, {}), **extra})
            kw.pop("is_decoder", None)
        else:
            kw = _shrink_sub(real_cls, value, extra)
        kwargs[sub] = {"model_type": value.model_type, **kw}
    text = kwargs.get("text_config", {})
    hidden = int(text.get("hidden_size", 64))
    for sub, kw in kwargs.items():  # what a sub-model hands the text model is the text model's width
        if sub != "text_config" and isinstance(kw, dict):
            for name in _TEXT_WIDTH:
                if name in sub_fields[sub]:
                    kw[name] = hidden
            for name in _VISION_WIDTH:
                if name in sub_fields[sub]:
                    kw[name] = kw.get("hidden_size", VISION["hidden_size"])
    if not text:  # a config that is its own text model (Chameleon, Fuyu's text config inside, ...)
        kwargs.update(ZC._shrink(cls, default, {}))
        kwargs.pop("is_decoder", None)
    vocab = int(text.get("vocab_size", kwargs.get("vocab_size", ZC.VOCAB)))
    kwargs.update(_special_ids(fields, vocab))
    for name, value in TOP.items():
        if name in fields:
            kwargs[name] = value
    for name in TOP_TEXT_WIDTH:
        if name in fields and text:
            kwargs[name] = hidden
    for name, value in fields.items():  # the wrapper's own dropouts (Granite 4 Vision's projector_dropout): off
        if any(w in name for w in _RANDOM_WORDS) and isinstance(value, float) and name not in kwargs:
            kwargs[name] = 0.0
    if text:  # a wrapper that repeats its text model's width / vocabulary (Ovis 2)
        kwargs.update({k: text[k] for k in ("hidden_size", "vocab_size") if k in fields and k in text})
    if "tie_word_embeddings" in fields:
        kwargs["tie_word_embeddings"] = False
    kwargs.update(overrides)
    return kwargs


def tiny_config(family: str) -> Any:
    """A family's tiny config.

    Args:
        family: a model type of :func:`families`.

    Returns:
        The config instance.

    Raises:
        NotBuildable: the config class refuses the tiny arguments, or the model is too large.
    """
    if family in TINY_VLMS:
        return tiny_vlm_config(family)
    from transformers import CONFIG_MAPPING

    kwargs = config_kwargs(family)
    try:
        config = CONFIG_MAPPING[family](**kwargs)
    except Exception as e:  # noqa: BLE001
        raise NotBuildable(f"tiny config refused: {first_line(e)}") from e
    with torch.device("meta"):
        try:
            size = sum(p.numel() for p in _model_class(config)(config).parameters())
        except Exception as e:  # noqa: BLE001
            raise NotBuildable(f"model refuses the tiny config: {first_line(e)}") from e
    if size > MAX_PARAMS:
        raise NotBuildable(f"tiny config still has {size:,} parameters (a size field is not shrunk)")
    return config


def _model_class(config: Any) -> type:
    """The image-text-to-text class of a config (Mllama's own class outside the auto mapping; an audio-language
    model's from :data:`AUDIO_MAPPINGS`)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    name = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(config.model_type)
    if name is None and config.model_type == "mllama":
        name = "MllamaForConditionalGeneration"
    if name is None:  # an audio-language model
        name = _audio_class_name(config.model_type)
    return getattr(transformers, name)


def build_model(config: Any, attn: str, dtype: torch.dtype = torch.float32, seed: int = 0,
                state_dict: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
    """The family's model with random weights (seeded) or ``state_dict``, in train mode.

    Args:
        config: from :func:`tiny_config`; attn: ``attn_implementation``; dtype: parameter dtype; seed: init seed;
        state_dict: weights to load instead (strict).

    Returns:
        The model (float64 models use the eager MoE experts: grouped_mm has no float64).
    """
    if attn == "hsap":
        from hf_hsap.integrations import register

        register()
    torch.manual_seed(seed)
    extra = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    cls = _model_class(config)
    try:
        model = cls._from_config(config, attn_implementation=attn, dtype=torch.float32, **extra)
    except TypeError:
        model = cls._from_config(config, attn_implementation=attn, dtype=torch.float32)
    if state_dict is not None:
        model.load_state_dict(state_dict, strict=True)
    else:  # a gate initialised at 0 (Mllama's cross-attention and tile gates, Idefics' alphas: tanh(0) = 0) would
        with torch.no_grad():  # hide its path from the comparison
            for name, p in model.named_parameters():
                leaf = name.rsplit(".", 1)[-1]
                if ("gate" in leaf or leaf.startswith("alpha_")) and p.numel() <= 16 and not p.is_meta \
                        and not bool(p.any()):
                    p.fill_(0.5)
    model = model.to(dtype).train()
    for sub in CONFIG_DTYPE.get(config.model_type, ()):  # a tower that casts its pixels to its config's dtype
        getattr(model.config, sub).dtype = dtype
    return model
