"""Worker side of :mod:`benchmarks.suites.vlm_step`: one training step (forward + backward, the model's own loss) of a
Qwen2.5-VL on one packed image + text row under HSAP SP (spawned gloo ranks), by two schemes on the same model,
row and plan:

* ``hf_hsap``: ``model(**shard_batch(batch, sp))``: each rank encodes only the images with a placeholder on it and
  keeps its own feature rows, an image split across ranks encoded by each holder or once, as the default
  ``vision_encoding="auto"`` prices it (:mod:`hf_hsap.multimodal`);
* ``baseline``: what sharding at the language model's entrance does (the tower replicated): every rank runs the whole vision tower and the
  embedding merge on the global row (all pixels, all ``input_ids``), and a forward pre-hook on the language model
  (:func:`entrance_sharding`) cuts ``inputs_embeds`` and ``position_ids`` to the rank's tokens with the same plan.

Both schemes are checked equal (loss, and every gradient summed over the SP group) before anything is measured.

The long video row (:func:`run_video`) compares five: ``once`` (a video split across ranks encoded by one holder,
its rows sent: ``vision_encoding="once"``, :mod:`hf_hsap.multimodal.exchange`), ``holders`` (every holder encodes
it), ``baseline`` (every rank encodes every video), each on the plan of the decoder's work alone
(``vision_balance=False``), and ``once_balanced`` / ``holders_balanced``: the same on the plan that also weighs each
rank's encoder work (``vision_balance=True``, the default; :mod:`hf_hsap.plan.items`).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import torch
import torch.distributed as dist

import hf_hsap
from hf_hsap.examples import tiny_vlm_config, vlm_documents
from hf_hsap.multimodal import ROWS_KEY, vision_spec

from ..tensor_memory import TensorPeak

SCHEMES = ("hf_hsap", "baseline")
# the global inputs the baseline feeds to model(...) in place of shard_batch's local ones
_GLOBAL_KEYS = ("input_ids", "position_ids", "pixel_values", "image_grid_thw")
_GROUPS: dict[int, Any] = {}


def model_config(text: dict[str, Any], vision: dict[str, Any], vocab: int) -> Any:
    """A Qwen2.5-VL config: the shape of :func:`hf_hsap.examples.vlm.tiny_vlm_config` with the given sizes.

    Args:
        text: text-model fields to override (``hidden_size``, ``num_hidden_layers``, ``head_dim``, ...;
            ``mrope_section``: the rotary split of ``head_dim // 2`` over (t, h, w)).
        vision: vision-tower fields to override (``depth``, ``hidden_size``, ``num_heads``, ``window_size``, ...;
            ``out_hidden_size`` is set to the text hidden size). vocab: the text vocabulary.

    Returns:
        A ``Qwen2_5_VLConfig`` (no hub).
    """
    base = tiny_vlm_config("qwen2_5_vl", vocab)
    drop = ("transformers_version", "layer_types", "model_type", "bos_token_id", "eos_token_id")
    t = {k: v for k, v in base.text_config.to_dict().items() if k not in drop}
    text = dict(text)
    section = text.pop("mrope_section", None)
    t.update(text)
    if section is not None:
        t["rope_parameters"] = {**t["rope_parameters"], "mrope_section": list(section)}
    v = {k: x for k, x in base.vision_config.to_dict().items() if k not in drop}
    v.update({k: list(x) if isinstance(x, tuple) else x for k, x in vision.items()}, out_hidden_size=t["hidden_size"])
    special = {k: getattr(base, k) for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                             "vision_end_token_id")}
    return type(base)(text_config=t, vision_config=v, tie_word_embeddings=False, **special)


def build(config: Any, seed: int) -> torch.nn.Module:
    """The model (``attn_implementation="hsap"``, float32, train mode; the same weights for the same ``seed``)."""
    from transformers import AutoModelForImageTextToText

    from hf_hsap.integrations import register

    register()
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, attn_implementation="hsap", dtype=torch.float32)
    return model.train()


def packed_row(model: torch.nn.Module, shapes: list[tuple[int, tuple[int, int, int] | None, int]], seed: int,
               pad_to: int) -> dict[str, Any]:
    """All documents of ``shapes`` (see :func:`hf_hsap.examples.vlm.vlm_documents`) in one packed row.

    Args:
        model: the model (its config and rope index); shapes: ``(text before, grid, text after)`` per document;
        seed: tokens and pixels; pad_to: the row length is rounded up to a multiple of this (every SP size).

    Returns:
        The collator's global batch: ``input_ids [1, L]``, ``position_ids [4, 1, L]``, ``pixel_values [N, 24]``,
        ``image_grid_thw [n_images, 3]``, ...
    """
    docs = vlm_documents(model.config, shapes, seed=seed)
    total = sum(d["input_ids"].numel() for d in docs)
    return hf_hsap.PackingCollator(total, pad_to_multiple_of=pad_to, vision=vision_spec(model))(docs)


def _shard_tokens(plan: Any, x: torch.Tensor, rank: int | None) -> torch.Tensor:
    """``[1, L, ...] -> [1, T_local, ...]`` or positions ``[4, 1, L] -> [4, 1, T_local]`` with ``plan.shard``."""
    if x.dim() == 3 and x.shape[0] == 4 and x.shape[1] == 1:  # multimodal rotary positions
        return torch.stack([plan.shard(row.reshape(-1), rank=rank) for row in x]).unsqueeze(1)
    return plan.shard(x.reshape(-1, *x.shape[2:]), rank=rank).unsqueeze(0)


@contextlib.contextmanager
def entrance_sharding(model: torch.nn.Module, rank: int | None) -> Iterator[None]:
    """The baseline: while active, the language model's inputs (``inputs_embeds``, ``position_ids``) are cut to this
    rank's tokens by the plan of the call's ``hsap_plan`` (a forward pre-hook on ``model.model.language_model``).

    Args:
        model: the vision-language model; rank: the plan's rank (``0`` without SP, else ``None``: this rank).
    """
    def pre(module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        plan = kwargs["hsap_plan"]
        for key in ("inputs_embeds", "position_ids"):
            if kwargs.get(key) is not None:
                kwargs[key] = _shard_tokens(plan, kwargs[key], rank)
        return args, kwargs

    handle = model.model.language_model.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def baseline_inputs(batch: dict[str, Any], local: dict[str, Any]) -> dict[str, Any]:
    """The baseline's ``model(...)`` arguments: the global row's tokens, positions and every image, with the plan,
    targets and loss count of ``shard_batch``'s ``local``."""
    skip = set(_GLOBAL_KEYS) | {ROWS_KEY, "mm_token_type_ids"}
    return {**{k: v for k, v in local.items() if k not in skip}, **{k: batch[k] for k in _GLOBAL_KEYS}}


def step(model: torch.nn.Module, scheme: str, batch: dict[str, Any], local: dict[str, Any], sp: Any,
         rank: int | None) -> torch.Tensor:
    """Forward + backward of one row by ``scheme``; returns the global loss (summed over the SP group).

    Args:
        model: the model; scheme: one of :data:`SCHEMES`; batch: the global row; local: ``shard_batch(batch, sp)``;
        sp: the SP group or ``1``; rank: the plan's rank (``0`` without SP, else ``None``).
    """
    if scheme == "baseline":
        with entrance_sharding(model, rank):
            loss = model(**baseline_inputs(batch, local)).loss
    else:
        loss = model(**local).loss  # this rank's summed CE / the global target count
    loss.backward()
    total = loss.detach().clone()
    if getattr(sp, "size", 1) > 1:
        dist.all_reduce(total, group=sp.group)
    return total


def group_grads(model: torch.nn.Module, sp: Any) -> dict[str, torch.Tensor]:
    """Every parameter's gradient summed over the SP group (zeros where none): what the schemes must agree on (a split
    item's tower gradient sits on its holders, or on its owner alone where it is encoded once)."""
    grads = {k: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
             for k, p in model.named_parameters()}
    if getattr(sp, "size", 1) > 1:
        for g in grads.values():
            dist.all_reduce(g, group=sp.group)
    return grads


def vision_step(model: torch.nn.Module, pixels: torch.Tensor, grid: torch.Tensor) -> None:
    """Forward + backward of the vision tower alone (merger included) on ``pixels [N, C]`` of the items ``grid``."""
    feats = model.model.visual(pixels, grid_thw=grid).pooler_output  # [N / merge, H]
    feats.square().mean().backward()


def _encoded(scheme: str, batch: dict[str, Any], local: dict[str, Any]) -> tuple[int, int]:
    """Images and pixel rows this rank's vision tower encodes under ``scheme``."""
    src = batch if scheme == "baseline" else local
    if src.get("pixel_values") is None:
        return 0, 0
    return int(src["image_grid_thw"].shape[0]), int(src["pixel_values"].shape[0])


def run_sp(cfg: dict[str, Any], sp_size: int, reps: int) -> dict[str, dict[str, Any]]:
    """Both schemes at one SP size on this rank (collective over the SP group).

    First one step of each (the warm-up), checked: the global losses equal to ``cfg["loss_tol"]`` and every
    gradient summed over the group equal (relative to its largest entry); then the tensor peak of one step per scheme; then
    ``reps`` interleaved timed rounds of one step per scheme and of the vision tower alone on the pixels the
    scheme encodes (``reps = 0``: memory only).

    Args:
        cfg: :class:`benchmarks.suites.vlm_step.VLMStepConfig` as a dict (``text``, ``vision``, ``vocab``, ``shapes``,
            ``pad_to``, ``seed``, ``loss_tol``); sp_size: the SP size (the world); reps: timed rounds.

    Returns:
        ``{scheme: {"loss", "loss_err", "grad_err", "images", "pixel_rows", "tokens", "peak_bytes", "at_peak",
        "cpu_s": [...], "wall_s": [...], "vision_cpu_s": [...]}}``.
    """
    sp, rank, model = _set_up(cfg, sp_size)
    shapes = [(a, tuple(g) if g else None, b) for a, g, b in cfg["shapes"]]
    batch = packed_row(model, shapes, cfg["seed"], cfg["pad_to"])
    out: dict[str, dict[str, Any]] = {}
    ref = None
    for name in SCHEMES:
        local = hf_hsap.shard_batch(batch, sp)
        loss = float(step(model, name, batch, local, sp, rank))
        grads = group_grads(model, sp)
        model.zero_grad(set_to_none=True)
        if ref is None:
            ref = (loss, grads)
        images, rows = _encoded(name, batch, local)
        out[name] = {"loss": loss, "loss_err": abs(loss - ref[0]), "images": images, "pixel_rows": rows,
                     "tokens": int(local["input_ids"].shape[1]),
                     "grad_err": max(float((grads[k] - g).abs().max() / g.abs().max().clamp_min(1e-30))
                                     for k, g in ref[1].items())}
        assert {k for k, g in grads.items() if g.any()} == {k for k, g in ref[1].items() if g.any()}, \
            f"{name}: other parameters got gradients"
        assert out[name]["loss_err"] <= cfg["loss_tol"], f"{name}: loss {loss} against hf_hsap's {ref[0]}"
    del ref
    for name in SCHEMES:
        local = hf_hsap.shard_batch(batch, sp)
        with TensorPeak() as peak:
            step(model, name, batch, local, sp, rank)
        model.zero_grad(set_to_none=True)
        out[name]["peak_bytes"] = peak.peak_bytes
        out[name]["at_peak"] = [(n, op) for n, op in peak.at_peak[:4]]
    _timed_reps(model, batch, out, SCHEMES, reps, sp_size, make_local=lambda name: hf_hsap.shard_batch(batch, sp),
                run_step=lambda name, local: step(model, name, batch, local, sp, rank),
                keys=("pixel_values", "image_grid_thw"))
    return out


def _set_up(cfg: dict[str, Any], sp_size: int) -> tuple[Any, int | None, torch.nn.Module]:
    """``(sp, rank, model)`` of one run: the SP group of ``sp_size`` (made once per process; 1 without SP), the
    rank ``shard_batch`` is given (the group's own under SP, 0 without), the prepared model of ``cfg``."""
    torch.set_num_threads(1)
    if sp_size > 1 and sp_size not in _GROUPS:
        _GROUPS[sp_size] = hf_hsap.init_sequence_parallel(sp_size)
    sp = _GROUPS.get(sp_size, 1)
    model = build(model_config(cfg["text"], cfg["vision"], cfg["vocab"]), cfg["seed"])
    hf_hsap.prepare_model(model, sp_size=sp_size)
    return sp, None if sp_size > 1 else 0, model


def _timed_reps(model: torch.nn.Module, batch: dict[str, Any], out: dict[str, dict[str, Any]],
                schemes: tuple[str, ...], reps: int, sp_size: int, *, make_local: Any, run_step: Any,
                keys: tuple[str, str]) -> None:
    """Each scheme's step ``reps`` times, the schemes interleaved: its CPU and wall seconds, then its vision tower
    alone on the pixels it encodes (``keys``: the pixels and their grid; ``batch`` for the replicated baseline), CPU
    seconds (0 where it encodes none); appended to ``out[scheme]``."""
    for name in schemes:
        out[name].update(cpu_s=[], wall_s=[], vision_cpu_s=[])
    for _ in range(reps):
        for name in schemes:
            local = make_local(name)
            if sp_size > 1:
                dist.barrier()
            c0, w0 = time.process_time(), time.perf_counter()
            run_step(name, local)
            out[name]["cpu_s"].append(time.process_time() - c0)
            out[name]["wall_s"].append(time.perf_counter() - w0)
            model.zero_grad(set_to_none=True)
            src = batch if name == "baseline" else local
            if src.get(keys[0]) is None:
                out[name]["vision_cpu_s"].append(0.0)
                continue
            c0 = time.process_time()
            vision_step(model, src[keys[0]], src[keys[1]])
            out[name]["vision_cpu_s"].append(time.process_time() - c0)
            model.zero_grad(set_to_none=True)


# the long video row: vision_encoding "once" / "holders" on the plan of the decoder's work alone (today's); the tower
# replicated; "once" / "holders" on the plan that also weighs each part's encoder work (HSAPConfig.vision_balance)
VIDEO_SCHEMES = ("once", "holders", "baseline", "once_balanced", "holders_balanced")
_VIDEO_GLOBAL_KEYS = ("input_ids", "position_ids", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def video_row(model: torch.nn.Module, shapes: list[tuple[int, tuple[int, int, int], int]], seed: int,
              pad_to: int) -> dict[str, Any]:
    """The long video row: every document of ``shapes`` with a video of its grid, in one packed row."""
    docs = vlm_documents(model.config, shapes, seed=seed, video=True)
    total = sum(d["input_ids"].numel() for d in docs)
    return hf_hsap.PackingCollator(total, pad_to_multiple_of=pad_to, vision=vision_spec(model))(docs)


def _video_step(model: torch.nn.Module, scheme: str, batch: dict[str, Any], local: dict[str, Any], sp: Any,
                rank: int | None) -> torch.Tensor:
    """Forward + backward of the video row by ``scheme`` (``baseline``: every rank encodes every video and cuts the
    language model's inputs, :func:`entrance_sharding`); returns the global loss."""
    if scheme == "baseline":
        skip = set(_VIDEO_GLOBAL_KEYS) | {ROWS_KEY, "mm_token_type_ids"}
        inputs = {**{k: v for k, v in local.items() if k not in skip},
                  **{k: batch[k] for k in _VIDEO_GLOBAL_KEYS if k in batch}}
        with entrance_sharding(model, rank):
            loss = model(**inputs).loss
    else:
        loss = model(**local).loss
    loss.backward()
    total = loss.detach().clone()
    if getattr(sp, "size", 1) > 1:
        dist.all_reduce(total, group=sp.group)
    return total


def _video_config(sp: Any, scheme: str) -> Any:
    """The :class:`hf_hsap.HSAPConfig` of ``scheme``: its ``vision_encoding`` (the baseline shards as ``holders``)
    and whether the plan weighs the encoder (``*_balanced``)."""
    encoding = scheme.removesuffix("_balanced")
    return sp.config.replace(vision_encoding="holders" if encoding == "baseline" else encoding,
                             vision_balance=scheme.endswith("_balanced"))


def _video_local(batch: dict[str, Any], sp: Any, scheme: str) -> dict[str, Any]:
    """``shard_batch`` with the configuration of ``scheme`` (:func:`_video_config`)."""
    if getattr(sp, "size", 1) == 1:
        return hf_hsap.shard_batch(batch, sp)
    return hf_hsap.shard_batch(batch, sp, config=_video_config(sp, scheme))


def predicted_work(batch: dict[str, Any], local: dict[str, Any], encoding: str) -> list[float]:
    """Every part's encoder + decoder time of one layer by the planner's model (attention pairs): the plan's part
    times (:func:`hf_hsap.plan.cost.part_times`) plus ``token_cost`` x the encoder work of the items the part
    encodes under ``encoding`` (:mod:`hf_hsap.plan.items`), whichever plan ``local`` carries."""
    from hf_hsap.data.vision import LAYOUT_KEY
    from hf_hsap.multimodal import item_work
    from hf_hsap.plan.cost import part_times
    from hf_hsap.plan.items import encoder_per_part, part_of_positions

    plan = local["hsap_plan"]
    pl, cost = plan.placement, plan.cost
    items = item_work(batch, batch[LAYOUT_KEY], batch["input_ids"], encoding=encoding)
    enc = encoder_per_part(items, part_of_positions(pl.start, pl.end, pl.part, items.positions), pl.n_parts)
    return (part_times(plan.layout, pl, None, cost) + cost.token_cost * enc).tolist()


def _moved(local: dict[str, Any]) -> tuple[int, int]:
    """Feature rows this rank sends and receives (the exchanges of ``local``)."""
    ex = [v for k, v in local.get(ROWS_KEY, {}).items() if k.endswith(":exchange")]
    return sum(int(e.send_index.numel()) for e in ex), sum(e.recv_rows for e in ex)


def run_video(cfg: dict[str, Any], sp_size: int, reps: int) -> dict[str, Any]:
    """The long video row at one SP size on this rank, by every scheme of :data:`VIDEO_SCHEMES` (collective).

    As :func:`run_sp`: one checked step per scheme (the global losses within ``cfg["loss_tol"]``, this rank's
    gradients summed over the group equal), the tensor peak of one step, then ``reps`` interleaved timed rounds of a
    step and of the vision tower alone on the pixels the scheme encodes here.

    Returns:
        ``{"auto": the encoding "auto" picks, scheme: {"loss", "loss_err", "grad_err", "videos", "pixel_rows",
        "sent", "received", "tokens", "predicted" (every part's encoder + decoder time by the planner's model, under
        SP, but for the baseline), "peak_bytes", "cpu_s": [...], "wall_s": [...], "vision_cpu_s": [...]}}``.
    """
    sp, rank, model = _set_up(cfg, sp_size)
    batch = video_row(model, [(a, tuple(g), b) for a, g, b in cfg["video"]], cfg["seed"], cfg["pad_to"])
    auto = hf_hsap.shard_batch(batch, sp, check_previous=False)  # what the default picks (not run)
    out: dict[str, Any] = {"auto": "once" if any(_moved(auto)) else "holders"}
    ref = None
    for name in VIDEO_SCHEMES:
        local = _video_local(batch, sp, name)
        loss = float(_video_step(model, name, batch, local, sp, rank))
        grads = group_grads(model, sp)
        model.zero_grad(set_to_none=True)
        ref = ref or (loss, grads)
        src = batch if name == "baseline" else local
        sent, received = (0, 0) if name == "baseline" else _moved(local)
        encoding = "holders" if name == "baseline" else name.removesuffix("_balanced")
        # the planner's model of the schemes that shard the tower (the baseline runs every video on every rank)
        predicted = predicted_work(batch, local, encoding) if sp_size > 1 and name != "baseline" else []
        out[name] = {"loss": loss, "loss_err": abs(loss - ref[0]), "sent": sent, "received": received,
                     "predicted": predicted,
                     "videos": int(src["video_grid_thw"].shape[0]) if src.get("video_grid_thw") is not None else 0,
                     "pixel_rows": int(src["pixel_values_videos"].shape[0])
                     if src.get("pixel_values_videos") is not None else 0,
                     "tokens": int(local["input_ids"].shape[1]),
                     "grad_err": max(float((grads[k] - g).abs().max() / g.abs().max().clamp_min(1e-30))
                                     for k, g in ref[1].items())}
        assert out[name]["loss_err"] <= cfg["loss_tol"], f"{name}: loss {loss} against {ref[0]}"
    del ref
    for name in VIDEO_SCHEMES:
        local = _video_local(batch, sp, name)
        with TensorPeak() as peak:
            _video_step(model, name, batch, local, sp, rank)
        model.zero_grad(set_to_none=True)
        out[name]["peak_bytes"] = peak.peak_bytes
    _timed_reps(model, batch, out, VIDEO_SCHEMES, reps, sp_size, make_local=lambda name: _video_local(batch, sp, name),
                run_step=lambda name, local: _video_step(model, name, batch, local, sp, rank),
                keys=("pixel_values_videos", "video_grid_thw"))
    return out
