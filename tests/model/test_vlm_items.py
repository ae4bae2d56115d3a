"""Families whose images carry per-item metadata, on packed rows: documents with two images of different sizes
(LLaVA-NeXT's any-resolution tiles, Mistral 3's Pixtral sizes), videos beside any-resolution images (LLaVA-NeXT-Video,
LLaVA-OneVision), each exact at sp1 and under SP 2 against every document run alone (float64, the multimodal zoo's
harness, ``tests/workers/vlm_zoo*.py``); and bad per-item input refused by the collator, naming the document.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import hf_hsap
from workers import vlm_zoo as VZ
from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD
from workers import vlm_zoo_run

_BUILT: dict[str, tuple[Any, torch.nn.Module, dict[str, torch.Tensor]]] = {}


def built(family: str) -> tuple[Any, torch.nn.Module, dict[str, torch.Tensor]]:
    """``(config, float64 SDPA model, its weights)`` of the zoo's tiny model (built once)."""
    if family not in _BUILT:
        config = VC.tiny_config(family)
        model = VC.build_model(config, "sdpa", VZ.DTYPE)
        _BUILT[family] = config, model, {k: v.detach().clone() for k, v in model.state_dict().items()}
    return _BUILT[family]


def pad_cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate on axis 0, zero-padding every other axis at its end (as a processor pads a batch)."""
    shape = [max(p.shape[d] for p in parts) for d in range(parts[0].dim())]
    out = []
    for p in parts:
        widths = [w for d in reversed(range(1, p.dim())) for w in (0, shape[d] - p.shape[d])]
        out.append(F.pad(p, widths))
    return torch.cat(out)


def two_image_documents(family: str) -> list[dict[str, Any]]:
    """The zoo's documents with the first two images in one document (their sizes differ)."""
    config, model, _ = built(family)
    docs = VD.documents(config, model)
    a, b = docs[0], docs[1]
    assert a["pixel_values"].shape != b["pixel_values"].shape  # tiles or sizes differ: the padding is exercised
    both = {"input_ids": torch.cat([a["input_ids"], b["input_ids"]]), "labels": torch.cat([a["labels"], b["labels"]]),
            "pixel_values": pad_cat([a["pixel_values"], b["pixel_values"]]),
            "image_sizes": torch.cat([a["image_sizes"], b["image_sizes"]])}
    return [both, *docs[2:]]


def exact(family: str, docs: list[dict[str, Any]], pools: vlm_zoo_run.PoolManager, mode: str,
          split: bool = True) -> None:
    """The packed row of ``docs`` is exact at sp1 and in ``mode`` (with ``split``: an item split across the ranks)
    against each document alone."""
    config, _, state = built(family)
    ref = VZ.documents_alone(config, state, docs, "sdpa")
    tol = VZ.tolerance(family)
    got = VZ.packed_run(family, state, docs, "library", "sp1")
    res = {"sp1": VZ.combine(ref, [{"ok": True, **got}], tol)}
    for (_, m), records in vlm_zoo_run.run_sp_jobs(pools, family, state, docs, [("library", mode)]).items():
        res[m] = records if isinstance(records, dict) else VZ.combine(ref, records, tol)
    assert set(res) == {"sp1", mode}
    for m, r in res.items():
        assert r["outcome"] == "exact", (family, m, r)
    assert (res[mode]["split"] > 0) == split, res[mode]


@pytest.fixture(scope="module")
def vlm_pools(pools):
    """The harness's pool manager over the session's pool of 2 ranks (SP 2 without DP)."""
    manager = vlm_zoo_run.PoolManager(world=2, pools=pools)
    yield manager
    manager.close()


@pytest.mark.parametrize("family", ["llava_next", "mistral3"])
def test_a_document_with_two_images_of_different_sizes_is_exact(family: str, vlm_pools) -> None:
    docs = two_image_documents(family)
    spec = hf_hsap.vision_spec(built(family)[1])
    counts = spec.item_tokens("image", docs[0])
    assert len(counts) == 2 and counts[0] != counts[1]
    assert sum(counts) == int((docs[0]["input_ids"] == spec.layout.modalities[0].token_id).sum())
    exact(family, docs, vlm_pools, "sp2_u1")


def test_deepstack_features_per_decoder_layer_are_exact_with_an_image_split(vlm_pools) -> None:
    """Granite 4 Vision: any-resolution tiles pooled by Q-Formers (the counter applies ``downsample_rate``), each
    image's features added at several decoder layers (``deepstack_features``: ``(layer, per-image rows)`` pairs, each
    cut to the rank's own rows); its decoder's config (``Granite4VisionTextConfig``) is a decoder's, not an encoder's."""
    from hf_hsap.integrations.encoder_attention import is_encoder_config

    config, model, _ = built("granite4_vision")
    assert not is_encoder_config(config.text_config) and is_encoder_config(config.vision_config)
    assert len(config.deepstack_layer_map) + len(config.spatial_target_layers) > 1
    docs = two_image_documents("granite4_vision")
    spec = hf_hsap.vision_spec(model)
    counts = spec.item_tokens("image", docs[0])
    assert len(counts) == 2 and counts[0] != counts[1]
    assert sum(counts) == int((docs[0]["input_ids"] == spec.layout.modalities[0].token_id).sum())
    exact("granite4_vision", docs, vlm_pools, "sp2_u1")


@pytest.mark.parametrize("family", ["llava_next_video", "llava_onevision"])
def test_videos_beside_any_resolution_images_are_exact(family: str, vlm_pools) -> None:
    config, model, _ = built(family)
    docs = VD.with_videos(config, model, VD.documents(config, model))
    assert sum("pixel_values_videos" in d for d in docs) == 3
    exact(family, docs, vlm_pools, "sp2_u2")


# (family, SP 2 mode, whether an item is split there): grids split only past two ranks (Qwen-VL's split videos:
# tests/model/test_vlm.py at SP 4)
@pytest.mark.parametrize("family,mode,split", [("video_llava", "sp2_u1", True), ("cosmos3_omni", "sp2_u1", False)])
def test_videos_of_a_family_the_rule_carries_them_for_are_exact(family: str, mode: str, split: bool,
                                                                 vlm_pools) -> None:
    """Videos carried by derivation (``get_video_features`` takes the video, and its grid, only; the model marks
    them with the video token): Video-LLaVA's frame stacks (encoded frame by frame) beside its images, Cosmos 3's
    video grids beside its image grids."""
    config, model, _ = built(family)
    docs = VD.documents(config, model)  # a grid family's zoo documents carry videos already (VD.grid_video)
    if not any("pixel_values_videos" in d for d in docs):
        docs = VD.with_videos(config, model, docs, every=1)
    assert sum("pixel_values_videos" in d for d in docs) >= 2 and any("pixel_values" in d for d in docs)
    assert [m.name for m in hf_hsap.vision_spec(model).layout.modalities] == ["image", "video"]
    exact(family, docs, vlm_pools, mode, split)


def collate(family: str, docs: list[dict[str, Any]]) -> dict[str, Any]:
    return hf_hsap.PackingCollator(512, vision=hf_hsap.vision_spec(built(family)[1]))(docs)


def test_packed_batch_carries_each_image_s_placeholders_and_padded_tiles() -> None:
    docs = two_image_documents("llava_next")
    batch = collate("llava_next", docs)
    counts = batch["hsap_vision_tokens"]["image"]
    token = hf_hsap.vision_spec(built("llava_next")[1]).layout.modalities[0].token_id
    assert int(counts.sum()) == int((batch["input_ids"] == token).sum())
    n_images = sum(d["pixel_values"].shape[0] for d in docs if "pixel_values" in d)
    assert tuple(batch["pixel_values"].shape[:2]) == (n_images, max(d["pixel_values"].shape[1] for d in docs
                                                                    if "pixel_values" in d))
    assert batch["image_sizes"].shape == (n_images, 2)


def test_missing_image_sizes_is_refused_naming_the_document() -> None:
    docs = two_image_documents("mistral3")
    del docs[2]["image_sizes"]  # the third document holds an image
    assert "pixel_values" in docs[2]
    with pytest.raises(ValueError, match=r"example 2: its images have pixel_values but no image_sizes"):
        collate("mistral3", docs)


def test_placeholders_disagreeing_with_the_model_s_count_are_refused() -> None:
    docs = two_image_documents("llava_next")
    token = hf_hsap.vision_spec(built("llava_next")[1]).layout.modalities[0].token_id
    ids = docs[0]["input_ids"]
    keep = torch.ones(ids.numel(), dtype=torch.bool)
    keep[int(torch.nonzero(ids == token)[0])] = False
    docs[0]["input_ids"], docs[0]["labels"] = ids[keep], docs[0]["labels"][keep]
    with pytest.raises(ValueError, match=r"example 0: its 2 images take \d+\+\d+ placeholders by the model's count .* "
                                         r"but the document holds \d+ image placeholder tokens"):
        collate("llava_next", docs)


def test_image_sizes_of_the_wrong_length_are_refused() -> None:
    docs = two_image_documents("llava_next")
    docs[0]["image_sizes"] = docs[0]["image_sizes"][:1]
    with pytest.raises(ValueError, match=r"example 0: image_sizes has 1 entries for its 2 image\(s\)"):
        collate("llava_next", docs)


def test_onevision_refuses_a_document_with_several_images() -> None:
    docs = two_image_documents("llava_onevision")
    with pytest.raises(ValueError, match=r"example 0: llava_onevision encodes the 2 images of one document without "
                                         r"tiles .*give each document at most one image"):
        collate("llava_onevision", docs)


def test_videos_of_different_frame_counts_are_refused() -> None:
    config, model, _ = built("llava_next_video")
    docs = VD.with_videos(config, model, VD.documents(config, model))
    three = VD.with_videos(config, model, VD.documents(config, model), frames=3)
    docs[2] = three[2]
    with pytest.raises(ValueError, match=r"example 2 holds 12 placeholder tokens \(id \d+\) per video where example 0 "
                                         r"holds 8"):
        collate("llava_next_video", docs)


def test_idefics_tiles_of_another_size_are_refused() -> None:
    config, model, _ = built("idefics3")
    docs = VD.documents(config, model)
    docs[1]["pixel_attention_mask"] = docs[1]["pixel_attention_mask"][..., :4]
    with pytest.raises(ValueError, match=r"example 1: its pixel_attention_mask rows are 1x16x4 where example 0.s are "
                                         r"1x16x16"):
        collate("idefics3", docs)


def test_llava_with_a_pixtral_tower_is_exact_at_sp1(monkeypatch) -> None:
    from transformers import PixtralVisionConfig

    config = VC.tiny_config("llava")
    config.vision_config = PixtralVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                               num_attention_heads=2, head_dim=16, image_size=16, patch_size=2)
    config.vision_feature_layer, config.vision_feature_select_strategy = -1, "full"  # Pixtral has no CLS
    model = VC.build_model(config, "sdpa", VZ.DTYPE)
    spec = hf_hsap.vision_spec(model)
    assert spec.layout.counted == ("image",) and spec.layout.modalities[0].item_keys == ("image_sizes",)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    docs = VD.documents(config, model, examples=False)  # Pixtral's images of their own sizes
    assert len({tuple(d["pixel_values"].shape) for d in docs if "pixel_values" in d}) > 1
    ref = VZ.documents_alone(config, state, docs, "sdpa")
    tiny = VC.tiny_config
    monkeypatch.setattr(VC, "tiny_config", lambda family: config if family == "llava" else tiny(family))
    got = VZ.packed_run("llava", state, docs, "library", "sp1")
    res = VZ.combine(ref, [{"ok": True, **got}], VZ.TOL)
    assert res["outcome"] == "exact", res
