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


def without_qformer(model: torch.nn.Module) -> torch.nn.Module:
    """A BLIP-2 without its Q-Former module: no Q-Former layout (``multimodal/qformer.py``) is derived, and its
    forward still requires pixel_values."""
    model.qformer = None
    return model


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


def cross_without_tiles() -> torch.nn.Module:
    """Mllama whose forward takes its cross_attention_mask but not its images' tile layouts (aspect_ratio_ids /
    aspect_ratio_mask): a cross-attention model hf_hsap does not recognise (Mllama itself is accepted)."""
    model = model_of("mllama", meta=True)

    class NoTiles(type(model)):
        def forward(self, input_ids=None, pixel_values=None, cross_attention_mask=None, **kwargs):  # noqa: D102
            return super().forward(input_ids=input_ids, pixel_values=pixel_values,
                                   cross_attention_mask=cross_attention_mask, **kwargs)

    model.__class__ = NoTiles
    return model


def other_token_types(model: torch.nn.Module) -> torch.nn.Module:
    """ERNIE-4.5-VL whose forward also takes per-token types that are not a variant of its multimodal types (ERNIE
    itself is accepted: its moe_mm_token_type_ids are derived, hf_hsap.multimodal.markers)."""
    class OtherTypes(type(model)):
        def forward(self, input_ids=None, region_token_type_ids=None, **kwargs):  # noqa: D102
            return super().forward(input_ids=input_ids, **kwargs)

    model.__class__ = OtherTypes
    return model


def other_merge(model: torch.nn.Module) -> torch.nn.Module:
    """Ovis 2.5 whose merge of features and start / end rows is not the one hf_hsap writes those rows for (Ovis 2.5
    itself is accepted: hf_hsap.multimodal.indicators)."""
    inner = model.model

    class OtherMerge(type(inner)):
        def _merge_visual_features(self, input_ids, inputs_embeds, visual_features):  # noqa: D102
            return inputs_embeds

    inner.__class__ = OtherMerge
    return model


# (what the model is, its refusal kind, words of the message naming the structure read)
STRUCTURAL = [
    (llama, "text model", "PackingCollator(max_length) alone"),
    (lambda: model_of("pix2struct", meta=True), "encoder-decoder", "encoder-decoder"),
    (chameleon, "VQ codes in the vocabulary", "VQ codes"),
    (lambda: model_of("git", meta=True), "no image encoder", "no get_image_features"),
    (lambda: cross_without_tiles(), "cross-attention", "cross_attention_mask"),
    # no image token and no per-token image mask (Kosmos-2's image_embeds_position_mask is accepted)
    (lambda: model_of("llava", meta=True, image_token_id=None), "no placeholder", "no image_token_id"),
    (lambda: model_of("instructblipvideo", meta=True, video_token_index=None), "no placeholder",
     "no video_token_id"),  # a video-only model (InstructBLIP-Video, accepted with its video token)
    (lambda: without_qformer(model_of("blip-2", meta=True)), "image required", "requires pixel_values"),
    (lambda: other_token_types(model_of("ernie4_5_vl_moe", meta=True)), "input not carried",
     "its forward (per token) needs region_token_type_ids"),
    (lambda: model_of("gemma4", meta=True, use_bidirectional_attention="all"), "bidirectional text",
     "use_bidirectional_attention='all'"),  # every token both ways: not a prefix-LM (PaliGemma's is accepted)
    (lambda: other_merge(model_of("ovis2_5", meta=True)), "encoder layout", "get_visual_indicator_features"),
]


@pytest.mark.parametrize("make,kind,words", STRUCTURAL, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(STRUCTURAL)])
def test_each_refusal_names_the_structure_it_read_and_a_fix(make, kind: str, words: str) -> None:
    e = refusal(make())
    assert e.kind == kind and words in str(e), str(e)
    assert isinstance(e, ValueError)  # callers catching ValueError keep working
    if kind != "text model":
        assert "one document per row" in str(e) and "packing=False" in str(e)


def test_an_encoder_whose_rows_are_no_formula_of_the_grid_is_refused_after_asking_it() -> None:
    """HunYuan-VL's own rows (H * (W + 1) + 2 per image) are counted (``multimodal/grid_rows.py``); with (H * W) ** 2
    more rows per image they are no ``t * (a*H*W + b*H + c*W + d) + e``: the probes past the fit disagree."""
    model = model_of("hunyuan_vl")
    assert hf_hsap.vision_spec(model).counts("image")
    model = model_of("hunyuan_vl")
    own = model.model.get_image_features

    def squared(pixel_values: torch.Tensor, image_grid_thw: torch.Tensor, **kwargs: Any) -> Any:
        out = own(pixel_values, image_grid_thw, **kwargs)
        windows = (image_grid_thw.prod(-1) // 4).tolist()
        out.pooler_output = tuple(torch.cat([v, v[:1].expand(w * w, -1)]) for v, w in zip(out.pooler_output, windows))
        return out

    model.model.get_image_features = squared
    e = refusal(model)
    assert e.kind == "encoder layout"
    assert "returns 162 rows for a grid of 1x4x3 merge windows, not the 144 of the rows it returned for smaller grids" \
        in str(e) and "one document per row" in str(e)


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


def test_image_blocks_and_the_layers_that_see_them_are_derived_from_the_model() -> None:
    """use_bidirectional_attention='vision': image blocks (shard_batch's hsap_blocks). Gemma 4's forward gives them to
    its sliding-window layers only (its full-attention layers are marked causal); Gemma 4 unified's to every layer."""
    from hf_hsap.model_state import ModelChanges
    from hf_hsap.multimodal.layer_blocks import layer_blocks, mark_causal_layers
    from hf_hsap.plan.blocks import Blocks

    blocks = Blocks((1,), (5,))
    for family, sliding_only in (("gemma4", True), ("gemma4_unified", False)):
        model = model_of(family, meta=True, use_bidirectional_attention="vision")
        spec = hf_hsap.vision_spec(model)
        assert spec.layout.image_blocks and spec.token_type_key == "mm_token_type_ids"
        attention = [m for m in model.modules() if hasattr(m, "sliding_window") and hasattr(m, "q_proj")]
        assert {m.sliding_window is None for m in attention} == {True, False}  # both layer kinds
        changes = ModelChanges()
        marked = mark_causal_layers(model, attention, changes)
        assert marked == (sum(m.sliding_window is None for m in attention) if sliding_only else 0)
        for m in attention:
            full = m.sliding_window is None
            assert layer_blocks(m, blocks) is (None if full and sliding_only else blocks)
        changes.undo()
        assert all(layer_blocks(m, blocks) is blocks for m in attention)
    assert not hf_hsap.vision_spec(model_of("gemma4", meta=True)).layout.image_blocks  # its default: causal


def test_an_hw_patch_grid_and_a_tower_of_towers_are_derived_from_the_model() -> None:
    nemotron = hf_hsap.vision_spec(model_of("nemotron_h_omni", meta=True))  # image_grid_hw, 2x2 pixel shuffle
    image = nemotron.layout.modalities[0]
    assert (image.grid_key, image.grid_dims, nemotron.layout.merge) == ("image_grid_hw", 2, 4)
    ocr = hf_hsap.vision_spec(model_of("deepseek_ocr2"))  # SAM then an encoder: the image size is SAM's
    assert ocr.layout.modalities[0].pixel_key == "pixel_values" and not ocr.layout.image_blocks


def test_vq_codes_scattered_into_placeholders_are_packed_like_features() -> None:
    """Apertus 1.5 tokenizes each image into VQ codes, embeds them and fills its placeholders with them (its
    get_placeholder_mask): accepted, with its per-image image_sizes; Chameleon's vocabulary_map stays refused."""
    apertus = hf_hsap.vision_spec(model_of("apertus1p5"))
    assert apertus.layout.modalities[0].item_keys == ("image_sizes",)
    assert refusal(chameleon()).kind == "VQ codes in the vocabulary"


def test_prefix_lm_and_cross_attention_are_derived_from_the_model() -> None:
    paligemma = hf_hsap.vision_spec(model_of("paligemma"))  # bidirectional text with token_type_ids: a prefix-LM
    assert paligemma.layout.prefix_blocks and not paligemma.layout.image_blocks
    assert paligemma.token_type_key == "token_type_ids"
    assert paligemma.layout.position_start == 1  # its positions count from 1 (asked from the model)
    mllama = hf_hsap.vision_spec(model_of("mllama", meta=True))
    assert mllama.layout.cross_key == "cross_attention_mask"
    assert mllama.layout.modalities[0].item_keys == ("aspect_ratio_ids", "aspect_ratio_mask")
    idefics = hf_hsap.vision_spec(model_of("idefics", meta=True))
    assert idefics.layout.cross_key == "image_attention_mask" and idefics.layout.modalities[0].token_id == -1


def test_a_vision_tower_s_token_mixer_is_not_taken_for_the_decoder_s() -> None:
    """LFM3-VL's vision tower has short convolutions (run per image); only the decoder's mixers need hf_hsap's
    kernel hooks, so check_model passes it on packed rows, and the decoder's modules stay checked."""
    from hf_hsap.integrations.model_check import check_model, encoder_parts

    model = model_of("lfm3_vl")
    parts = encoder_parts(model)
    tower = [m for m in model.modules() if type(m).__name__ == "Lfm3VlVisionShortConv"]
    assert tower and all(id(m) in parts for m in tower)
    assert not any(id(m) in parts for m in model.model.language_model.modules())
    assert check_model(model, sp_size=2, packed=True).attention_layers > 0


def test_a_tower_pooling_the_temporal_axis_carries_no_videos() -> None:
    """Kimi-K2.5's merge kernel pools a video's frames (its placeholders are not ``t * h * w / merge``): its images
    are a grid family's, its videos are not carried (the collator refuses a document holding one)."""
    spec = hf_hsap.vision_spec(model_of("kimi_k25"))
    assert [m.name for m in spec.layout.modalities] == ["image"]
    assert spec.layout.merge == 4  # the 2 x 2 kernel
    assert "pixel_values_videos" in spec.uncarried
