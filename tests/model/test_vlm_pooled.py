"""Molmo2 on packed rows: crops per image (``image_num_crops``), pooling rows per placeholder
(``image_token_pooling``, relative to each image) and one bidirectional block per document over its image tokens, on
the multimodal zoo's tiny model (its exactness in every SP mode: ``tests/model/test_vlm_zoo.py`` PER_ITEM,
``scripts/vlm_zoo.py``).
"""
from __future__ import annotations

import pytest
import torch

import hf_hsap
from hf_hsap.multimodal import ROWS_KEY
from workers import vlm_zoo as VZ
from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD


@pytest.fixture(scope="module")
def molmo() -> tuple:
    config = VC.tiny_config("molmo2")
    model = VC.build_model(config, "sdpa", VZ.DTYPE)
    return config, VD.documents(config, model), hf_hsap.vision_spec(model)


def test_crops_and_pooling_rows_are_carried_per_image(molmo) -> None:
    config, docs, spec = molmo
    image = spec.layout.modalities[0]
    assert (image.rows_key, image.token_rows, spec.layout.type_blocks) == \
        ("image_num_crops", ("image_token_pooling",), "mm_token_type_ids")
    batch = hf_hsap.PackingCollator(256, vision=spec)(docs)
    with_image = [d for d in docs if "pixel_values" in d]
    assert torch.equal(batch["pixel_values"], torch.cat([d["pixel_values"] for d in with_image]))
    assert torch.equal(batch["image_token_pooling"], torch.cat([d["image_token_pooling"] for d in with_image]))
    assert int(batch["image_num_crops"].sum()) == batch["pixel_values"].shape[0]
    assert batch["image_token_pooling"].shape[0] == int((batch["input_ids"] == config.image_token_id).sum())
    # a rank's part: the pooling rows of the images it encodes, still relative to each image
    local = hf_hsap.shard_batch(batch, 1)
    assert torch.equal(local["image_token_pooling"], batch["image_token_pooling"])
    assert local[ROWS_KEY]["image"].numel() == batch["image_token_pooling"].shape[0]


def test_pooling_rows_of_another_count_are_refused(molmo) -> None:
    _, docs, spec = molmo
    docs = [dict(d) for d in docs]
    docs[0]["image_token_pooling"] = docs[0]["image_token_pooling"][:-1]
    with pytest.raises(ValueError, match=r"example 0: image_token_pooling has \d+ entries for its \d+ image "
                                         r"placeholder\(s\)"):
        hf_hsap.PackingCollator(256, vision=spec)(docs)


def test_crops_that_do_not_match_the_pixels_are_refused(molmo) -> None:
    _, docs, spec = molmo
    docs = [dict(d) for d in docs]
    docs[0]["image_num_crops"] = docs[0]["image_num_crops"] + 1
    with pytest.raises(ValueError, match=r"example 0: pixel_values holds \d+ entries along axis 0 but its "
                                         r"image_num_crops ask for \d+"):
        hf_hsap.PackingCollator(256, vision=spec)(docs)


def test_a_document_with_two_runs_of_image_tokens_is_refused(molmo) -> None:
    """Molmo2's image tokens of one document all see each other, across the text between two images: not a
    contiguous block, refused before any compute."""
    config, docs, spec = molmo
    doc = dict(docs[0])
    ids, types = doc["input_ids"], doc["mm_token_type_ids"]
    image = torch.nonzero(types == 1).flatten()
    cut = int(image[len(image) // 2])  # a text token in the middle of the image's placeholders
    doc["input_ids"] = torch.cat([ids[:cut], torch.tensor([5]), ids[cut:]])
    doc["labels"] = torch.cat([doc["labels"][:cut], torch.tensor([5]), doc["labels"][cut:]])
    doc["mm_token_type_ids"] = torch.cat([types[:cut], torch.tensor([0]), types[cut:]])
    batch = hf_hsap.PackingCollator(256, vision=spec)([doc, docs[1]])
    with pytest.raises(ValueError, match=r"document 0 \(tokens 0\.\.\d+ of the packed batch\) has 2 separate runs of "
                                         r"mm_token_type_ids == 1"):
        hf_hsap.shard_batch(batch, 1)
