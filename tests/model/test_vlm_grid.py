"""Grid-layout vision-language families (``hf_hsap.multimodal.grid``) on packed rows: what the model tells the spec.

Through the multimodal zoo's harness (``tests/workers/vlm_zoo*.py``: float64, logits and every parameter gradient
against each document alone), each new capability once, at sp1 and in one SP 4 mode that splits an image or video
across ranks: Qwen3.5 (a gated-delta-rule hybrid decoder with its own rope index) with images and videos, GLM-4V's
videos (frames that use the image placeholder, carried as images), GLM-4.5V-MoE (multimodal rotary rows handed to
its attention layers) and the Qwen2.5-Omni thinker (a rope index without token types, positions only with an
attention mask, audios carried per audio). Without a model: the frame rewrite and the attention layout's reading of multimodal positions.
"""
from __future__ import annotations

import pytest
import torch

from hf_hsap.integrations.local_layout import layout_same_length
from hf_hsap.multimodal import vision_spec
from hf_hsap.multimodal.grid import frames_as_images

from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD
from workers import vlm_zoo_run


@pytest.fixture(scope="module")
def vlm_pools4(pools):
    """The harness's pool manager over the session's pool of 4 ranks (SP 4 without DP)."""
    manager = vlm_zoo_run.PoolManager(world=4, pools=pools)
    yield manager
    manager.close()


# each new capability with the SP 4 mode whose plan splits an item across ranks
GRID = [("qwen3_5", "sp4_u1"), ("glm4v", "sp4_u2"), ("glm4v_moe", "sp4_u1"), ("qwen2_5_omni_thinker", "sp4_u2")]


@pytest.mark.parametrize("family,mode", GRID)
def test_grid_family_with_videos_is_exact_at_sp1_and_sp4(family: str, mode: str, vlm_pools4) -> None:
    config = VC.tiny_config(family)
    model = VC.build_model(config, "sdpa", torch.float64)
    docs = VD.documents(config, model)
    assert sum("pixel_values_videos" in d for d in docs) == 2 and sum("pixel_values" in d for d in docs) >= 2
    spec = vision_spec(model)
    names = {m.name for m in spec.layout.modalities}
    assert "video" in names or spec.document is not None
    if family.endswith("omni_thinker"):  # and audios, padded to the row's longest, counted by the audio tower
        assert "audio" in names and sum("input_features" in d for d in docs) == 2
    rec = vlm_zoo_run.run_family(family, vlm_pools4, modes=("sp1", mode))
    assert rec["status"] == "run" and rec["spec"] == {"outcome": "accepted"}, rec.get("spec")
    assert set(rec["results"]) == {"sp1", mode}
    for m, res in rec["results"].items():
        assert res["outcome"] == "exact", (m, res)
        assert max(res["err"]["logits"], res["err"]["loss"], res["err"]["grads"]) <= rec["tol"]
    assert rec["results"][mode]["split"] >= 2  # at least two ranks hold part of one item


def test_frames_as_images_keeps_placeholder_order() -> None:
    """A document ``video (2 frames), image``: the frames come first, each a [1, h, w] image, then the image."""
    img, txt = 9, 1
    ids = torch.tensor([txt, img, img, txt, img, img, txt, img, img, img, img, txt])
    types = torch.tensor([0, 2, 2, 0, 2, 2, 0, 1, 1, 1, 1, 0])
    video = torch.arange(16.0).reshape(16, 1)  # grid (2, 2, 4): 8 rows a frame, 2 placeholders (merge 4)
    image = 100 + torch.arange(16.0).reshape(16, 1)  # grid (1, 4, 4)
    doc = {"input_ids": ids, "mm_token_type_ids": types, "pixel_values": image,
           "image_grid_thw": torch.tensor([[1, 4, 4]]), "pixel_values_videos": video,
           "video_grid_thw": torch.tensor([[2, 2, 4]])}
    out = frames_as_images(img)(doc, 0)
    assert "pixel_values_videos" not in out and "video_grid_thw" not in out
    assert out["image_grid_thw"].tolist() == [[1, 2, 4], [1, 2, 4], [1, 4, 4]]
    assert torch.equal(out["pixel_values"], torch.cat([video, image]))
    assert out["mm_token_type_ids"].tolist() == [0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1, 0]
    with pytest.raises(ValueError, match="example 3: 2 video placeholder runs"):
        frames_as_images(img)({**doc, "video_grid_thw": torch.tensor([[3, 2, 4]])}, 3)
    with pytest.raises(ValueError, match="no mm_token_type_ids"):
        frames_as_images(img)({k: v for k, v in doc.items() if k != "mm_token_type_ids"}, 0)


def test_attention_layout_reads_multimodal_positions() -> None:
    """Rotary rows [t, h, w] (GLM-4.5V-MoE hands them to its layers) mark no documents; [text, t, h, w]: the text
    row does."""
    text = torch.tensor([[0, 1, 2, 0, 1, 2]])
    mrope = torch.tensor([[0, 1, 1, 1, 1, 2]]).expand(3, 1, 6)  # an image's tokens share positions
    assert layout_same_length(1, 6, mrope, None, torch.device("cpu")).cu_q == (0, 6)
    four = torch.cat([text[None], mrope])
    assert layout_same_length(1, 6, four, None, torch.device("cpu")).cu_q == (0, 3, 6)

