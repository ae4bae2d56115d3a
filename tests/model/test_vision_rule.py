"""``vision_spec`` derives a family's packed-row spec from the model, not from a list: every refusal kind is read
from the model's structure (and names a fix), and a family no list named is accepted with the keys its forward
takes. Tiny zoo models (``tests/workers/vlm_zoo_configs.py``); those refused before any encoder runs are built on
the meta device (no weights needed to read the structure).
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

import hf_hsap
from hf_hsap.multimodal import REFUSAL_KINDS, VisionRefusal, accepted_families
from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD

def model_of(family: str, *, meta: bool = False, **config: Any) -> torch.nn.Module:
    """The zoo's tiny model of ``family`` (SDPA where every sub-model has it; ``config``: fields set on its config
    first)."""
    for attn in ("sdpa", "eager"):
        cfg = VC.tiny_config(family)  # a fresh one: building sets the attention on the sub-configs
        for key, value in config.items():
            target = cfg.get_text_config() if key == "use_bidirectional_attention" else cfg
            setattr(target, key, value)
        try:
            if meta:
                with torch.device("meta"):
                    return VC.build_model(cfg, attn)
            return VC.build_model(cfg, attn)
        except ValueError:  # a sub-model without SDPA
            continue
    raise AssertionError(f"{family} builds with neither attention")


def refusal(model: torch.nn.Module) -> VisionRefusal:
    with pytest.raises(VisionRefusal) as info:
        hf_hsap.vision_spec(model)
    return info.value


def chameleon() -> torch.nn.Module:
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    with torch.device("meta"):
        return ChameleonForConditionalGeneration(ChameleonConfig(
            hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=96,
            vocabulary_map={"<image>": 95, **{f"IMGIMG{i}Z": i for i in range(8)}}))


def llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        return LlamaForCausalLM(LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                            intermediate_size=64, vocab_size=96))


# (what the model is, its refusal kind, words of the message naming the structure read)
STRUCTURAL = [
    (llama, "text model", "PackingCollator(max_length) alone"),
    (lambda: model_of("pix2struct", meta=True), "encoder-decoder", "encoder-decoder"),
    (chameleon, "VQ codes in the vocabulary", "VQ codes"),
    (lambda: model_of("git", meta=True), "no image encoder", "no get_image_features"),
    (lambda: model_of("mllama", meta=True), "cross-attention", "cross_attention_mask"),
    (lambda: model_of("kosmos-2", meta=True), "no placeholder", "no image_token_id"),
    (lambda: model_of("blip-2", meta=True), "image required", "requires pixel_values"),
    (lambda: model_of("lfm2_vl", meta=True), "input not carried", "get_image_features needs spatial_shapes"),
    (lambda: model_of("qwen2_5_omni_thinker", meta=True), "input not carried", "get_rope_index) takes audio_seqlens"),
    (lambda: model_of("paligemma", meta=True), "bidirectional text", "use_bidirectional_attention=True"),
    (lambda: model_of("gemma4", meta=True, use_bidirectional_attention="vision"), "image blocks", "'vision'"),
    (lambda: model_of("qwen3_5", meta=True), "recurrent layers", "recurrent layers (linear_attention)"),
    (lambda: model_of("ovis2_5", meta=True), "encoder layout", "get_visual_indicator_features"),
]


@pytest.mark.parametrize("make,kind,words", STRUCTURAL, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(STRUCTURAL)])
def test_each_refusal_names_the_structure_it_read_and_a_fix(make, kind: str, words: str) -> None:
    e = refusal(make())
    assert e.kind == kind and words in str(e), str(e)
    assert isinstance(e, ValueError)  # callers catching ValueError keep working
    if kind != "text model":
        assert "one document per row" in str(e) and "packing=False" in str(e)


def test_an_encoder_that_adds_rows_of_its_own_is_refused_after_asking_it() -> None:
    e = refusal(model_of("hunyuan_vl"))  # its encoder returns 8 rows for 4 merge windows
    assert e.kind == "encoder layout" and "returns 8 rows for a grid of 4 merge windows" in str(e)


def test_every_refusal_kind_is_tested() -> None:
    assert set(REFUSAL_KINDS) == {kind for _, kind, _ in STRUCTURAL} | {"encoder layout"}


def test_a_family_no_list_named_is_accepted_with_the_keys_its_forward_takes() -> None:
    aria = hf_hsap.vision_spec(model_of("aria"))
    assert aria.layout.modalities[0].item_keys == ("pixel_mask",)  # its forward's per-image pixel mask
    paddle = hf_hsap.vision_spec(model_of("paddleocr_vl"))
    image = paddle.layout.modalities[0]
    assert image.grid_key == "image_grid_thw" and paddle.layout.merge == 4 and paddle.rope_index is not None
    assert paddle.token_type_key == "mm_token_type_ids"
    video_llava = hf_hsap.vision_spec(model_of("video_llava"))
    assert [m.pixel_key for m in video_llava.layout.modalities] == ["pixel_values", "pixel_values_videos"]
    assert accepted_families([model_of("aria"), model_of("git", meta=True)]) == {"aria"}


def test_a_key_the_forward_takes_but_packing_does_not_carry_is_refused_naming_the_document() -> None:
    model = model_of("gemma4")
    spec = hf_hsap.vision_spec(model)
    assert "pixel_values_videos" in spec.uncarried and "input_features" in spec.uncarried  # not carried yet
    docs = VD.documents(model.config, model)
    docs[1]["input_features"] = torch.zeros(1, 4, 16)
    with pytest.raises(ValueError, match=r"example 1: gemma4's \['input_features'\] are not carried on packed rows"):
        hf_hsap.PackingCollator(512, vision=spec)(docs)
