"""CI subset of the multimodal zoo (``tests/workers/vlm_zoo*.py``; the full sweep is ``scripts/vlm_zoo.py`` -> the
"Multimodal models" section of MODELS.md and ``benchmarks/results/vlm_zoo.json``).

Families run through the harness: Qwen2.5-VL, accepted by ``vision_spec``, exact at sp1 and at SP 2 against
each document alone (float64, its vision tower's float32 island tolerance); every family whose images carry
per-item metadata (any-resolution tiles, Pixtral's image sizes, Idefics' images per row with pixel masks) or whose
encoder takes per-item inputs (MiniCPM-V's crop sizes, LFM2-VL's spatial shapes, DeepSeek-VL-Hybrid's high-resolution
view, InstructBLIP's Q-Former prompts, Kosmos-2's per-token image mask, InstructBLIP-Video's frames), exact at sp1 and in one SP 2 mode with an image split across the ranks,
PaliGemma's prefix-LM blocks among them; Mllama's and Idefics' cross-attention with a document split across the ranks;
and a family refused by ``vision_spec`` with a fix that runs (one document per row). The committed results have no
WRONG and no crash, are what ``vision_spec`` derives now (slow: every zoo family built), and MODELS.md's section is
what the script renders from them.
"""
from __future__ import annotations

import importlib.util
import json
import pathlib
from typing import Any

import pytest
import transformers

from hf_hsap.multimodal import accepted_families

from workers import vlm_zoo as VZ
from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD
from workers import vlm_zoo_run

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "vlm_zoo.json"


def _script():
    spec = importlib.util.spec_from_file_location("vlm_zoo_script", ROOT / "scripts" / "vlm_zoo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    """``scripts/vlm_zoo.py`` as a module (render, write_section, family_status)."""
    return _script()


@pytest.fixture(scope="module")
def vlm_pools(pools):
    """The harness's pool manager over the session's pool of 2 ranks (SP 2 without DP)."""
    manager = vlm_zoo_run.PoolManager(world=2, pools=pools)
    yield manager
    manager.close()


def test_accepted_family_is_exact_at_sp1_and_sp2(vlm_pools, script) -> None:
    rec = vlm_zoo_run.run_family("qwen2_5_vl", vlm_pools, modes=("sp1", "sp2_u1"))
    assert rec["status"] == "run" and rec["spec"] == {"outcome": "accepted"}
    assert rec["fix"] is True and rec["reference"] == "sdpa"
    assert rec["tol"] == VZ.ISLAND_TOL["qwen2_5_vl"]
    assert set(rec["results"]) == {"sp1", "sp2_u1"}
    for mode, res in rec["results"].items():
        assert res["outcome"] == "exact", (mode, res)
        assert max(res["err"]["logits"], res["err"]["loss"], res["err"]["grads"]) <= rec["tol"]
    assert script.family_status(rec) == "exact"


def _slow(family: str, mode: str) -> Any:
    """A family's run in the slow half (``-m slow``, which CI runs too): the default suite keeps one family per
    mechanism of the first rounds; each later mechanism has its own fast unit test."""
    return pytest.param(family, mode, marks=pytest.mark.slow)


# the families of per-item keys, each with one SP mode that splits an image across the two ranks
PER_ITEM = [("llava_next", "sp2_u1"), ("llava_next_video", "sp2_u1"), ("llava_onevision", "sp2_u1"),
            ("mistral3", "sp2_u2"), ("lighton_ocr", "sp2_u1"), ("idefics2", "sp2_u2"), ("idefics3", "sp2_u1"),
            ("smolvlm", "sp2_u2"), ("granite_docling", "sp2_u1"),
            ("paligemma", "sp2_u2"),  # PaliGemma: each document's image + prompt prefix is a bidirectional block
            # per-item encoder inputs derived from the model: NaViT crops with their own rope index, NaFlex patches,
            # a second (high-resolution) view, Q-Former prompts padded with their masks
            ("minicpmv4_7", "sp2_u1"), ("lfm2_vl", "sp2_u2"), ("deepseek_vl_hybrid", "sp2_u1"),
            ("instructblip", "sp2_u2"), ("fuyu", "sp2_u1"),  # Fuyu: patch embeddings cut from the last hidden state
            # grids counted per item from the model: the encoder's own rows (newline, begin and end rows), and merge
            # sizes per item with a video's token-compression mask
            _slow("hunyuan_vl", "sp2_u1"), _slow("video_llama_3", "sp2_u1"),
            # no placeholder id: images placed by a per-token mask (Kosmos-2), videos at a Q-Former's video token
            _slow("instructblipvideo", "sp2_u2"), _slow("kosmos-2", "sp2_u1"),
            # MoE routing types per token (placeholders and their start / end markers), videos merged in time
            _slow("ernie4_5_vl_moe", "sp2_u1"),
            # pooling rows per placeholder, crops per image, a bidirectional block over a document's image tokens
            _slow("molmo2", "sp2_u2"),
            # Inkling 2: one pixel row per placeholder (the grid counted in placeholders), a per-query relative
            # position bias and sinks, dynamic short convolutions, attention residuals over each token's layers
            _slow("inkling2", "sp2_u2"),
            _slow("gemma4_unified", "sp2_u2"),  # Gemma 4 unified: encoder-free merged patches, image blocks on every layer
            _slow("deepseek_ocr2", "sp2_u1")]  # DeepSeek-OCR 2: a tower of towers (SAM, then an encoder)


@pytest.mark.parametrize("family,mode", PER_ITEM)
def test_per_item_family_is_exact_at_sp1_and_sp2(family: str, mode: str, vlm_pools, script) -> None:
    rec = vlm_zoo_run.run_family(family, vlm_pools, modes=("sp1", mode))
    assert rec["status"] == "run" and rec["spec"] == {"outcome": "accepted"}, rec.get("spec")
    assert set(rec["results"]) == {"sp1", mode}
    for m, res in rec["results"].items():
        assert res["outcome"] == "exact", (m, res)
        assert max(res["err"]["logits"], res["err"]["loss"], res["err"]["grads"]) <= rec["tol"]
    assert rec["results"][mode]["split"] == 2  # both ranks hold part of one image
    assert script.family_status(rec) == "exact"


@pytest.mark.parametrize("family", ["mllama", "idefics"])
def test_cross_attention_family_is_exact_with_a_document_split_across_ranks(family: str, vlm_pools) -> None:
    """Mllama, Idefics: each token attends to its own document's images only (tokens before the image: Mllama evenly
    over them, Idefics gated to 0; Mllama's text-only document: not at all), its document's images on every rank
    holding one of its tokens."""
    config = VC.tiny_config(family)
    model = VC.build_model(config, "sdpa", VZ.DTYPE)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    # 35 + 9 + 7 tokens (Mllama; Idefics without placeholders): SP 2 cuts the first document (two images) in two
    docs = VD.documents(config, model, shapes=[(3, (1, 8, 8), 30), (5, None, 4), (2, (1, 4, 4), 4)])
    assert docs[0]["pixel_values"].shape[1] == 2
    assert ("pixel_values" in docs[1]) == (family == "idefics")  # Idefics runs no document without an image
    ref = VZ.documents_alone(config, state, docs, "sdpa")
    tol = VZ.tolerance(family)
    native = VZ.native_run(config, state, docs, "library", "sdpa")  # Transformers' own packed row is not exact
    assert VZ.compare(ref, [native], tol)["outcome"] == "WRONG"
    one = VZ.combine(ref, [{"ok": True, **VZ.packed_run(family, state, docs, "library", "sp1")}], tol)
    assert one["outcome"] == "exact", one
    got = vlm_zoo_run.run_sp_jobs(vlm_pools, family, state, docs, [("library", "sp2_u1")])[("library", "sp2_u1")]
    two = VZ.combine(ref, got, tol)
    assert two["outcome"] == "exact", two
    assert two["split"] == 2  # both ranks hold part of the first document and encode its images


def test_item_boundary_rows_are_exact_with_an_image_split_across_ranks(vlm_pools) -> None:
    """Ovis 2.5 writes a learned row over each image's start and end tokens: with the first document's image cut by
    SP 2, its start token lies on one rank and its end token on the other (hf_hsap.multimodal.indicators)."""
    config = VC.tiny_config("ovis2_5")
    model = VC.build_model(config, "sdpa", VZ.DTYPE)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    docs = VD.documents(config, model, shapes=[(3, (1, 8, 8), 30), (5, None, 4), (2, (1, 4, 4), 4)])
    ref = VZ.documents_alone(config, state, docs, "sdpa")
    tol = VZ.tolerance("ovis2_5")
    got = vlm_zoo_run.run_sp_jobs(vlm_pools, "ovis2_5", state, docs, [("library", "sp2_u1")])[("library", "sp2_u1")]
    two = VZ.combine(ref, got, tol)
    assert two["outcome"] == "exact", two
    assert two["split"] == 2  # both ranks hold part of the first image: its start on one, its end on the other


def test_refused_family_names_a_fix_that_runs(script, monkeypatch) -> None:
    # the zoo's refusals left are structural (no documents to try their fix on) or stochastic, so a refusal of an
    # accepted family (LLaVA) raised where vision_spec raises its own stands in for one: its fix is tried on its docs
    from hf_hsap.multimodal import spec as spec_module
    from hf_hsap.multimodal.structure import VisionRefusal, fix

    monkeypatch.setattr(spec_module, "structural_refusal", lambda model, inner: VisionRefusal(
        "input not carried", f"{model.config.model_type}: a stand-in refusal; {fix(model)}"))
    rec = vlm_zoo_run.run_family("llava", None, modes=("sp1",), probe=False)
    assert rec["status"] == "run" and rec["spec"]["outcome"] == "refused"
    assert "one document per row" in rec["spec"]["error"]
    assert rec["fix"] is True  # each document alone (what the refusal says to do) ran with SDPA
    assert rec["results"] == {} and "probe" not in rec
    assert script.family_status(rec) == "refused"


def test_a_wrong_gradient_is_flagged() -> None:
    import torch

    ref = {"logits": torch.ones(3, 4, dtype=torch.float64), "loss": 2.0, "n_items": 2,
           "grads": {"w": torch.tensor([1.0, 2.0], dtype=torch.float64), "b": torch.zeros(2, dtype=torch.float64)}}
    rec = {"index": torch.arange(3), "logits": ref["logits"].clone(), "loss": 2.0, "real": 3, "num_items": 2,
           "grads": {k: v.clone() for k, v in ref["grads"].items()}, "group": 0, "ok": True}
    assert VZ.combine(ref, [rec], VZ.TOL)["outcome"] == "exact"
    rec["grads"]["b"] = torch.tensor([0.0, 1e-6], dtype=torch.float64)  # zero in the reference
    assert VZ.combine(ref, [rec], VZ.TOL)["outcome"] == "WRONG"
    rec["grads"]["b"] = ref["grads"]["b"].clone()
    rec["num_items"] = 3  # a target counted twice
    assert VZ.combine(ref, [rec], VZ.TOL)["outcome"] == "WRONG"


def test_committed_results_have_no_wrong_and_no_crash(script) -> None:
    data = json.loads(RESULTS.read_text())
    if data["header"]["transformers"] == transformers.__version__:  # every family of the installed Transformers
        assert sorted(r["family"] for r in data["families"]) == sorted(VC.families())  # image- and audio-text
    run = [r for r in data["families"] if r["status"] == "run"]
    status = {r["family"]: script.family_status(r) for r in run}
    assert not {f: s for f, s in status.items() if s in ("WRONG", "crash")}
    for rec in run:  # every refusal by vision_spec names a fix
        if rec["spec"]["outcome"] == "refused":
            assert "one document per row" in rec["spec"]["error"] or "PackingCollator" in rec["spec"]["error"]


@pytest.mark.slow
def test_the_committed_results_are_what_vision_spec_derives_now(script) -> None:
    """The committed results were made with today's rule: every zoo family ``vision_spec`` accepts now was
    accepted there (and ran in every mode: exact, or refused by ``prepare_model`` in some), every family it
    refuses now was refused there."""
    import torch

    data = json.loads(RESULTS.read_text())
    run = {r["family"]: r for r in data["families"] if r["status"] == "run"}
    models = (VC.build_model(VC.tiny_config(f), VZ.reference_attention(VC.tiny_config(f)), torch.float32)
              for f in sorted(run))
    accepted = accepted_families(models)
    stale = {f: r["spec"]["outcome"] for f, r in run.items() if (f in accepted) != (r["spec"]["outcome"] == "accepted")}
    assert not stale, f"regenerate benchmarks/results/vlm_zoo.json (scripts/vlm_zoo.py): {stale}"
    for family in accepted:
        assert script.family_status(run[family]) in ("exact", "refused"), family


def test_every_refusal_names_a_fix_that_works() -> None:
    data = json.loads(RESULTS.read_text())
    bad = {r["family"]: r["fix"] for r in data["families"] if r["status"] == "run"
           and r["spec"]["outcome"] == "refused" and r["fix"] is not True and not r["fix"].startswith("not checked")}
    assert not bad, bad


def test_models_md_section_is_rendered_from_the_committed_results(script) -> None:
    data = json.loads(RESULTS.read_text())
    section = script.render(data["families"], data["header"])
    assert script.section_of(str(ROOT / "MODELS.md")) == section
    text = (ROOT / "MODELS.md").read_text()
    assert text.endswith(section)  # the section closes the file
    assert text.count(script.START) == 1


def test_write_section_replaces_only_the_section(tmp_path, script) -> None:
    path = tmp_path / "MODELS.md"
    before = "# Model zoo\n\n| a | b |\n| --- | --- |\n| x | ✓ |\n"
    path.write_text(before, encoding="utf-8")
    first = f"{script.START}\n## Multimodal models\n\nold\n{script.END}\n"
    script.write_section(str(path), first)
    assert path.read_text(encoding="utf-8") == before + "\n" + first
    second = first.replace("old", "new, longer")
    script.write_section(str(path), second)
    assert path.read_text(encoding="utf-8") == before + "\n" + second
