"""Multimodal zoo harness: every vision-language family of Transformers on packed image + text rows.

A family's tiny model (``vlm_zoo_configs.py``) and documents run, in float64, through
``PackingCollator(vision=spec)`` + ``shard_batch(batch, sp)`` + ``model(**local)`` ("hsap") in each mode of
:data:`MODES` (``sp1`` in one process, SP 2 / SP 4 with Ulysses 1 / 2 on 4 spawned gloo ranks, ``vlm_zoo_run.py``)
and are compared with the same weights on each document alone (SDPA, or eager where the family has no SDPA, as
``tests/workers/vlm.py`` does): logits of every token, the loss and every parameter gradient of
``loss + sum(w * logits)``. The spec is ``vision_spec(model)`` (``"library"``) or, for the families it refuses
(the probe), a plain spec of the layout the documents have: ``"uniform"`` (one pixel row per image, the same number
of placeholders per image, 1-D positions) or, for images with an ``image_grid_thw``, ``"grid"`` (the model's own
rope index): what lifting the refusal would give where the rest of the path already holds.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

import torch
import torch.nn.functional as F

import hf_hsap
from hf_hsap.data.vision import Modality, VisionLayout, VisionSpec
from hf_hsap.multimodal import structure as mm_structure
from hf_hsap.multimodal.grid import grid_spec
from hf_hsap.multimodal import ROWS_KEY, vision_spec
from hf_hsap.multimodal.cross import CROSS_KEY
from hf_hsap.multimodal.prefix import is_prefix_lm
from hf_hsap.testing import rel_err
from workers.vlm import PER_TOKEN as _PER_TOKEN
from workers.vlm import alone_backward, weights
from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD
from workers.vlm_zoo_images import feature_module
from workers import zoo

DTYPE = torch.float64
ENCODING_ENV = "HSAP_ZOO_VISION_ENCODING"  # HSAPConfig.vision_encoding of the SP modes (scripts/vlm_zoo.py)
# HSAPConfig.vision_balance of the SP modes ("1": the default, the plan weighs each rank's encoder work). The zoo's rows
# are laid out so that the decoder's plan splits an item across ranks, the case exactness must cover; the
# encoder-weighed plan may keep it whole, so the zoo plans the decoder alone unless told ("0", the default here)
BALANCE_ENV = "HSAP_ZOO_VISION_BALANCE"
MODES = {"sp1": (1, 1), "sp2_u1": (2, 1), "sp2_u2": (2, 2), "sp4_u1": (4, 1), "sp4_u2": (4, 2)}  # (SP, Ulysses)
SP_MODES = tuple(m for m, (p, _) in MODES.items() if p > 1)
TOL = 1e-9  # relative error of logits, loss and every gradient
# Float32 islands in a float64 model, each seen in the family's source. An image encoded in another batch (the
# packed row, a rank's local items) or split across ranks (encoded by both, its backward arriving as two partial
# sums) moves by float32 rounding: Qwen-VL-like vision towers apply their rotary embedding in float32
# (apply_rotary_pos_emb_vision casts q and k: Qwen2/2.5/3-VL, EXAONE 4.5, GLM-OCR, HyperCLOVA X's Qwen2.5-VL tower);
# Pixtral's tower (Mistral 3, LightOnOCR) normalizes in float32 (PixtralRMSNorm), and so does Idefics 2's perceiver
# resampler (Idefics2RMSNorm casts its input to float32; with that norm patched to float64 its SP 2 / SP 4 modes are
# exact to 1e-14). Gemma 3's text model normalizes in
# float32 (Gemma3RMSNorm casts x and the weight), so a norm weight's gradient is a float32 sum over the tokens, per
# document in the reference and over the packed row here; Transformers' own packed row of Gemma 3 is not exact
# (its image-block mask), so it cannot measure that (see tolerance). ShieldGemma 2 is Gemma 3's model class.
# Mllama's cross-attention normalizes its keys in float32 (MllamaTextRMSNorm casts its input, so the gradient into
# the vision states is rounded to float32 on each rank holding part of a document and summed after; with that norm
# patched to float64 its SP 4 modes are exact to 2e-15).
# PaddleOCR-VL's vision tower casts q, k to float32 for its rotary embedding as Qwen-VL's does, LFM3-VL's does that and
# normalizes in float32 (Lfm3VlRMSNorm): exact at sp1 and SP 2 (no image split there), off by ~5e-8 at SP 4 in the
# tower's gradients; with those casts kept in float64 every mode of both is exact to 2e-15.
# The omni thinkers' vision towers are Qwen2.5-VL's (float32 rotary: q, k cast and cos / sin from float32 freqs): the
# Qwen2.5-Omni thinker is off by 1.8e-7 at SP 4 / Ulysses 2 (an image split over 4 ranks), by 4e-9 with the q, k casts
# kept in float64 (the rest: the float32 frequencies), and exact to 1e-15 at sp1.
ISLAND_TOL = {"qwen2_vl": 1e-7, "qwen2_5_vl": 1e-7, "qwen3_vl": 1e-7, "qwen3_vl_moe": 1e-7, "exaone4_5": 1e-7,
              "glm_ocr": 1e-7, "hyperclovax_vision_v2": 1e-7, "mistral3": 1e-7, "lighton_ocr": 1e-7, "idefics2": 1e-7,
              "gemma3": 1e-6, "shieldgemma2": 1e-6, "paddleocr_vl": 1e-7, "lfm3_vl": 1e-7,
              "qwen2_5_omni_thinker": 1e-6, "qwen3_omni_moe_thinker": 1e-6}
ISLAND_TOL["mllama"] = 1e-7
# VideoLLaMA3's vision tower applies its rotary embedding in float32 as Qwen-VL's does (apply_rotary_pos_emb_vision
# casts q and k): off by up to 1e-7 at SP 4 (an image and a video split over the ranks: its key bias, whose gradient is
# float32 rounding only), exact to 2e-15 in every mode with the casts kept in float64.
ISLAND_TOL["video_llama_3"] = 1e-6
# ERNIE-4.5-VL's MoE routers score in float32 on purpose (Ernie4_5_VLMoeMoeTopKRouter: .float() of the states and its
# weight with autocast off, into a float32 router_logits buffer, so keeping those casts in float64 breaks its forward):
# its logits are bitwise exact in every mode, its gates' weight gradients float32 sums over other token sets (~2e-7).
ISLAND_TOL["ernie4_5_vl_moe"] = 1e-6
# Ovis 2.5's vision tower applies its rotary embedding in float32 as Qwen-VL's does (q, k cast): an image split over
# two ranks and encoded by both is off by ~8e-8 in the tower's gradients (exact to 1e-15 where it is encoded once).
ISLAND_TOL["ovis2_5"] = 1e-7
FLOAT32_ISLAND = 1e-5  # a native packed run off by less than this is off by float32 rounding (see tolerance)
ZERO = 1e-12  # a reference gradient below this is zero in exact arithmetic (e.g. a key bias: softmax ignores it)
SP_TIMEOUT_S = 15.0  # hf_hsap's communication timeout in the worker ranks (tiny models: a stalled peer raises)
_COMM_WORDS = ("HSAPCommError", "timeout", "Connection closed", "pair closure")
_GROUPS: dict = {}


def tolerance(family: str, native: dict[str, Any] | None = None) -> float:
    """The family's relative tolerance: :data:`TOL` (:data:`ISLAND_TOL` for a known float32 island), or 10x the
    error of Transformers' own packed-row run (:func:`native_run`, no hf_hsap) where that is above it but at float32
    rounding level (below :data:`FLOAT32_ISLAND`): the model computes a part in float32 (e.g. Gemma's and Cohere's
    norms cast to float32, so a weight's gradient is a float32 sum over the tokens, per document in the reference
    and over the packed row here).

    Args:
        family: the model type; native: :func:`native_run`'s outcome (``None``: not run).
    """
    tol = ISLAND_TOL.get(family, TOL)
    err = (native or {}).get("err")
    if not err or (native or {}).get("outcome") != "WRONG":
        return tol
    floor = max(err["logits"], err["loss"], err["grads"])
    return max(tol, float(f"{10 * floor:.0e}")) if floor < FLOAT32_ISLAND else tol


def probe_kind(model: torch.nn.Module, docs: list[dict[str, Any]]) -> str:
    """How to probe a family ``vision_spec`` refuses: ``"grid"`` (its images carry an ``image_grid_thw``, as
    Qwen-VL's), ``"uniform+keys"`` (other per-image keys, e.g. ``image_sizes``: a uniform spec that also carries
    them), ``"uniform+blocks"`` (its forward takes ``token_type_ids``, as Gemma 3's image blocks) or ``"uniform"``."""
    if any("image_grid_thw" in d for d in docs):
        return "grid"
    if item_keys(docs):
        return "uniform+keys"
    forward = inspect.signature(type(model).forward).parameters
    return "uniform+blocks" if "token_type_ids" in forward else "uniform"


def make_spec(model: torch.nn.Module, how: str, item_keys: tuple[str, ...] = ()) -> VisionSpec:
    """The collator's spec.

    Args:
        model: the model; how: ``"library"`` = :func:`vision_spec`; ``"uniform"`` = one pixel row per image
            (``"uniform+blocks"``: with image blocks and ``token_type_ids``, as Gemma 3); ``"grid"`` = a grid of
            flattened patches per image (images only: merge
            ``spatial_merge_size ** 2``, the model's own ``get_rope_index``); ``"uniform+keys"``: uniform, carrying
            ``item_keys`` too; item_keys: per-image keys besides the pixels and the grid.

    Raises:
        ValueError: ``vision_spec`` refuses the family, or the config has no image token id.
    """
    if how == "library":
        return vision_spec(model)
    family = model.config.model_type
    token = mm_structure.token(model.config, "image_token_id", "image_token_index")
    if token is None:
        raise ValueError(f"{family}: no image_token_id / image_token_index in its config")
    if how == "grid":  # what vision_spec gives a grid family (hf_hsap.multimodal.grid), the image's extra keys too
        inner = mm_structure.inner_vlm(model) or feature_module(model)
        video = mm_structure.token(model.config, "video_token_id", "video_token_index")
        spec = grid_spec(model, inner, family, token, video)
        image = dataclasses.replace(spec.layout.modalities[0], item_keys=("image_grid_thw", *item_keys))
        layout = dataclasses.replace(spec.layout, modalities=(image, *spec.layout.modalities[1:]))
        return dataclasses.replace(spec, layout=layout)
    blocks = how == "uniform+blocks"
    keys = item_keys if how == "uniform+keys" else ()
    prefix = blocks and is_prefix_lm(model)  # PaliGemma: each document's prefix is the block, not its image
    layout = VisionLayout(family, (Modality("image", token, "pixel_values", None, keys),),
                          image_blocks=blocks and not prefix, prefix_blocks=prefix)
    return VisionSpec(layout, token_type_key="token_type_ids" if blocks else None)


def item_keys(docs: list[dict[str, Any]]) -> tuple[str, ...]:
    """The per-image keys of the documents besides the pixels, the grid and the per-token keys."""
    skip = {"pixel_values", "image_grid_thw", "labels", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts",
            "video_second_per_grid", "input_features", "feature_attention_mask", "input_features_mask", *_PER_TOKEN}
    return tuple(sorted({k for d in docs for k in d if k not in skip}))


def reference_attention(config: Any) -> str:
    """``"sdpa"`` where the family supports it, else ``"eager"`` (its softmax kept in float64)."""
    try:
        VC.build_model(config, "sdpa", DTYPE)
        return "sdpa"
    except ValueError:
        return "eager"


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in model.named_parameters()}


def documents_alone(config: Any, state: dict[str, torch.Tensor], docs: list[dict[str, Any]], attn: str
                    ) -> dict[str, Any]:
    """Each document alone (the collator's row order): logits ``[T, V]``, loss and gradients of
    ``loss + sum(w * logits)`` (float64, softmax kept in float64).

    Args:
        config: the tiny config; state: its weights; docs: the documents; attn: ``"sdpa"`` or ``"eager"``.
    """
    with zoo.full_precision(config, DTYPE):
        model = VC.build_model(config, attn, DTYPE, state_dict=state)
        logits, loss, n_items = alone_backward(model, docs)
    return {"logits": logits, "loss": loss, "n_items": n_items, "grads": _grads(model)}


def native_run(config: Any, state: dict[str, torch.Tensor], docs: list[dict[str, Any]], how: str, attn: str
               ) -> dict[str, Any]:
    """Transformers' own packed row (no hf_hsap): the collator's batch (``position_ids`` restarting per document,
    pixels in document order) straight into the ``attn`` model, compared with :func:`documents_alone`.

    Returns:
        :func:`compare`'s outcome with the reference.
    """
    from hf_hsap.multimodal import vision_keys

    with zoo.full_precision(config, DTYPE):
        model = VC.build_model(config, attn, DTYPE, state_dict=state)
        spec = make_spec(model, how, item_keys(docs))
        real = sum(d["input_ids"].numel() for d in docs)
        batch = hf_hsap.PackingCollator(real, vision=spec)(docs)
        keys = {"input_ids", "position_ids", spec.token_type_key} | vision_keys(spec.layout)
        inputs = {k: v for k, v in batch.items() if k in keys and torch.is_tensor(v)}
        logits = model(**inputs, use_cache=False).logits[0]
        labels = batch["labels"][0]
        ce = F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum")
        n_items = int((labels[1:] != -100).sum())
        loss = ce / n_items
        (loss + (logits * weights(logits.shape[0], logits.shape[-1], real)).sum()).backward()
    return {"index": torch.arange(logits.shape[0]), "logits": logits.detach(), "loss": float(loss.detach()),
            "real": real, "num_items": n_items, "grads": _grads(model), "group": 0, "ok": True}


def get_sp(sp_size: int, ulysses: int) -> Any:
    """This worker's SP groups for ``(sp_size, ulysses)`` (created once; DP over the rest of the world)."""
    key = (sp_size, ulysses)
    if key not in _GROUPS:
        _GROUPS[key] = hf_hsap.init_sequence_parallel(sp_size, ulysses_size=ulysses, timeout_s=SP_TIMEOUT_S)
    return _GROUPS[key]


def hsap_model(config: Any, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The model built with ``attn_implementation="hsap"``, or, where a tower picks its attention class from a
    table without it at construction (SAM's ``SAM_VISION_ATTENTION_CLASSES``: DeepSeek-VL-Hybrid), with the
    reference's: ``prepare_model`` then gives the decoder ``"hsap"`` (the path for a model loaded with SDPA)."""
    try:
        return VC.build_model(config, "hsap", DTYPE, state_dict=state)
    except KeyError as e:
        if "hsap" not in str(e):
            raise
        return VC.build_model(config, reference_attention(config), DTYPE, state_dict=state)


def packed_run(family: str, state: dict[str, torch.Tensor], docs: list[dict[str, Any]], how: str, mode: str
               ) -> dict[str, Any]:
    """One rank of a mode: the packed row through ``shard_batch`` + ``model(**local)`` ("hsap").

    Returns:
        ``{"group", "index" [T_local], "logits" [T_local, V], "loss", "num_items", "real", "split"}`` (split:
        whether this rank holds part of an image or video only, 0 / 1 per modality) and, on SP rank 0, ``"grads"``
        (summed over the SP group).
    """
    import torch.distributed as dist

    sp_size, ulysses = MODES[mode]
    sp = get_sp(sp_size, ulysses) if sp_size > 1 else 1
    config = VC.tiny_config(family)
    with zoo.full_precision(config, DTYPE):
        model = hsap_model(config, state)
        spec = make_spec(model, how, item_keys(docs))
        layers = hf_hsap.prepare_model(model, sp_size=sp_size).check.attention_layers
        real = sum(d["input_ids"].numel() for d in docs)
        batch = hf_hsap.PackingCollator(real, pad_to_multiple_of=sp_size, vision=spec)(docs)
        encoding = os.environ.get(ENCODING_ENV, "auto")  # scripts/vlm_zoo.py --vision-encoding
        balance = os.environ.get(BALANCE_ENV, "0") == "1"
        local = hf_hsap.shard_batch(batch, sp, config=sp.config.replace(vision_encoding=encoding,
                                                                        vision_balance=balance)
                                    if sp_size > 1 else None)
        idx = local["hsap_plan"].local_token_indices(None if sp_size > 1 else 0)
        rows = local.get(ROWS_KEY, {})
        got = {m: rows[f"{m}:exchange"].recv_rows if f"{m}:exchange" in rows else 0 for m in rows if ":" not in m}
        # holds part of an item: encodes more rows than it keeps, or receives rows of one encoded once elsewhere
        split = sum(int(rows[f"{m}:items"].sum()) > rows[m].numel() - got[m] or got[m] > 0 for m in got)
        moved = sum(got.values())  # rows this rank received
        if local.get(CROSS_KEY) is not None:  # cross-attention: a document with images partly on this rank
            split = cross_split(local[CROSS_KEY], batch["cu_seq_lens_q"], idx)
        out = model(**local)
        hf_hsap.check_plan_used(local, expected_layers=layers)  # as the trainers call it
        logits = out.logits[0]
        loss = F.cross_entropy(logits, local["shift_labels"][0], ignore_index=-100, reduction="sum") / \
            local["num_items_in_batch"]
        w = weights(batch["input_ids"].numel(), logits.shape[-1], real)[idx]
        (loss + (logits * w).sum()).backward()
    grads, loss = _grads(model), loss.detach().clone()
    if sp_size > 1:
        for g in grads.values():
            dist.all_reduce(g, group=sp.group)
        dist.all_reduce(loss, group=sp.group)
    group = dist.get_rank() // sp_size if sp_size > 1 else 0
    res = {"group": group, "index": idx, "logits": logits.detach(), "loss": float(loss), "real": real,
           "num_items": int(local["num_items_in_batch"]), "split": split, "moved": moved}
    if sp_size == 1 or sp.rank == 0:
        res["grads"] = grads
    return res


def cross_split(docs: Any, cu: torch.Tensor, idx: torch.Tensor) -> int:
    """1 when this rank holds part (not all) of a document with images (its images encoded here and elsewhere).

    Args:
        docs: the rank's ``CrossDocs``; cu: ``[n + 1]`` documents; idx: ``[T_local]`` global token indices.
    """
    doc = torch.searchsorted(cu.to(idx.device), idx, right=True) - 1
    with_images = docs.ranges[:, 1] > docs.ranges[:, 0]
    held = torch.bincount(doc[with_images], minlength=cu.numel() - 1)
    length = cu[1:] - cu[:-1]
    return int(bool(((held > 0) & (held < length)).any()))


def worker_jobs(family: str, state: dict[str, torch.Tensor], docs: list[dict[str, Any]],
                jobs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """DistPool task: run ``jobs`` (``(how, mode)`` of :data:`SP_MODES`) on this rank, one after the other.

    A failure is recorded (``zoo.classify``), not raised. When a job failed other than identically on every rank
    (a rank refused inside the forward while its peers wait in a collective, a communication timeout), the
    groups may be out of step: the remaining jobs are not run and the last record says ``"dirty": True`` (the
    caller starts a fresh pool).
    """
    import torch.distributed as dist

    import transformers

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    out = []
    for how, mode in jobs:
        try:
            rec = {"job": (how, mode), "ok": True, **packed_run(family, state, docs, how, mode)}
        except Exception as e:  # noqa: BLE001 - every failure is a result
            rec = {"job": (how, mode), "ok": False, **zoo.classify(e)}
            sp = _GROUPS.get(MODES[mode])
            if getattr(sp, "pending_plan_use", None) is not None:  # a failed forward's unchecked plan record
                sp.pending_plan_use = None
        errors: list = [None] * dist.get_world_size()
        dist.all_gather_object(errors, rec.get("error"))
        out.append(rec)
        if any(errors) and (len(set(errors)) > 1 or any(w in errors[0] for w in _COMM_WORDS)):
            rec["dirty"] = True
            break
    return out


def compare(ref: dict[str, Any], records: list[dict[str, Any]], tol: float) -> dict[str, Any]:
    """``exact`` or ``WRONG`` of one mode's records (one SP group's ranks) against the reference.

    Returns:
        ``{"outcome", "err": {"logits", "loss", "grads", "worst_grad"}}``; a token no rank produced, a wrong
        target count or a gradient that should be zero and is not makes the error infinite.
    """
    real = records[0]["real"]
    logits = torch.full((max(int(r["index"].max()) + 1 for r in records), ref["logits"].shape[-1]), float("nan"),
                        dtype=DTYPE)
    for r in records:
        logits[r["index"]] = r["logits"].to(DTYPE)
    grads = next(r["grads"] for r in records if "grads" in r)
    g_err = {}
    for name, g in ref["grads"].items():
        mine = grads.get(name)
        if mine is None:
            g_err[name] = float("inf")
        elif float(g.abs().max()) < ZERO:
            g_err[name] = 0.0 if float(mine.abs().max()) < ZERO else float("inf")
        else:
            g_err[name] = rel_err(mine, g)
    worst = max(g_err, key=g_err.get) if g_err else ""
    loss_err = abs(records[0]["loss"] - ref["loss"]) / abs(ref["loss"])
    if any(r["num_items"] != ref["n_items"] for r in records):
        loss_err = float("inf")
    err = {"logits": rel_err(logits[:real], ref["logits"]), "loss": loss_err, "grads": g_err.get(worst, 0.0),
           "worst_grad": worst}
    ok = max(err["logits"], err["loss"], err["grads"]) <= tol
    return {"outcome": "exact" if ok else "WRONG", "err": err}


def combine(ref: dict[str, Any], records: list[dict[str, Any]], tol: float) -> dict[str, Any]:
    """One mode's outcome from every rank's record: the first refusal or crash (a root cause, not a peer's
    communication timeout), else the worst SP group compared with the reference."""
    failed = [r for r in records if not r["ok"]]
    if failed:
        root = [r for r in failed if "HSAPCommError" not in r["error"]] or failed
        pick = next((r for r in root if r["outcome"] == "refused"), root[0])
        res = {k: pick[k] for k in ("outcome", "error", "traceback") if k in pick}
        if len(failed) < len(records):
            res["error"] += f" (on {len(failed)} of {len(records)} ranks)"
        return res
    worst: dict[str, Any] = {"outcome": "exact"}
    for g in sorted({r["group"] for r in records}):
        res = compare(ref, [r for r in records if r["group"] == g], tol)
        if worst["outcome"] == "exact":
            worst = res
    worst["split"] = sum(r.get("split", 0) for r in records if r["group"] == 0)  # group 0's ranks holding part of an item
    worst["moved"] = sum(r.get("moved", 0) for r in records if r["group"] == 0)  # feature rows group 0 sent (once)
    return worst
