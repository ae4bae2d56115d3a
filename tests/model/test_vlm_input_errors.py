"""Bad vision input is refused by PackingCollator(vision=...), before any compute, naming the example (its index in
the batch) and what disagrees: placeholders against an item's features, pixels against their grid, a per-item or
per-token key missing or of the wrong length, a document's items against its placeholders. Valid documents of every
tiny family still collate and shard.

The documents are ``vlm_documents``' processor-like ones, each broken in one way; examples 0 and 2 hold an image,
example 1 is text only.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

import hf_hsap
from hf_hsap.examples import TINY_VLMS, tiny_vlm, vlm_documents

SHAPES = [(3, (1, 4, 4), 5), (2, None, 4), (6, (1, 8, 4), 1)]  # image (4 placeholders), text, image (8)
VIDEO_SHAPES = [(3, (2, 4, 4), 5), (6, (2, 8, 4), 1)]
_MODELS: dict[str, torch.nn.Module] = {}


def model_of(family: str) -> torch.nn.Module:
    if family not in _MODELS:
        _MODELS[family] = tiny_vlm(family)
    return _MODELS[family]


def collate(family: str, docs: list[dict[str, Any]]) -> dict[str, Any]:
    return hf_hsap.PackingCollator(64, vision=hf_hsap.vision_spec(model_of(family)))(docs)


def docs_of(family: str, shapes=SHAPES, video: bool = False) -> list[dict[str, Any]]:
    return vlm_documents(model_of(family).config, shapes, video=video)


def image_token(family: str) -> int:
    return hf_hsap.vision_spec(model_of(family)).layout.modalities[0].token_id


def drop_tokens(doc: dict[str, Any], keep: torch.Tensor) -> None:
    """Keep the tokens ``keep`` of every per-token key of ``doc``."""
    for key in ("input_ids", "labels", "mm_token_type_ids", "token_type_ids"):
        if key in doc:
            doc[key] = doc[key][keep]


def drop_first_placeholder(doc: dict[str, Any], token: int) -> None:
    keep = torch.ones(doc["input_ids"].numel(), dtype=torch.bool)
    keep[int(torch.nonzero(doc["input_ids"] == token)[0])] = False
    drop_tokens(doc, keep)


# ---- Qwen2.5-VL (a grid family) ----

def test_qwen_fewer_placeholders_than_the_image_features() -> None:
    docs = docs_of("qwen2_5_vl")
    drop_first_placeholder(docs[2], image_token("qwen2_5_vl"))
    with pytest.raises(ValueError, match=r"example 2: its image has a 1x8x4 grid \(8 placeholders after the 2x2 "
                                         r"merge\) but the document holds 7 image placeholder tokens"):
        collate("qwen2_5_vl", docs)


def test_qwen_pixels_that_do_not_match_the_grid() -> None:
    docs = docs_of("qwen2_5_vl")
    docs[0]["pixel_values"] = docs[0]["pixel_values"][:-2]
    with pytest.raises(ValueError, match=r"example 0: pixel_values holds 14 rows but its image grids ask for 16 "
                                         r"\(t\*h\*w of 1x4x4\)"):
        collate("qwen2_5_vl", docs)


def test_qwen_a_missing_grid() -> None:
    docs = docs_of("qwen2_5_vl")
    del docs[2]["image_grid_thw"]
    with pytest.raises(ValueError,
                       match=r"example 2: image_grid_thw is missing \(the image's pixels need their grid\)"):
        collate("qwen2_5_vl", docs)


def test_qwen_a_per_item_key_given_for_some_videos_only() -> None:
    """second_per_grid_ts is optional, but the batch concatenates it per video: one example without it would shift
    every later video's entry."""
    docs = docs_of("qwen2_5_vl", VIDEO_SHAPES, video=True)
    del docs[1]["second_per_grid_ts"]
    with pytest.raises(ValueError,
                       match=r"example 1 has no second_per_grid_ts for its videos where example 0 gives it"):
        collate("qwen2_5_vl", docs)
    docs = docs_of("qwen2_5_vl", VIDEO_SHAPES, video=True)
    docs[0]["second_per_grid_ts"] = torch.tensor([1.0, 1.0])
    with pytest.raises(ValueError, match=r"example 0: second_per_grid_ts has 2 entries for its 1 video"):
        collate("qwen2_5_vl", docs)


def test_qwen_token_types_of_another_length() -> None:
    docs = docs_of("qwen2_5_vl")
    docs[2]["mm_token_type_ids"] = docs[2]["mm_token_type_ids"][:-1]
    with pytest.raises(ValueError, match=r"example 2: mm_token_type_ids has 16 entries for 17 input_ids"):
        collate("qwen2_5_vl", docs)


def test_qwen_a_document_whose_items_and_placeholders_disagree() -> None:
    docs = docs_of("qwen2_5_vl")  # example 0: two images' pixels and grids, one image's placeholders
    docs[0]["pixel_values"] = torch.cat([docs[0]["pixel_values"]] * 2)
    docs[0]["image_grid_thw"] = torch.cat([docs[0]["image_grid_thw"]] * 2)
    with pytest.raises(ValueError, match=r"example 0: its 2 images have 1x4x4, 1x4x4 grids \(8 placeholders after "
                                         r"the 2x2 merge\) but the document holds 4 image placeholder tokens"):
        collate("qwen2_5_vl", docs)
    docs = docs_of("qwen2_5_vl")  # example 2: placeholders, no pixels
    del docs[2]["pixel_values"], docs[2]["image_grid_thw"]
    with pytest.raises(ValueError, match=r"example 2 holds 8 image placeholder tokens \(id \d+\) but no pixel_values"):
        collate("qwen2_5_vl", docs)


# ---- LLaVA and Gemma 3 (one pixel row per image, the same placeholders per image) ----

@pytest.mark.parametrize("family", ["llava", "gemma3"])
def test_uniform_fewer_placeholders_than_the_image_features(family: str) -> None:
    docs = docs_of(family)
    per_image = int((docs[0]["input_ids"] == image_token(family)).sum())
    drop_first_placeholder(docs[2], image_token(family))
    with pytest.raises(ValueError, match=rf"example 2 holds {per_image - 1} placeholder tokens \(id \d+\) per image "
                                         rf"where example 0 holds {per_image}"):
        collate(family, docs)


@pytest.mark.parametrize("family", ["llava", "gemma3"])
def test_uniform_pixels_of_another_size(family: str) -> None:
    docs = docs_of(family)
    docs[2]["pixel_values"] = docs[2]["pixel_values"][..., :4, :4]
    size = model_of(family).config.vision_config.image_size
    with pytest.raises(ValueError, match=rf"example 2: its pixel_values rows are 3x4x4 where example 0's are "
                                         rf"3x{size}x{size}"):
        collate(family, docs)


def test_gemma3_token_types_of_another_length() -> None:
    docs = docs_of("gemma3")
    docs[0]["token_type_ids"] = docs[0]["token_type_ids"][:-1]
    n = docs[0]["input_ids"].numel()
    with pytest.raises(ValueError, match=rf"example 0: token_type_ids has {n - 1} entries for {n} input_ids"):
        collate("gemma3", docs)


@pytest.mark.parametrize("family", ["llava", "gemma3"])
def test_uniform_a_document_whose_items_and_placeholders_disagree(family: str) -> None:
    docs = docs_of(family)  # example 0: three images' pixels, one image's placeholders (16 or 4: not a multiple of 3)
    docs[0]["pixel_values"] = torch.cat([docs[0]["pixel_values"]] * 3)
    with pytest.raises(ValueError, match=r"example 0 holds \d+ image placeholder tokens \(id \d+\) for its 3 "
                                         r"pixel_values item\(s\): not the same number for each"):
        collate(family, docs)
    docs = docs_of(family)  # example 1: pixels, no placeholders
    docs[1]["pixel_values"] = docs[0]["pixel_values"]
    with pytest.raises(ValueError, match=r"example 1 has 1 pixel_values item\(s\) but no image placeholder tokens"):
        collate(family, docs)
    docs = docs_of(family)  # example 2: placeholders, no pixels
    del docs[2]["pixel_values"]
    with pytest.raises(ValueError,
                       match=r"example 2 holds \d+ image placeholder tokens \(id \d+\) but no pixel_values"):
        collate(family, docs)


# ---- valid documents ----

@pytest.mark.parametrize("family", TINY_VLMS)
def test_valid_documents_still_collate_and_shard(family: str) -> None:
    """Images, videos (grid families) and videos without the optional second_per_grid_ts all pass the checks: the
    batch holds every item and shard_batch gives one process all of them."""
    cases = [(SHAPES, False)]
    if family.startswith("qwen"):
        cases.append((VIDEO_SHAPES, True))
    for shapes, video in cases:
        docs = docs_of(family, shapes, video=video)
        batch = collate(family, docs)
        key = "pixel_values_videos" if video else "pixel_values"
        assert batch[key].shape[0] == sum(d[key].shape[0] for d in docs if key in d)
        local = hf_hsap.shard_batch(batch, 1)
        assert local[key].shape == batch[key].shape
    if family == "qwen2_5_vl":  # the optional per-item key left out of every example
        docs = docs_of(family, VIDEO_SHAPES, video=True)
        for d in docs:
            del d["second_per_grid_ts"]
        assert "second_per_grid_ts" not in collate(family, docs)
