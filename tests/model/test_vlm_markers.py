"""Item markers on packed rows, on the multimodal zoo's tiny models (their exactness in every SP mode:
``tests/model/test_vlm_zoo.py`` PER_ITEM, ``scripts/vlm_zoo.py``): ERNIE-4.5-VL's MoE routing types per token
(``moe_mm_token_type_ids``: the placeholders and their start / end markers) carried or filled by the collator, and
its videos' temporal merge; Ovis 2.5's learned rows over each item's start / end tokens (each document's boundary
tokens checked against its items).
"""
from __future__ import annotations

import pytest
import torch

import hf_hsap
from workers import vlm_zoo as VZ
from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD

KEY = "moe_mm_token_type_ids"


@pytest.fixture(scope="module")
def ernie() -> tuple:
    config = VC.tiny_config("ernie4_5_vl_moe")
    model = VC.build_model(config, "sdpa", VZ.DTYPE)
    return config, VD.documents(config, model), hf_hsap.vision_spec(model)


def test_routing_types_are_carried_and_filled_like_the_processor(ernie) -> None:
    config, docs, spec = ernie
    assert KEY in spec.token_keys and KEY not in spec.uncarried
    marks = spec.token_keys[KEY]
    assert marks[config.image_start_token_id] == marks[config.image_token_id] == 1
    assert marks[config.video_end_token_id] == marks[config.video_token_id] == 2
    given = hf_hsap.PackingCollator(256, vision=spec)(docs)
    filled = hf_hsap.PackingCollator(256, vision=spec)([{k: v for k, v in d.items() if k != KEY} for d in docs])
    real = sum(d["input_ids"].numel() for d in docs)
    assert torch.equal(given[KEY][0, :real], torch.cat([d[KEY] for d in docs]))  # each document's own, in order
    assert torch.equal(filled[KEY], given[KEY])  # filled from the ids as the processor makes it
    assert int(given[KEY][0, real:].abs().sum()) == 0  # padding routes as text
    ids = given["input_ids"][0]
    start = ids == config.image_start_token_id
    assert bool(start.any()) and bool((given[KEY][0][start] == 1).all())  # a marker is a vision token
    assert not bool((given["mm_token_type_ids"][0][start]).any())  # but not a placeholder of the rope index


def test_videos_merge_their_temporal_patches(ernie) -> None:
    config, docs, spec = ernie
    video = next(m for m in spec.layout.modalities if m.name == "video")
    assert video.time_merge == config.vision_config.temporal_merge_size == 2
    assert next(m for m in spec.layout.modalities if m.name == "image").time_merge == 1
    doc = next(d for d in docs if "video_grid_thw" in d)
    cells = int(doc["video_grid_thw"].prod())
    assert int((doc["input_ids"] == video.token_id).sum()) == cells // (spec.layout.merge * 2)


def test_routing_types_of_another_length_are_refused(ernie) -> None:
    _, docs, spec = ernie
    docs = [dict(d) for d in docs]
    docs[2][KEY] = docs[2][KEY][:-1]
    with pytest.raises(ValueError, match=rf"example 2: {KEY} has \d+ entries for \d+ input_ids"):
        hf_hsap.PackingCollator(256, vision=spec)(docs)


@pytest.fixture(scope="module")
def ovis() -> tuple:
    config = VC.tiny_config("ovis2_5")
    model = VC.build_model(config, "sdpa", VZ.DTYPE)
    return config, model, VD.documents(config, model), hf_hsap.vision_spec(model)


def test_boundary_tokens_get_the_indicator_rows_on_every_rank(ovis) -> None:
    """The prepared model writes each boundary token's learned row itself, also on a rank's part holding a start
    token without its image (here: a row of text and one image start token, no pixels)."""
    config, model, _, _ = ovis
    prepared = hf_hsap.prepare_model(model, sp_size=1)
    try:
        ids = torch.tensor([[5, config.image_start_token_id, 6, config.video_end_token_id]])
        embeds = model.get_input_embeddings()(ids)[0]
        rows = model.model.multi_modal_projector.get_visual_indicator_features(ids.device)
        assert torch.equal(embeds[1], rows[0]) and torch.equal(embeds[3], rows[3])
        assert torch.equal(embeds[0], model.get_input_embeddings().weight[5])
    finally:
        prepared.undo()
    assert not torch.equal(model.get_input_embeddings()(ids)[0, 1], rows[0])


def test_a_document_whose_boundary_tokens_disagree_with_its_items_is_refused(ovis) -> None:
    config, _, docs, spec = ovis
    docs = [dict(d) for d in docs]
    ids = docs[0]["input_ids"]
    docs[0]["input_ids"] = ids[ids != config.image_end_token_id]
    docs[0]["labels"] = docs[0]["labels"][ids != config.image_end_token_id]
    with pytest.raises(ValueError, match=rf"example 0 holds 0 image end tokens \(id {config.image_end_token_id}\) "
                                         r"for its 1 image\(s\)"):
        hf_hsap.PackingCollator(256, vision=spec)(docs)
