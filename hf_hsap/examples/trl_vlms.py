"""Tiny random models and offline processors of the eight VLMs of TRL's SFT examples and docs.

    model, processor = tiny_trl_vlm("smolvlm")       # AutoModelForImageTextToText + its own processor class
    save_tiny_vlm("runs/tiny-smolvlm", "smolvlm")      # from_pretrained / hsap-sft --model_name_or_path read it

Each family gets its real processor class (``LlavaNextProcessor``, ``MllamaProcessor``, ``SmolVLMProcessor``,
``Gemma3Processor``, ``Qwen2_5_VLProcessor``, ``Qwen3VLProcessor``, ``PixtralProcessor`` for Ministral-3, ...) built
from the shipped tokenizer plus the family's special tokens, an image processor sized for the tiny vision tower
(8 to 16 pixel images, 2-pixel patches) and a chat template with TRL's generation markers (assistant-only loss).
The model config takes the placeholder ids from that tokenizer, so TRL's ``DataCollatorForVisionLanguageModeling``
produces exactly the inputs the model expects. The images of :func:`~.vlm.vlm_sft_rows` are 16 x 16 pixels.
"""
from __future__ import annotations

from typing import Any

import torch

from .vlm import qwen_vl_config

__all__ = ["TRL_VLMS", "save_tiny_vlm", "tiny_trl_config", "tiny_trl_processor", "tiny_trl_vlm"]

# model type -> the name TRL's docs use; the order of the list
TRL_VLMS: dict[str, str] = {
    "llava": "LLaVA-1.5", "llava_next": "LLaVA-NeXT", "mllama": "Llama-3.2-Vision", "smolvlm": "SmolVLM",
    "gemma3": "Gemma 3", "qwen2_5_vl": "Qwen2.5-VL", "qwen3_vl": "Qwen3-VL", "mistral3": "Ministral-3",
}
_TEXT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, max_position_embeddings=2048, bos_token_id=None, eos_token_id=None)
_VIT = dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2, patch_size=2)
_PIXELS = 8  # image side of the fixed-size towers (CLIP, SigLIP, mllama tiles)
# the tokens each family's processor looks for in the tokenizer (attribute name -> token), and the text that stands
# for one image in a chat message (what the family's own chat template writes; the processor expands it)
_TOKENS: dict[str, dict[str, str]] = {
    "llava": {"image_token": "<image>"},
    "llava_next": {"image_token": "<image>"},
    "mllama": {"image_token": "<|image|>"},
    "smolvlm": {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                "global_image_token": "<global-img>", "end_of_utterance_token": "<end_of_utterance>"},
    "gemma3": {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"},
    "qwen2_5_vl": {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                   "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"},
    "mistral3": {"image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]"},
}
_TOKENS["qwen3_vl"] = _TOKENS["qwen2_5_vl"]
_IMAGE_TEXT = {"gemma3": "<start_of_image>", "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>",
               "qwen3_vl": "<|vision_start|><|image_pad|><|vision_end|>", "mllama": "<|image|>",
               "mistral3": "[IMG]"}
_CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part['type'] == 'image' -%}IMAGE{%- else -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- 'assistant: ' -}}{%- generation -%}{{- render(message['content']) + eos_token -}}{%- endgeneration -%}"
    "{%- else -%}{{- message['role'] + ': ' + render(message['content']) -}}{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'assistant: ' -}}{%- endif -%}"
)


def _check(family: str) -> None:
    if family not in TRL_VLMS:
        raise ValueError(f"no built-in tiny VLM {family!r}; choose one of {list(TRL_VLMS)}")


def chat_template(family: str) -> str:
    """The tiny processors' chat template: ``role: content`` lines, the assistant's inside TRL's generation
    markers, each image written as the family's own placeholder text; Mllama's starts with the BOS token, as
    Llama 3.2's does (its processor adds one to a text without it, after the template's assistant mask was
    taken: the mask would be shifted)."""
    template = _CHAT_TEMPLATE.replace("IMAGE", _IMAGE_TEXT.get(family, "<image>"))
    return "{{- bos_token -}}" + template if family == "mllama" else template


def _tokenizer(family: str) -> Any:
    from transformers import AutoTokenizer

    from ..data import tokenizer_path

    tok = AutoTokenizer.from_pretrained(str(tokenizer_path()), extra_special_tokens=_TOKENS[family])
    if family == "mllama":  # MllamaProcessor also looks up a python tag and the BOS token
        tok.add_special_tokens({"bos_token": "<|begin_of_text|>", "additional_special_tokens": ["<|python_tag|>"]})
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def tiny_trl_processor(family: str) -> Any:
    """The processor of :func:`tiny_trl_vlm`'s ``family`` (its own processor class), built offline.

    Args:
        family: a key of :data:`TRL_VLMS`.

    Returns:
        A Transformers processor; its tokenizer holds the family's special tokens after the shipped vocabulary.
    """
    import transformers as T

    _check(family)
    tok, template = _tokenizer(family), chat_template(family)
    square = {"height": _PIXELS, "width": _PIXELS}
    if family == "llava":
        images = T.CLIPImageProcessor(size={"shortest_edge": _PIXELS}, crop_size=square)
        return T.LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=_VIT["patch_size"],
                                vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                chat_template=template)
    if family == "llava_next":
        images = T.LlavaNextImageProcessor(size={"shortest_edge": _PIXELS}, crop_size=square,
                                           image_grid_pinpoints=_PINPOINTS)
        return T.LlavaNextProcessor(image_processor=images, tokenizer=tok, patch_size=_VIT["patch_size"],
                                    vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                    chat_template=template)
    if family == "mllama":
        images = T.MllamaImageProcessor(size=square, max_image_tiles=_MLLAMA_TILES)
        return T.MllamaProcessor(image_processor=images, tokenizer=tok, chat_template=template)
    if family == "smolvlm":
        images = T.SmolVLMImageProcessor(size={"longest_edge": 2 * _PIXELS},
                                         max_image_size={"longest_edge": 2 * _PIXELS}, do_image_splitting=False)
        return _with_videos(T.SmolVLMProcessor, "SmolVLMVideoProcessor", {}, image_processor=images, tokenizer=tok,
                            image_seq_len=_SMOLVLM_TOKENS, chat_template=template)
    if family == "gemma3":
        images = T.Gemma3ImageProcessor(size=square)
        return T.Gemma3Processor(image_processor=images, tokenizer=tok, image_seq_length=4, chat_template=template)
    if family in ("qwen2_5_vl", "qwen3_vl"):
        images = T.Qwen2VLImageProcessor(patch_size=_VIT["patch_size"], temporal_patch_size=2, merge_size=2,
                                         min_pixels=4 * 4, max_pixels=32 * 32)
        cls = T.Qwen2_5_VLProcessor if family == "qwen2_5_vl" else T.Qwen3VLProcessor
        video = "Qwen2VLVideoProcessor" if family == "qwen2_5_vl" else "Qwen3VLVideoProcessor"
        return _with_videos(cls, video, dict(patch_size=_VIT["patch_size"], temporal_patch_size=2, merge_size=2),
                            image_processor=images, tokenizer=tok, chat_template=template)
    images = T.PixtralImageProcessor(size={"longest_edge": 2 * _PIXELS}, patch_size=_VIT["patch_size"])
    return _pixtral_processor()(image_processor=images, tokenizer=tok, patch_size=_VIT["patch_size"],
                                spatial_merge_size=2, chat_template=template)


def _with_videos(cls: type, video: str, video_kwargs: dict[str, Any], **kwargs: Any) -> Any:
    """``cls(**kwargs)`` with its video processor (Transformers' class named ``video``, built from
    ``video_kwargs``) where torchvision is installed; else :func:`_image_only`'s ``cls`` without one."""
    import importlib.util

    import transformers as T

    if importlib.util.find_spec("torchvision") is not None:
        return cls(video_processor=getattr(T, video)(**video_kwargs), **kwargs)
    return _image_only(cls)(**kwargs)


def _image_only(cls: type) -> type:
    """``cls`` without its video processor (Transformers builds video processors with torchvision only). Images
    take the class's own code; videos are refused.

    Written here because Transformers has no image-only form of these processors: SmolVLM's, Qwen2.5-VL's and
    Qwen3-VL's constructors require a video processor even for image data."""

    def __init__(self: Any, image_processor: Any, tokenizer: Any, chat_template: str | None = None,
                 **kwargs: Any) -> None:
        cls.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)
        # SmolVLM's apply_chat_template reads the video sampling defaults even for images
        self.video_processor = _NoVideo()

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__})


class _NoVideo:
    """The video processor of :func:`_image_only`'s processors: sampling defaults, and a refusal of videos."""

    num_frames, fps = 8, 1.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ImportError("the tiny VLM's processor has no video processor: Transformers builds one with torchvision "
                          "only (pip install torchvision)")


def _pixtral_processor() -> type:
    """Transformers' ``PixtralProcessor`` (Ministral-3's) where torchvision is installed, else the same processor
    for images written here: Transformers' class imports torchvision at module level, though its image processor
    has a PIL form. Its two image rules are copied in behaviour (not code): pixels resized to whole merged
    patches, and per image ``[IMG]`` x width then ``[IMG_BREAK]`` per row of merged patches, the last one
    ``[IMG_END]``."""
    import importlib.util

    from transformers import ProcessorMixin

    if importlib.util.find_spec("torchvision") is not None:
        from transformers import PixtralProcessor

        return PixtralProcessor

    class PixtralProcessor(ProcessorMixin):  # noqa: D401 - named as the class its saved files load
        """Ministral-3's processor for images (see :func:`_pixtral_processor`)."""

        def __init__(self, image_processor: Any, tokenizer: Any, *, patch_size: int = 16, spatial_merge_size: int = 1,
                     chat_template: str | None = None, image_token: str = "[IMG]",
                     image_break_token: str = "[IMG_BREAK]", image_end_token: str = "[IMG_END]") -> None:
            super().__init__(image_processor, tokenizer, chat_template=chat_template)
            self.patch_size, self.spatial_merge_size = patch_size, spatial_merge_size
            self.image_token, self.image_break_token, self.image_end_token = (image_token, image_break_token,
                                                                              image_end_token)
            self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)

        def _process_images(self, images: Any, **images_kwargs: Any) -> Any:
            images_kwargs["patch_size"] = self.patch_size * self.spatial_merge_size
            return super()._process_images(images, **images_kwargs)

        def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs: Any) -> str:
            merged = self.patch_size * self.spatial_merge_size
            height, width = (int(x) for x in image_inputs["image_sizes"][image_idx])
            row = self.image_token * (width // merged)
            return self.image_break_token.join([row] * (height // merged)) + self.image_end_token

        @property
        def model_input_names(self) -> list[str]:
            return [*self.tokenizer.model_input_names, *self.image_processor.model_input_names, "image_sizes"]

    return PixtralProcessor


_PINPOINTS = [[8, 8], [8, 16], [16, 8], [16, 16]]  # LLaVA-NeXT: a 16 x 16 image is 4 tiles + the base image
_MLLAMA_TILES = 4  # Mllama allows 4 only with its default aspect ratios
_SMOLVLM_TOKENS = 16  # 16-pixel images, 2-pixel patches, pixel shuffle 2: 64 / 4


def tiny_trl_config(family: str, tokenizer: Any) -> Any:
    """The config of :func:`tiny_trl_vlm`'s ``family``, its token ids from ``tokenizer``.

    Args:
        family: a key of :data:`TRL_VLMS`; tokenizer: the processor's tokenizer (:func:`tiny_trl_processor`).

    Returns:
        A Transformers config (``AutoModelForImageTextToText.from_config`` builds it).
    """
    import transformers as T

    _check(family)
    ids = {k: tokenizer.convert_tokens_to_ids(v) for k, v in _TOKENS[family].items()}
    text = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **_TEXT)
    text["eos_token_id"] = tokenizer.eos_token_id  # what TRL aligns the config to otherwise
    if family == "mllama":  # its text config takes int BOS / EOS ids
        text.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    clip = dict(image_size=_PIXELS, projection_dim=16, **_VIT)
    if family in ("llava", "llava_next"):
        cls = T.LlavaConfig if family == "llava" else T.LlavaNextConfig
        extra = {} if family == "llava" else {"image_grid_pinpoints": _PINPOINTS}
        return cls(text_config={"model_type": "llama", **text},
                   vision_config={"model_type": "clip_vision_model", **clip},
                   image_token_index=ids["image_token"], vision_feature_layer=-1, tie_word_embeddings=False, **extra)
    if family == "mllama":
        return T.MllamaConfig(
            text_config={**text, "cross_attention_layers": [1], "rope_scaling": None},
            vision_config={"hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2, "num_global_layers": 1,
                           "attention_heads": 2, "patch_size": 2, "image_size": _PIXELS,
                           "max_num_tiles": _MLLAMA_TILES, "intermediate_layers_indices": [0],
                           "vision_output_dim": 32},
            image_token_index=ids["image_token"], tie_word_embeddings=False)
    if family == "smolvlm":
        return T.SmolVLMConfig(text_config={"model_type": "llama", **text},
                               vision_config={**_VIT, "image_size": 2 * _PIXELS}, scale_factor=2,
                               image_token_id=ids["image_token"], tie_word_embeddings=False)
    if family == "gemma3":
        return T.Gemma3Config(text_config={**text, "sliding_window": 8, "query_pre_attn_scalar": 8,
                                           "layer_types": ["sliding_attention", "full_attention"]},
                              vision_config={**clip, "model_type": "siglip_vision_model"}, mm_tokens_per_image=4,
                              image_token_index=ids["image_token"], boi_token_index=ids["boi_token"],
                              eoi_token_index=ids["eoi_token"], tie_word_embeddings=False)
    if family == "mistral3":
        rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0, "original_max_position_embeddings": 128,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                "llama_4_scaling_beta": 0.1}  # Ministral-3's YaRN, scaled to the tiny 2048 positions
        return T.Mistral3Config(text_config={"model_type": "ministral3", **text, "rope_parameters": rope},
                                vision_config={"model_type": "pixtral", **_VIT, "image_size": 2 * _PIXELS,
                                                   "head_dim": 8},
                                image_token_index=ids["image_token"], spatial_merge_size=2, vision_feature_layer=-1,
                                tie_word_embeddings=False)
    special = {"image_token_id": ids["image_token"], "video_token_id": ids["video_token"],
               "vision_start_token_id": ids["vision_start_token"], "vision_end_token_id": ids["vision_end_token"]}
    if family in ("qwen2_5_vl", "qwen3_vl"):
        return qwen_vl_config(family, text, special)
    raise AssertionError(family)  # every family is handled above


def tiny_trl_vlm(family: str, seed: int = 0, attn: str = "sdpa") -> tuple[torch.nn.Module, Any]:
    """A tiny random model of ``family`` (float32, the same weights for the same ``seed``) and its processor.

    Args:
        family: a key of :data:`TRL_VLMS`; seed: init seed; attn: ``attn_implementation``.

    Returns:
        ``(model, processor)``.
    """
    from transformers import AutoModelForImageTextToText

    from .vlm import _no_zero_matrices

    processor = tiny_trl_processor(family)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(tiny_trl_config(family, processor.tokenizer),
                                                    attn_implementation=attn)
    _no_zero_matrices(model, seed)
    return model.float(), processor


def save_tiny_vlm(path: str, family: str = "llava", seed: int = 0) -> str:
    """Save :func:`tiny_trl_vlm`'s model and processor to ``path`` (``AutoModelForImageTextToText`` /
    ``AutoProcessor.from_pretrained(path)`` load them).

    Returns:
        ``path``.
    """
    from pathlib import Path

    model, processor = tiny_trl_vlm(family, seed=seed)
    Path(path).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return str(path)
