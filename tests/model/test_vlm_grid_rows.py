"""Grid families whose items do not take ``t * h * w / merge`` placeholders each (``hf_hsap.multimodal.grid_rows``),
counted per item from the model and checked by the collator, naming the example:

- HunYuan-VL's and HY-V4-VL's encoders add rows of their own (a newline row per merged row, a begin and an end row
  per image): the counts fitted from the encoder agree with what ``get_image_features`` / ``get_video_features``
  split per item, for grids the fit never saw; HunYuan-VL's text model takes its rotary rows alone;
- VideoLLaMA3 merges each item by its own ``image_merge_sizes`` / ``video_merge_sizes`` and drops the video rows its
  ``video_compression_mask`` marks: the mask is carried per item and applied to each item's rows.

The SP runs of these families (an image split across ranks) are in ``test_vlm_zoo.py`` (PER_ITEM).
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

import hf_hsap
from hf_hsap.multimodal.grid_rows import vision_geometry
from hf_hsap.multimodal.select import keep_rows

from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD

_MODELS: dict[str, torch.nn.Module] = {}


def model_of(family: str) -> torch.nn.Module:
    if family not in _MODELS:
        _MODELS[family] = VC.build_model(VC.tiny_config(family), "eager", torch.float64)
    return _MODELS[family]


def docs_of(family: str) -> list[dict[str, Any]]:
    model = model_of(family)
    return VD.documents(model.config, model)


def encoder_rows(family: str, name: str, grid: list[int], **extra: Any) -> int:
    """What the model's own ``get_{name}_features`` returns for one item of ``grid`` (flattened zero pixels)."""
    model = model_of(family)
    c, _, patch, frames = vision_geometry(model.config.vision_config)
    pixels = torch.zeros(grid[0] * grid[1] * grid[2], c * frames * patch * patch, dtype=torch.float64)
    key = "pixel_values" if name == "image" else "pixel_values_videos"
    with torch.no_grad():
        out = getattr(model.model, f"get_{name}_features")(**{key: pixels, f"{name}_grid_thw": torch.tensor([grid])},
                                                            **extra, return_dict=True).pooler_output
    return sum(int(v.shape[0]) for v in out)


@pytest.mark.parametrize("family,name,grids", [
    ("hunyuan_vl", "image", [[1, 8, 8], [1, 4, 2], [1, 6, 10]]),  # H * (W + 1) + 2
    ("hy_v4_vl", "image", [[1, 8, 8], [1, 2, 6]]),  # t * H * (W + 1)
    ("hy_v4_vl", "video", [[2, 4, 4], [3, 6, 2]])])
def test_fitted_counts_are_the_encoders_rows(family: str, name: str, grids: list[list[int]]) -> None:
    spec = hf_hsap.vision_spec(model_of(family))
    assert spec.counts(name)
    got = spec.item_tokens(name, {f"{name}_grid_thw": torch.tensor(grids)})
    assert got == [encoder_rows(family, name, g) for g in grids]
    assert got[0] != grids[0][0] * grids[0][1] * grids[0][2] // spec.layout.merge  # not the fixed rule


def test_hunyuan_takes_its_rotary_rows_alone_and_packs_exactly_counted_documents() -> None:
    model = model_of("hunyuan_vl")
    spec = hf_hsap.vision_spec(model)
    assert spec.layout.rope_rows_only
    assert not hf_hsap.vision_spec(model_of("hy_v4_vl")).layout.rope_rows_only  # HY-V4-VL takes [4, B, L]
    docs = docs_of("hunyuan_vl")
    batch = hf_hsap.PackingCollator(128, vision=spec)(docs)
    assert batch["position_ids"].shape[0] == 4  # the documents are read from row 0
    local = hf_hsap.shard_batch(batch, None)
    assert local["position_ids"].shape[0] == 3  # the model gets its 3 rotary rows


def test_hunyuan_refuses_a_multi_frame_item_and_a_miscounted_document() -> None:
    spec = hf_hsap.vision_spec(model_of("hunyuan_vl"))
    docs = docs_of("hunyuan_vl")
    bad = dict(docs[0], image_grid_thw=torch.tensor([[2, 8, 4]]))  # the same pixel rows as two frames
    with pytest.raises(ValueError, match=r"example 1: its image grids \[\[2, 8, 4\]\] have more than one frame"):
        hf_hsap.PackingCollator(256, vision=spec)([docs[1], bad])
    token = spec.layout.modalities[0].token_id
    at = int(torch.nonzero(docs[0]["input_ids"] == token)[0])  # one placeholder fewer: 21 for the image's 22 rows
    short = {k: (torch.cat([v[:at], v[at + 1:]]) if k in ("input_ids", "labels", "mm_token_type_ids") else v)
             for k, v in docs[0].items()}
    with pytest.raises(ValueError, match=r"example 0: its image \(1x8x8\) takes 22 placeholders by the model's count "
                                         r"but the document holds 21"):
        hf_hsap.PackingCollator(256, vision=spec)([short])


def test_video_llama3_counts_each_item_by_its_merge_size_and_keep_mask() -> None:
    spec = hf_hsap.vision_spec(model_of("video_llama_3"))
    image, video = spec.layout.modalities
    assert "image_merge_sizes" in image.item_keys and video.keep_key == "video_compression_mask"
    grids = torch.tensor([[1, 4, 4], [1, 4, 8]])
    assert spec.item_tokens("image", {"image_grid_thw": grids, "image_merge_sizes": torch.tensor([1, 2])}) == [16, 8]
    assert [encoder_rows("video_llama_3", "image", g.tolist(), image_merge_sizes=torch.tensor([m]))
            for g, m in zip(grids, (1, 2))] == [16, 8]
    docs = docs_of("video_llama_3")
    batch = hf_hsap.PackingCollator(256, vision=spec)(docs)
    masks = [d["video_compression_mask"] for d in docs if "video_compression_mask" in d]
    keep = batch["video_compression_mask"]  # [videos, most rows]: each video's mask, False past its rows
    assert keep.shape == (2, 8) and keep[0].tolist() == masks[0].tolist() and keep[1, :4].tolist() == masks[1].tolist()
    assert not bool(keep[1, 4:].any())
    ids = batch["input_ids"]
    assert int((ids == video.token_id).sum()) == int(keep.sum()) == 9  # 6 + 3 kept rows
    feats = [torch.arange(8.0)[:, None], torch.arange(4.0)[:, None]]  # two items' encoder rows
    out = keep_rows(type("Out", (), {"pooler_output": tuple(feats)})(), keep, "video")
    assert [v.reshape(-1).tolist() for v in out.pooler_output] == [[0, 1, 2, 3, 5, 7], [0, 1, 3]]


def test_video_llama3_refuses_a_keep_mask_of_other_rows_naming_the_example() -> None:
    spec = hf_hsap.vision_spec(model_of("video_llama_3"))
    docs = docs_of("video_llama_3")
    bad = dict(docs[1], video_compression_mask=torch.ones(7, dtype=torch.bool))  # its video has 8 rows
    with pytest.raises(ValueError, match=r"example 0: video_compression_mask has 7 entries but its 1 videos' encoder "
                                         r"rows are 8"):
        hf_hsap.PackingCollator(256, vision=spec)([bad])
    no_sizes = {k: v for k, v in docs[1].items() if k != "video_merge_sizes"}
    with pytest.raises(ValueError, match=r"example 0: its videos have no video_merge_sizes"):
        hf_hsap.PackingCollator(256, vision=spec)([no_sizes])


def test_a_rope_index_of_other_than_three_rotary_rows_is_refused() -> None:
    config = VC.tiny_config("hunyuan_vl")
    config.text_config.rope_parameters["mrope_section"] = [2, 2, 2, 2]  # 4 axes: 1-D, then width, height, image
    model = VC.build_model(config, "eager", torch.float64)
    with pytest.raises(hf_hsap.multimodal.VisionRefusal, match=r"its rope index gives 4 rotary rows .* packed rows "
                                                               r"carry 3 per token") as info:
        hf_hsap.vision_spec(model)
    assert info.value.kind == "input not carried" and "one document per row" in str(info.value)
