"""Vision-language models on packed image / video + text rows: exact at one process and under SP.

Every check compares with the same model run on each document alone (float64, SDPA: Transformers' eager attention
takes its softmax in float32, so it is not a float64 reference): logits of every token, the loss and every
parameter's gradient (vision tower included) of ``loss + sum(w * logits)``, relative error <= 1e-9, through
``shard_batch(batch, sp)`` + ``model(**local)``; SP runs include an image split across ranks.
"""
from __future__ import annotations

import pytest
import torch

from helpers import rel_err
from workers import vlm as W

TOL = 1e-9
# Qwen-VL's vision tower applies its rotary embedding in float32 (apply_rotary_pos_emb_vision casts q, k), so an
# image encoded in another batch moves its features by float32 rounding: a float32 island in a float64 model. Gemma's
# RMSNorm normalises in float32 (Gemma3RMSNorm upcasts x).
ISLAND_TOL = {"qwen2_vl": 1e-7, "qwen2_5_vl": 1e-7, "qwen3_vl": 1e-7, "gemma3": 1e-6}
TIMEOUT_S = 240
_REFERENCES: dict = {}


def reference(family: str, video: bool) -> dict:
    key = (family, video)
    if key not in _REFERENCES:
        _REFERENCES[key] = W.documents_alone(family, video)
    return _REFERENCES[key]


def check(family: str, results: list[dict], video: bool = False) -> None:
    check_against(reference(family, video), family, results)


def check_against(ref: dict, family: str, results: list[dict]) -> None:
    """Every rank's ``results`` against the documents alone ``ref``: logits, loss, every gradient (the tower's)."""
    tol = ISLAND_TOL.get(family, TOL)
    tower = [g for n, g in ref["grads"].items() if "vision" in n or "visual" in n]
    assert tower and any(float(g.abs().max()) > 1e-6 for g in tower)  # the vision tower's gradients are tested
    real = results[0]["real"]
    logits = torch.full((max(int(r["index"].max()) for r in results) + 1, ref["logits"].shape[-1]), float("nan"),
                        dtype=ref["logits"].dtype)
    for r in results:
        logits[r["index"]] = r["logits"]
    assert rel_err(logits[:real], ref["logits"]) <= tol  # a NaN left (a token no rank produced) fails
    for r in results:
        assert r["num_items"] == ref["n_items"]
        assert r["layers"] == 2  # the decoder's attention layers only, not the vision tower's
        assert abs(r["loss"] - ref["loss"]) <= tol * ref["loss"]
        assert set(r["grads"]) >= set(ref["grads"])
        for name, g in ref["grads"].items():
            if float(g.abs().max()) < 1e-12:  # zero in exact arithmetic (a key bias: softmax ignores it)
                assert float(r["grads"][name].abs().max()) < 1e-12, (family, name)
            else:
                assert rel_err(r["grads"][name], g) <= tol, (family, name)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "gemma3"])
def test_sp1_packed_images_match_documents_alone(family: str) -> None:
    check(family, [W.vlm_forward_backward(family, 1)])


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_sp1_packed_video_matches_documents_alone(family: str) -> None:
    check(family, [W.vlm_forward_backward(family, 1, video=True)], video=True)


@pytest.mark.parametrize("family,ulysses,placement", [("qwen2_5_vl", 1, "auto"), ("qwen3_vl", 1, "contiguous"),
                                                      ("llava", 1, "auto"), ("gemma3", 1, "contiguous"),
                                                      ("qwen2_5_vl", 2, "auto"), ("gemma3", 2, "contiguous")])
def test_sp2_packed_images_match_documents_alone(family: str, ulysses: int, placement: str, pools) -> None:
    results = pools(2, TIMEOUT_S).run(W.vlm_forward_backward, family, 2, ulysses, placement)
    check(family, results)
    if family == "gemma3" and ulysses == 1:  # the contiguous cut fell inside an image: moved to the image's edge
        assert all(r["placement"] == "contiguous+whole_blocks" for r in results)


@pytest.mark.parametrize("family,ulysses,video", [("qwen2_5_vl", 1, False), ("qwen3_vl", 2, False),
                                                  ("llava", 2, False), ("qwen2_5_vl", 2, True), ("qwen3_vl", 1, True),
                                                  ("gemma3", 1, False), ("gemma3", 2, False)])
def test_sp4_packed_images_match_documents_alone(family: str, ulysses: int, video: bool, pools) -> None:
    results = pools(4, TIMEOUT_S).run(W.vlm_forward_backward, family, 4, ulysses, "auto", video)
    check(family, results, video)
    if family == "gemma3":  # its images are bidirectional blocks, kept whole inside one part (test_blocks.py)
        return
    key = "video" if video else ("pixel" if family == "llava" else "image")
    items = len(W.VIDEO_SHAPES if video else [s for s in W.SHAPES if s[1] is not None])
    # an item held by two ranks: encoded by both (more local items than items), or once and its rows sent
    assert sum(r["local_items"].get(key, 0) for r in results) > items or sum(r["received"] for r in results) > 0


@pytest.mark.parametrize("family,kv_token_cost", [("qwen3_vl", None), ("gemma3", 1e6)])
def test_sp4_default_degree_from_the_text_config(family: str, kv_token_cost: float | None, pools) -> None:
    """No degree given, the model's config in HSAPConfig: the group is per_batch over the decoder's heads (degrees
    1, 2 and 4 of 4 heads) and the row, at the degree it ran at, matches the documents alone; priced with moving
    a key/value token dearer than anything else, the row runs at Ulysses itself (U = 4)."""
    cost = None if kv_token_cost is None else {"kv_token_cost": kv_token_cost}
    results = pools(4, TIMEOUT_S).run(W.vlm_forward_backward, family, 4, None, "auto", False, cost)
    check(family, results)
    assert all(r["degrees"] == [1, 2, 4] for r in results)
    assert len({r["ulysses"] for r in results}) == 1
    if cost is not None:
        assert results[0]["ulysses"] == 4


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "gemma3"])
def test_check_model_probe_runs_an_image(family: str) -> None:
    """check_model's SP probe runs an image through the vision tower and finds the kwargs on both decoder layers."""
    from hf_hsap.examples import tiny_vlm
    from hf_hsap.integrations.encoder_attention import is_encoder_module
    from hf_hsap.integrations.model_check import _calls_attention_interface
    from hf_hsap.integrations.plan_relay import probe_attention

    model = tiny_vlm(family)
    encoder_calls = []
    for m in model.modules():
        if _calls_attention_interface(m) and is_encoder_module(m):
            m.register_forward_pre_hook(lambda *a: encoder_calls.append(1))
    decoder = [m for m in model.modules() if _calls_attention_interface(m) and not is_encoder_module(m)]
    probe = probe_attention(model, decoder)
    assert (probe.layers, probe.unreached, probe.accepts, probe.no_positions) == (2, (), True, ())
    assert encoder_calls  # the probe's image went through the vision tower


def test_gemma3_images_outside_shard_batch_are_refused() -> None:
    """Gemma 3's image blocks given to model(...) directly: without token_type_ids they would be causal (refused
    by prepare_model's hook); with them, "hsap"'s mask refuses the overlay; both name shard_batch."""
    from hf_hsap.examples import tiny_vlm, vlm_documents

    import hf_hsap

    model = tiny_vlm("gemma3")
    hf_hsap.prepare_model(model)
    doc = vlm_documents(model.config, [(3, (1, 4, 4), 5)])[0]
    for extra in ({}, {"token_type_ids": doc["token_type_ids"][None]}):
        with pytest.raises(ValueError, match="shard_batch"):
            model(input_ids=doc["input_ids"][None], pixel_values=doc["pixel_values"], use_cache=False, **extra)


def test_a_model_not_prepared_is_refused() -> None:
    """shard_batch's image rows reaching the attention mean no prepare_model ran (check_model alone changes
    nothing): refused, naming it."""
    from hf_hsap.examples import tiny_vlm, vlm_documents

    import hf_hsap

    model = tiny_vlm("qwen2_5_vl")
    batch = hf_hsap.PackingCollator(64, vision=hf_hsap.vision_spec(model))(
        vlm_documents(model.config, [(3, (1, 4, 4), 5)]))
    hf_hsap.check_model(model)
    with pytest.raises(ValueError, match="prepare_model"):
        model(**hf_hsap.shard_batch(batch, 1))


def test_an_encoder_whose_rows_per_item_differ_from_the_placeholders_is_refused() -> None:
    """The batch's layout says 4 and 4 placeholders; an encoder giving 3 and 5 rows (a family whose images do not
    map to a fixed count) is refused instead of splitting the features at the wrong row."""
    from types import SimpleNamespace

    from hf_hsap.multimodal import select_rows

    per_item = SimpleNamespace(pooler_output=(torch.zeros(3, 8), torch.zeros(5, 8)))
    with pytest.raises(ValueError, match="fixed number of placeholders"):
        select_rows(per_item, torch.arange(8), torch.tensor([4, 4]))
    fix = "train x with one document per row (no packing: ..., attn_implementation='eager')"
    with pytest.raises(ValueError, match=r"attn_implementation='eager'\)\)$"):  # the model's own fix, named
        select_rows(per_item, torch.arange(8), torch.tensor([4, 4]), advice=fix)
    ok = SimpleNamespace(pooler_output=(torch.zeros(4, 8), torch.ones(4, 8)))
    assert select_rows(ok, torch.tensor([7, 0]), torch.tensor([4, 4])).pooler_output[0][:, 0].tolist() == [1.0, 0.0]


def test_a_pad_token_that_is_a_placeholder_is_refused() -> None:
    from hf_hsap.examples import tiny_vlm

    import hf_hsap

    model = tiny_vlm("llava")
    with pytest.raises(ValueError, match="pad_token_id"):
        hf_hsap.PackingCollator(64, pad_token_id=model.config.image_token_id, vision=hf_hsap.vision_spec(model))


def test_videos_of_a_layout_without_videos_are_refused() -> None:
    """A layout that carries no videos (a family whose videos are not carried) refuses packed videos instead of
    dropping them."""
    from hf_hsap.data.vision import Modality, VisionLayout, check_pixel_keys

    layout = VisionLayout("some_vlm", (Modality("image", 5, "pixel_values", "image_grid_thw", ("image_grid_thw",)),))
    check_pixel_keys(layout, ["input_ids", "pixel_values"])
    with pytest.raises(ValueError, match="one document per row"):
        check_pixel_keys(layout, ["input_ids", "pixel_values", "pixel_values_videos"])


def test_chunked_loss_on_a_vlm_is_exact_and_never_holds_the_logits() -> None:
    """The memory levers' chunked loss on a packed VLM row: the float64 loss and every gradient of the full-logits
    loss, and a tensor peak below the full logits' (a vocabulary large enough for the logits to dominate)."""
    import torch.nn.functional as F

    from benchmarks.tensor_memory import TensorPeak
    from hf_hsap.examples import tiny_vlm, vlm_documents
    from hf_hsap.integrations import hsap_model_loss

    import hf_hsap

    def step(levers: bool) -> tuple[float, dict, int]:
        model = tiny_vlm("qwen2_5_vl", torch.float64, vocab_size=8192)
        hf_hsap.prepare_model(model, levers=hf_hsap.MemoryLevers(loss_tile_tokens=16) if levers else None)
        docs = vlm_documents(model.config, [(30, (1, 8, 8), 20), (25, (1, 4, 4), 10)], dtype=torch.float64)
        local = hf_hsap.shard_batch(hf_hsap.PackingCollator(128, vision=hf_hsap.vision_spec(model))(docs), 1)
        with TensorPeak() as peak:
            if levers:
                loss = hsap_model_loss(model, local, local["num_items_in_batch"])
            else:
                logits = model(**local).logits[0]
                loss = F.cross_entropy(logits, local["shift_labels"][0], reduction="sum") / local["num_items_in_batch"]
            loss.backward()
        return float(loss.detach()), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, \
            peak.peak_bytes

    loss, grads, peak = step(True)
    ref_loss, ref_grads, ref_peak = step(False)
    assert abs(loss - ref_loss) <= 1e-12 * ref_loss
    assert set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        assert float((grads[name] - g).abs().max()) <= 1e-10 * max(float(g.abs().max()), 1e-6), name
    assert peak < ref_peak - 128 * 8192 * 8 // 2  # at least half the float64 [tokens, vocab] logits less
