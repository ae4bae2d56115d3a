"""Families whose image encoder takes per-item inputs besides the pixels, derived from the model by ``vision_spec``:
MiniCPM-V's NaViT crops (``target_sizes``, pixels along the last axis), LFM2-VL's NaFlex patches (``spatial_shapes``,
``pixel_attention_mask``), DeepSeek-VL-Hybrid's high-resolution view, the Q-Former families' prompts
(InstructBLIP's ``qformer_input_ids``) and their required pixels on a rank without an image, Kimi-K2.5's merge
kernel and Fuyu's linear patch embedding. What the packed batch
carries and what it refuses, on the multimodal zoo's tiny models (their exactness in every SP mode:
``tests/model/test_vlm_zoo.py`` PER_ITEM, ``scripts/vlm_zoo.py``).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import hf_hsap
from hf_hsap.data.vision import Modality, VisionLayout
from hf_hsap.multimodal import ROWS_KEY, shard_vision
from workers import vlm_zoo as VZ
from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD

_BUILT: dict[str, tuple[Any, torch.nn.Module]] = {}


def built(family: str) -> tuple[Any, torch.nn.Module]:
    """``(config, float64 SDPA model)`` of the zoo's tiny model (built once)."""
    if family not in _BUILT:
        config = VC.tiny_config(family)
        _BUILT[family] = config, VC.build_model(config, "sdpa", VZ.DTYPE)
    return _BUILT[family]


def docs_and_spec(family: str) -> tuple[list[dict[str, Any]], Any]:
    config, model = built(family)
    return VD.documents(config, model), hf_hsap.vision_spec(model)


def test_navit_crops_are_packed_along_the_pixel_row_with_their_sizes() -> None:
    docs, spec = docs_and_spec("minicpmv4_6")
    image = spec.layout.modalities[0]
    assert (image.grid_key, image.grid_dims, image.pixel_axis, spec.layout.merge) == ("target_sizes", 2, 3, 16)
    batch = hf_hsap.PackingCollator(512, vision=spec)(docs)
    with_image = [d for d in docs if "pixel_values" in d]
    assert batch["pixel_values"].shape[3] == sum(d["pixel_values"].shape[3] for d in with_image)
    assert torch.equal(batch["target_sizes"], torch.cat([d["target_sizes"] for d in with_image]))
    cells = int(batch["target_sizes"].to(torch.int64).prod(dim=1).sum())
    assert int((batch["input_ids"] == image.token_id).sum()) == cells // 16  # 4x4 patches per placeholder


def test_navit_pixels_that_do_not_match_the_crop_sizes_are_refused() -> None:
    docs, spec = docs_and_spec("minicpmv4_6")
    docs[1]["pixel_values"] = docs[1]["pixel_values"][..., :-2]  # one patch column short
    with pytest.raises(ValueError, match=r"example 1: pixel_values holds \d+ entries along axis 3 \(2 per cell\) but "
                                         r"its image grids ask for \d+ \(h\*w of 16x16\)"):
        hf_hsap.PackingCollator(512, vision=spec)(docs)


def test_naflex_images_are_counted_from_their_spatial_shapes() -> None:
    docs, spec = docs_and_spec("lfm2_vl")
    batch = hf_hsap.PackingCollator(512, vision=spec)(docs)
    shapes = torch.cat([d["spatial_shapes"] for d in docs if "spatial_shapes" in d])
    assert batch["hsap_vision_tokens"]["image"].tolist() == (shapes // 2).prod(dim=1).tolist()
    assert batch["pixel_attention_mask"].sum(dim=1).tolist() == shapes.prod(dim=1).tolist()


def test_high_resolution_views_travel_with_their_images() -> None:
    docs, spec = docs_and_spec("deepseek_vl_hybrid")
    assert spec.layout.modalities[0].item_keys == ("high_res_pixel_values",)
    batch = hf_hsap.PackingCollator(512, vision=spec)(docs)
    assert torch.equal(batch["high_res_pixel_values"], torch.cat([d["high_res_pixel_values"] for d in docs
                                                                  if "high_res_pixel_values" in d]))


def test_an_image_without_its_high_resolution_view_is_refused() -> None:
    docs, spec = docs_and_spec("deepseek_vl_hybrid")
    for doc in docs:  # missing from every document (not only beside documents that give it)
        doc.pop("high_res_pixel_values", None)
    with pytest.raises(ValueError, match=r"example 0: its images have pixel_values but no high_res_pixel_values"):
        hf_hsap.PackingCollator(512, vision=spec)(docs)


def test_qformer_prompts_are_padded_and_masked() -> None:
    docs, spec = docs_and_spec("instructblip")
    batch = hf_hsap.PackingCollator(512, vision=spec)(docs)
    lengths = [d["qformer_input_ids"].shape[1] for d in docs if "qformer_input_ids" in d]
    assert len(set(lengths)) > 1  # prompts of different lengths: the padding is exercised
    assert batch["qformer_input_ids"].shape == (len(lengths), max(lengths))
    assert batch["qformer_attention_mask"].sum(dim=1).tolist() == lengths


def test_a_qformer_prompt_without_its_mask_is_refused() -> None:
    docs, spec = docs_and_spec("instructblip")
    del docs[1]["qformer_attention_mask"]
    with pytest.raises(ValueError, match=r"example 1: its images have pixel_values but no qformer_attention_mask"):
        hf_hsap.PackingCollator(512, vision=spec)(docs)


def test_kimi_s_grid_merges_its_kernel_and_fuyu_s_patches_are_uniform() -> None:
    kimi = hf_hsap.vision_spec(built("kimi_k25")[1])
    assert kimi.layout.merge == 4 and kimi.layout.modalities[0].grid_key == "image_grid_thw"  # a 2 x 2 kernel
    docs, fuyu = docs_and_spec("fuyu")
    image = fuyu.layout.modalities[0]
    assert (image.grid_key, image.item_keys, fuyu.layout.counted) == (None, (), ())
    batch = hf_hsap.PackingCollator(512, vision=fuyu)(docs)
    patches = sum(d["pixel_values"].shape[1] for d in docs if "pixel_values" in d)
    assert int((batch["input_ids"] == image.token_id).sum()) == patches  # one placeholder per patch



class _TwoRanks:
    """An offline plan of 2 ranks over 10 tokens: rank 0 holds the first 6, rank 1 the rest."""

    size, rank, sp, cost = 2, 1, None, None

    def shard(self, x: torch.Tensor, dim: int = 0, rank: int | None = None) -> torch.Tensor:
        return x[:6] if rank == 0 else x[6:]

@pytest.mark.parametrize("required", [False, True])
def test_a_rank_without_an_image_gets_one_only_where_the_forward_requires_pixels(required: bool) -> None:
    image = Modality("image", 9, "pixel_values")
    layout = VisionLayout("blip-2", (image,), empty_items=required)
    ids = torch.tensor([1, 9, 9, 2, 9, 9, 3, 4, 5, 6])  # two images of 2 placeholders, then text
    pixels = torch.arange(2 * 3 * 2 * 2, dtype=torch.float64).reshape(2, 3, 2, 2)
    local = shard_vision({"pixel_values": pixels}, layout, ids, _TwoRanks(), rank=1)  # rank 1: text only
    if not required:
        assert "pixel_values" not in local and local[ROWS_KEY] == {}
        return
    assert torch.equal(local["pixel_values"], pixels[:1])  # one image encoded, none of its rows kept
    rows = local[ROWS_KEY]
    assert rows["image"].numel() == 0 and rows["image:items"].tolist() == [2]
    assert np.array_equal(rows["image"].numpy(), np.zeros(0, dtype=np.int64))
