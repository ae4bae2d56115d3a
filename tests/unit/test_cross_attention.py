"""Mllama's cross-attention on packed rows: the collator lays each document's cross_attention_mask at its tokens and
its own images, and a packed row given to the model without shard_batch is refused (each token would attend to every
document's images). Exactness against each document alone: tests/model/test_vlm_zoo.py."""
from __future__ import annotations

import pytest
import torch

import hf_hsap

from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD

# 10, 7, 6 tokens: 2 images (4 + 2 tiles), none, 1 image (1 tile)
SHAPES = [(3, (1, 8, 8), 5), (4, None, 3), (2, (1, 4, 4), 3)]


@pytest.fixture(scope="module")
def mllama():
    config = VC.tiny_config("mllama")
    model = VC.build_model(config, "hsap", torch.float64)
    return model, VD.documents(config, model, shapes=SHAPES)


def test_collator_places_each_documents_mask_at_its_tokens_and_images(mllama) -> None:
    model, docs = mllama
    batch = hf_hsap.PackingCollator(32, vision=hf_hsap.vision_spec(model))(docs)
    mask, cu = batch["cross_attention_mask"][0], batch["cu_seq_lens_q"]  # [L, 3 images, 4 tiles]
    assert tuple(batch["pixel_values"].shape[:2]) == (1, 3) and tuple(mask.shape[1:]) == (3, 4)
    order = [int(torch.nonzero(torch.tensor([d["input_ids"].numel() == int(n) for d in docs]))[0])
             for n in (cu[1:] - cu[:-1])[:3]]
    image = 0
    for k, i in enumerate(order):  # the collator's row order; each block at its document's tokens and images
        block = mask[int(cu[k]):int(cu[k + 1])]
        n = docs[i]["pixel_values"].shape[1] if "pixel_values" in docs[i] else 0
        if n:
            assert torch.equal(block[:, image:image + n], docs[i]["cross_attention_mask"][0])
        assert int(block.sum()) == int(block[:, image:image + n].sum())  # nothing on another document's images
        image += n


def test_packed_row_without_shard_batch_is_refused(mllama) -> None:
    model, docs = mllama
    batch = hf_hsap.PackingCollator(32, vision=hf_hsap.vision_spec(model))(docs)
    keys = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
            "pixel_values", "aspect_ratio_ids", "aspect_ratio_mask", "cross_attention_mask")
    with pytest.raises(ValueError, match="shard_batch"):
        model(**{k: batch[k] for k in keys})
    local = hf_hsap.shard_batch(batch, 1)
    assert model(**local).logits.shape[1] == batch["input_ids"].shape[1]
