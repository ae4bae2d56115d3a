"""Audio-language families (``hf_hsap.multimodal.audio``) on packed rows: what the model tells the spec.

Through the multimodal zoo's harness (``tests/workers/vlm_zoo*.py``: float64, logits and every parameter gradient
against each document alone, 4 documents of one audio clip each), each way of counting a clip's placeholders once, at
sp1 and in one SP 2 mode that splits a clip across the ranks: Qwen2-Audio (its inline encoder given a
``get_audio_features``: ``audio_inline``), MusicFlamingo (each clip given its own placeholder run), AudioFlamingo 3 (the tower's own
``_get_feat_extract_output_lengths`` on the real frames of ``input_features_mask``), Voxtral (fixed-length clips, no
mask: the same placeholders per clip), FunASR-Nano (a frame mask and rows computed inline: the document's placeholder
runs) and Granite Speech (the forward masks the encoder's output rows: applied before the cut; its conformer's
BatchNorm: each clip encoded alone, as every family's clips are). Without a run: which families the rule takes, the
placeholder runs, the refusals, and which encoders' clips are padded (GLM-ASR's tower attends to the padding).
"""
from __future__ import annotations

import pytest
import torch

from hf_hsap.multimodal import VisionRefusal, vision_spec
from hf_hsap.multimodal.audio import placeholder_runs

from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD
from workers import vlm_zoo_run


@pytest.fixture(scope="module")
def vlm_pools(pools):
    """The harness's pool manager over the session's pool of 2 ranks (SP 2 without DP)."""
    manager = vlm_zoo_run.PoolManager(world=2, pools=pools)
    yield manager
    manager.close()


def test_audio_families_are_the_causal_lms_with_an_audio_encoder() -> None:
    families = VC.audio_families()
    assert {"audioflamingo3", "voxtral", "granite_speech", "glmasr", "qwen3_asr", "qwen2_audio"} <= set(families)
    assert not {"whisper", "speech_to_text", "speecht5"} & set(families)  # no get_audio_features
    assert not set(families) & set(VC.vision_families())  # the omni thinkers run with their images
    assert VC.families() == VC.vision_families() + families


# each way of counting a clip's placeholders, with the SP 2 mode whose plan splits a clip across the two ranks
# (all but the first in the slow half, which CI runs too)
AUDIO = [("audioflamingo3", "sp2_u1")] + [
    pytest.param(family, mode, marks=pytest.mark.slow) for family, mode in (
        ("voxtral", "sp2_u1"), ("fun_asr_nano", "sp2_u1"), ("granite_speech", "sp2_u2"),
        ("qwen2_audio", "sp2_u1"),  # Qwen2-Audio: its inline encoder given a get_audio_features (audio_inline)
        ("musicflamingo", "sp2_u2"))]  # MusicFlamingo: each clip given its own run


@pytest.mark.parametrize("family,mode", AUDIO)
def test_audio_family_is_exact_at_sp1_and_sp2(family: str, mode: str, vlm_pools) -> None:
    config = VC.tiny_config(family)
    model = VC.build_model(config, "sdpa", torch.float64)
    spec = vision_spec(model)
    assert [m.name for m in spec.layout.modalities] == ["audio"]
    docs = VD.documents(config, model)
    assert len(docs) == 4 and all(d[spec.layout.modalities[0].pixel_key].shape[0] == 1 for d in docs)
    rec = vlm_zoo_run.run_family(family, vlm_pools, modes=("sp1", mode))
    assert rec["status"] == "run" and rec["spec"] == {"outcome": "accepted"}, rec.get("spec")
    assert rec["section"] == "audio-text"
    assert set(rec["results"]) == {"sp1", mode}
    for m, res in rec["results"].items():
        assert res["outcome"] == "exact", (m, res)
        assert max(res["err"]["logits"], res["err"]["loss"], res["err"]["grads"]) <= rec["tol"]
    assert rec["results"][mode]["split"] == 2  # both ranks hold part of one clip


def test_inline_audio_encoder_is_installed_and_undone() -> None:
    """Qwen2-Audio encodes its clips inside its forward: prepare_vision gives its inner model the equivalent
    get_audio_features (rows of each clip's real frames, as the forward keeps them) and a pre-hook that places them;
    undo removes both, and the model's own forward gives the same logits as the prepared one."""
    from hf_hsap.model_state import ModelChanges
    from hf_hsap.multimodal.select import prepare_vision
    from hf_hsap.multimodal.structure import inner_vlm

    config = VC.tiny_config("qwen2_audio")
    model = VC.build_model(config, "sdpa", torch.float64)
    inner = inner_vlm(model)
    assert inner is model.model and "get_audio_features" not in inner.__dict__
    doc = VD.documents(config, model)[0]
    batch = {k: (v[None] if k == "input_ids" else v) for k, v in doc.items()
             if k in ("input_ids", "input_features", "feature_attention_mask")}
    with torch.no_grad():
        own = model(**batch).logits
    changes = ModelChanges()
    assert prepare_vision(model, changes)
    assert callable(inner.__dict__["get_audio_features"])
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, own)
    changes.undo()
    assert "get_audio_features" not in inner.__dict__ and not inner._forward_pre_hooks


def test_run_windows_index_each_item_in_its_placeholder_run() -> None:
    import numpy as np

    from hf_hsap.multimodal.shard import _run_windows

    # placeholders at 1-4 (items of 2 and 2: one run), 7-8 (a new run), 9 (joined to it)
    where = torch.tensor([1, 2, 3, 4, 7, 8, 9])
    assert _run_windows(where, np.array([2, 2, 2, 1])).tolist() == [0, 1, 0, 1]
    assert _run_windows(torch.tensor([1, 3]), np.array([1, 1])).tolist() == [0, 0]


def test_clip_encoded_with_its_window_in_its_run() -> None:
    """MusicFlamingo time-stamps each window of a long sample by its index in the sample's one placeholder run: the
    second window encoded alone (as the last of two copies) gives the rows the model gives it after the first."""
    from hf_hsap.multimodal.audio import encode_per_clip
    from hf_hsap.multimodal.structure import inner_vlm

    config = VC.tiny_config("musicflamingo")
    model = VC.build_model(config, "sdpa", torch.float64)
    inner = inner_vlm(model)
    docs = VD.documents(config, model)[:2]
    feats = torch.cat([d["input_features"] for d in docs])
    mask = torch.cat([d["input_features_mask"] for d in docs])
    frames = max(int(d["input_features"].shape[-1]) for d in docs)
    assert all(d["input_features"].shape[-1] == frames for d in docs)
    tokens = [int((d["input_ids"] == config.audio_token_id).sum()) for d in docs]
    with torch.no_grad():
        whole = inner.get_audio_features(feats, mask, input_ids=torch.full((1, sum(tokens)), config.audio_token_id),
                                         return_dict=True).pooler_output
        runs = {"token_id": config.audio_token_id, "tokens": torch.tensor(tokens), "windows": torch.tensor([0, 1])}
        alone = encode_per_clip(inner.get_audio_features, (feats, mask),
                                {"input_ids": torch.zeros(1, 3, dtype=torch.long), "return_dict": True},
                                runs=runs).pooler_output
        first = encode_per_clip(inner.get_audio_features, (feats, mask),
                                {"input_ids": torch.zeros(1, 3, dtype=torch.long), "return_dict": True},
                                runs={**runs, "windows": torch.tensor([0, 0])}).pooler_output
    assert torch.allclose(alone, whole, atol=1e-12, rtol=0)
    assert not torch.allclose(first[tokens[0]:], whole[tokens[0]:])  # the window index changes the rows


def test_clips_are_padded_only_where_the_encoder_ignores_padding() -> None:
    """AudioFlamingo 3's tower masks padded frames: a row's clips are padded to its longest; GLM-ASR's takes the frame
    mask for counting only (its tower attends to the padding): its clips keep their frames, and a row of clips of
    different frames is refused by the collator."""
    import hf_hsap

    padded = {}
    for family in ("audioflamingo3", "glmasr"):
        config = VC.tiny_config(family)
        model = VC.build_model(config, "sdpa", torch.float64)
        spec = vision_spec(model)
        padded[family] = spec.layout.modalities[0].padded
        if family == "glmasr":
            docs = VD.documents(config, model)[:2]
            docs[1] = {**docs[1], "input_features": docs[1]["input_features"][..., :64],
                       "input_features_mask": docs[1]["input_features_mask"][..., :64]}
            with pytest.raises(ValueError, match="example 1: its input_features rows are 16x64 where example 0"):
                hf_hsap.PackingCollator(200, vision=spec)(docs)
    assert padded == {"audioflamingo3": ("input_features", "input_features_mask"), "glmasr": ()}


def test_placeholder_runs_count_each_clip() -> None:
    a, t = 7, 1
    assert placeholder_runs(torch.tensor([t, a, a, a, t, t, a, a, t]), a) == [3, 2]
    assert placeholder_runs(torch.tensor([a, a, t, a]), a) == [2, 1]
    assert placeholder_runs(torch.tensor([t, t]), a) == []


@pytest.mark.parametrize("family,kind,words", [
    # Voxtral Realtime adds its audio rows to every text position (streaming), with no placeholder to fill
    ("voxtral_realtime", "no placeholder", "no audio_token_id / audio_token_index"),
])
def test_audio_family_refusal_names_its_structure(family: str, kind: str, words: str) -> None:
    model = VC.build_model(VC.tiny_config(family), "sdpa")
    with pytest.raises(VisionRefusal, match=words) as e:
        vision_spec(model)
    assert e.value.kind == kind
    assert "one document per row" in str(e.value)
