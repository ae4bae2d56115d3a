"""Families without an image placeholder id, derived from the model (``hf_hsap/multimodal/marked.py``,
``qformer.video_qformer_spec``): Kosmos-2 / Kosmos-2.5 place each image's rows by a per-token mask
(``image_embeds_position_mask``), carried per token in document order; InstructBLIP-Video queries each video's frames
with its Q-Former and places the rows at its video token. Their exactness under SP is the zoo's
(``test_vlm_zoo.PER_ITEM``); here the derived spec, the carried mask, the per-document refusals and what
``prepare_model`` changes on Kosmos-2 (no dense causal mask of its own, its projection's attention per image).
"""
from __future__ import annotations

import pytest
import torch

import hf_hsap
from workers import vlm_zoo as VZ
from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD


def model_and_docs(family: str) -> tuple[torch.nn.Module, list[dict]]:
    config = VC.tiny_config(family)
    model = VC.build_model(config, "sdpa", VZ.DTYPE)
    return model, VD.documents(config, model)


def test_a_per_token_image_mask_is_the_placeholder() -> None:
    model, docs = model_and_docs("kosmos-2")
    spec = hf_hsap.vision_spec(model)
    image = spec.layout.modalities[0]
    assert image.mark_key == spec.token_type_key == "image_embeds_position_mask" and image.token_id == -1
    assert spec.layout.position_start == model.config.text_config.pad_token_id + 1  # its sinusoidal table's first
    assert spec.layout.empty_items  # its forward refuses a call without pixels
    assert spec.item_tokens("image", docs[0]) == [model.config.latent_query_num]
    batch = hf_hsap.PackingCollator(1024, vision=spec)(docs)
    mark = batch["image_embeds_position_mask"][0]
    assert int((mark == 1).sum()) == model.config.latent_query_num * len(docs)  # every document's image, in order
    local = hf_hsap.shard_batch(batch, 1)
    assert torch.equal(local["image_embeds_position_mask"][0], mark[local["hsap_plan"].local_token_indices(0)])
    k25 = hf_hsap.vision_spec(model_and_docs("kosmos-2.5")[0])
    assert k25.layout.modalities[0].pixel_key == "flattened_patches" and not k25.layout.empty_items
    assert k25.layout.modalities[0].item_keys == ("width", "height")  # its processor's per-image sizes


def test_a_document_whose_mask_disagrees_with_its_image_is_refused_naming_it() -> None:
    model, docs = model_and_docs("kosmos-2")
    spec = hf_hsap.vision_spec(model)
    mark = docs[2]["image_embeds_position_mask"].clone()
    mark[int(torch.nonzero(mark == 1)[0])] = 0  # one image row fewer marked
    docs[2] = {**docs[2], "image_embeds_position_mask": mark}
    with pytest.raises(ValueError, match=r"example 2: its image takes 64 placeholders .* holds 63 image placeholder "
                                         r"tokens \(image_embeds_position_mask == 1\)"):
        hf_hsap.PackingCollator(1024, vision=spec)(docs)
    docs[2] = {k: v for k, v in docs[2].items() if k != "pixel_values"}  # marks without their image
    with pytest.raises(ValueError, match=r"example 2 holds 63 image placeholder tokens "
                                         r"\(image_embeds_position_mask == 1\) but no pixel_values"):
        hf_hsap.PackingCollator(1024, vision=spec)(docs)


def test_a_video_q_former_family_counts_query_rows_per_frame() -> None:
    model, docs = model_and_docs("instructblipvideo")
    spec = hf_hsap.vision_spec(model)
    video = spec.layout.modalities[0]
    assert (video.name, video.token_id, video.pixel_key) == ("video", model.config.video_token_index, "pixel_values")
    frames = int(docs[1]["pixel_values"].shape[1])
    assert spec.item_tokens("video", docs[1]) == [model.config.num_query_tokens * frames]
    ids = docs[1]["input_ids"]
    docs[1] = {**docs[1], "input_ids": ids[ids != video.token_id][:-1].clone()}  # no placeholders left
    docs[1]["labels"] = docs[1]["input_ids"].clone()
    with pytest.raises(ValueError, match=r"example 1: its video takes \d+ placeholders .* holds 0 video"):
        hf_hsap.PackingCollator(1024, vision=spec)(docs)


def test_prepare_model_drops_kosmos_2s_own_dense_mask_and_serves_its_projection_per_image() -> None:
    from hf_hsap.integrations.encoder_attention import is_encoder_module

    config = VC.tiny_config("kosmos-2")
    model = VC.build_model(config, "hsap", VZ.DTYPE)
    text, x_attn = model.text_model.model, model.image_to_text_projection.x_attn
    assert not is_encoder_module(x_attn)  # a text-config layer, not causal: "hsap" would refuse it
    prepared = hf_hsap.prepare_model(model)
    assert is_encoder_module(x_attn)
    shape, embeds = (1, 4), torch.zeros(1, 4, 8)  # float32: its own mask fills finfo.min in the default dtype
    assert text._prepare_decoder_attention_mask(torch.ones(shape), shape, embeds, 0) is None  # the plan's documents
    with pytest.raises(ValueError, match="no padding inside a row"):
        text._prepare_decoder_attention_mask(torch.tensor([[1, 1, 0, 0]]), shape, embeds, 0)
    prepared.undo()
    assert not is_encoder_module(x_attn) and text._prepare_decoder_attention_mask(None, shape, embeds, 0).dim() == 4
