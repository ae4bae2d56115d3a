"""Documents of the multimodal zoo's tiny vision-language models (``vlm_zoo_configs.py``), as a processor would give
them.

A document is ``text, [start] placeholders [end], text``: its pixels are made for the family's input kind
(``vlm_zoo_images.py``: the first kind the model's ``get_image_features`` accepts), and the number of placeholders is
what that ``get_image_features`` returns for them (the rows a processor would insert). Families without an image
placeholder id (Kosmos-2's per-token image mask, InstructBLIP-Video's videos) take ``vlm_zoo_unplaced.py``. The five
families of :data:`hf_hsap.examples.vlm.TINY_VLMS` use :func:`hf_hsap.examples.vlm.vlm_documents`.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from hf_hsap.examples import TINY_VLMS, vlm_documents
from hf_hsap.multimodal.audio import is_audio_lm
from hf_hsap.multimodal.cross import is_cross_attention_vlm
from hf_hsap.multimodal.structure import inner_vlm
from hf_hsap.multimodal.prefix import is_prefix_lm, prefix_token_types
from workers.vlm_zoo_audio import audio_documents
from workers.vlm_zoo_configs import SPECIAL_SUFFIXES, NotBuildable, first_line
from workers.vlm_zoo_images import (Maker, feature_module, feature_rows, image_maker, image_token_id,
                                    signature_params, tower_geometry)
from workers.vlm_zoo_unplaced import unplaced_documents

__all__ = ["SHAPES", "documents", "grid_video", "with_videos"]

# per document (text before, grid (t, h, w) in patches or None, text after), as tests/workers/vlm.py: one long
# document whose image SP must split, a text-only one and short ones (fixed-size-image families ignore the grid)
SHAPES = [(21, (1, 8, 8), 11), (2, (1, 4, 4), 4), (5, None, 7), (1, (1, 2, 4), 2), (3, (1, 4, 2), 6)]


_CANVAS_MARKERS = ("image_start_id", "image_end_id", "slice_start_id", "slice_end_id", "newline_id")  # MiniCPM-V 4.7


def _marker(fields: dict[str, Any], names: tuple[str, ...]) -> int | None:
    return next((fields[n] for n in names if isinstance(fields.get(n), int)), None)


def documents(config: Any, model: torch.nn.Module, shapes: list[tuple[int, tuple[int, int, int] | None, int]] = SHAPES,
              seed: int = 0, dtype: torch.dtype = torch.float64, examples: bool = True) -> list[dict[str, Any]]:
    """Documents as a processor would give them (see the module docstring).

    Args:
        config: the family's tiny config; model: a model of it (asked how many rows an image becomes);
        shapes: per document ``(text before, grid or None, text after)``; seed: tokens and pixels; dtype: pixels;
        examples: the families of ``TINY_VLMS`` take ``vlm_documents`` (False: the input kinds here, e.g. for a
        LLaVA with a Pixtral tower).

    Returns:
        One dict per document: ``input_ids [n]``, ``labels [n]`` (-100 on placeholders and markers), the image
        inputs and, where the model's forward takes them, ``token_type_ids`` / ``mm_token_type_ids`` (1 on
        placeholders).

    Raises:
        NotBuildable: no image token id, or the model refuses the images made for it.
    """
    if examples and config.model_type in TINY_VLMS:
        return vlm_documents(config, shapes, seed=seed, dtype=dtype)
    if is_cross_attention_vlm(model):
        return cross_documents(config, model, shapes, seed=seed, dtype=dtype)
    if is_audio_lm(inner_vlm(model)):  # an audio-language model: one clip per document (vlm_zoo_audio)
        return audio_documents(config, model, seed=seed, dtype=dtype)
    unplaced = unplaced_documents(config, model, shapes, seed=seed, dtype=dtype)  # Kosmos-2, InstructBLIP-Video
    if unplaced is not None:
        return unplaced
    token = image_token_id(config)
    if token is None:
        raise NotBuildable("the config has no image_token_id / image_token_index (no placeholder to insert)")
    vocab = config.get_text_config().vocab_size
    fields = config.to_dict()
    start = _marker(fields, ("vision_start_token_id", "image_start_token_id", "boi_token_id", "boi_token_index",
                             "image_start_id"))  # MiniCPM-V 4.7's <image>
    end = _marker(fields, ("vision_end_token_id", "image_end_token_id", "eoi_token_id", "eoi_token_index",
                           "image_end_id"))
    specials = [v for n, v in fields.items() if n.endswith(SPECIAL_SUFFIXES) and isinstance(v, int) and v > 2]
    specials += [v for n, v in fields.items() if n in _CANVAS_MARKERS and isinstance(v, int)]
    low = min([vocab, *specials, *(m for m in (start, end) if m is not None)])  # text stays below every special id
    kind, make = image_maker(config, model)
    video = grid_video(config, model, kind, make)
    audio = audio_maker(config, model)
    g = torch.Generator().manual_seed(seed)
    pixels = signature_params(type(model).forward).get("pixel_values")
    every = pixels is not None and pixels.default is inspect.Parameter.empty  # BLIP-2: no text-only forward
    docs = []
    for k, (before, grid, after) in enumerate(shapes):
        doc: dict[str, Any] = {}
        if grid is None and every:
            grid = (1, 2, 2)  # the smallest image (fixed-size families ignore the grid)
        body = [torch.randint(3, low, (before,), generator=g)]
        video_at: list[torch.Tensor] = []  # the video's placeholder runs (type 2)
        if grid is not None and not (video is not None and video.shared and k in VIDEO_DOCS):
            image = make(grid, g, dtype)
            try:
                n_tok = feature_rows(model, image)
            except Exception as e:  # noqa: BLE001
                raise NotBuildable(f"get_image_features refuses a {kind} of grid {grid}: {first_line(e)}") from e
            doc.update(image)
            body += ([torch.tensor([start])] if start is not None else []) + [torch.full((n_tok,), token)] + \
                ([torch.tensor([end])] if end is not None else [])
        n_prefix = sum(int(b.numel()) for b in body)  # text before and the image: a prefix-LM's prefix
        body.append(torch.randint(3, low, (after,), generator=g))
        if video is not None and k in VIDEO_DOCS:  # a video after the text: (t, h, w) = (2, 4, 4), then (2, 2, 4)
            keys, runs = video((2, 4, 4) if k == VIDEO_DOCS[0] else (2, 2, 4), g, dtype)
            doc.update(keys)
            v_start, v_end = start, end
            if not video.shared:  # a video of its own token: its own start / end markers where the config names them
                v_start = _marker(fields, ("video_start_token_id",)) or start  # (Ovis 2.5 writes a learned
                v_end = _marker(fields, ("video_end_token_id",)) or end  # embedding there, counted per video)
            for run in runs:
                body += [torch.randint(3, low, (1,), generator=g)]  # a timestamp's text before each frame
                n_body = sum(int(b.numel()) for b in body)
                body += ([torch.tensor([v_start])] if v_start is not None else []) + [run] + \
                    ([torch.tensor([v_end])] if v_end is not None else [])
                video_at.append(torch.arange(run.numel()) + n_body + (v_start is not None))
            body.append(torch.randint(3, low, (2,), generator=g))
        ids = torch.cat(body)
        doc["input_ids"] = ids
        for key in ("token_type_ids", "mm_token_type_ids"):
            if key in signature_params(type(model).forward):
                doc[key] = (ids == token).to(torch.int64)
                for where in video_at:
                    doc[key][where] = 2
        if "moe_mm_token_type_ids" in signature_params(type(model).forward):  # ERNIE-4.5-VL's processor: the MoE routing
            doc["moe_mm_token_type_ids"] = _moe_types(fields, ids)  # types, start / end markers included
        if audio is not None and k in AUDIO_DOCS:  # an audio after the text: 24 real frames, then 20 of 32
            keys, n_audio = audio(24 if k == AUDIO_DOCS[0] else 32, 24 if k == AUDIO_DOCS[0] else 20, g, dtype)
            doc.update(keys)
            a_start = _marker(fields, ("audio_start_token_id",))
            a_end = _marker(fields, ("audio_end_token_id",))
            a_token = _marker(fields, ("audio_token_id", "audio_token_index"))
            ids = torch.cat([ids] + ([torch.tensor([a_start])] if a_start is not None else []) +
                            [torch.full((n_audio,), a_token)] + ([torch.tensor([a_end])] if a_end is not None else []) +
                            [torch.randint(3, low, (2,), generator=g)])
            doc["input_ids"] = ids
            for key in ("token_type_ids", "mm_token_type_ids"):
                if key in doc:
                    doc[key] = torch.cat([doc[key], torch.zeros(ids.numel() - doc[key].numel(), dtype=torch.int64)])
        if _positions_need_mask(model):  # as the processor gives it: all ones
            doc["attention_mask"] = torch.ones_like(ids)
        if is_prefix_lm(model):  # PaliGemma: 0 on the image and the prompt, 1 on the suffix
            doc["token_type_ids"] = prefix_token_types(ids.numel(), n_prefix)
        labels = ids.clone()
        labels[ids >= low] = -100  # no loss on placeholders and markers
        doc["labels"] = labels
        docs.append(doc)
    return docs


def _moe_types(fields: dict[str, Any], ids: torch.Tensor) -> torch.Tensor:
    """``[n]`` as ERNIE-4.5-VL's processor's ``create_moe_mm_token_type_ids``: 1 on image placeholders and the image
    start / end tokens, 2 on video placeholders and the video start / end tokens, 0 elsewhere."""
    out = torch.zeros_like(ids)
    for kind, name in ((1, "image"), (2, "video")):
        for key in (f"{name}_token_id", f"{name}_start_token_id", f"{name}_end_token_id"):
            if isinstance(fields.get(key), int):
                out[ids == fields[key]] = kind
    return out


def cross_documents(config: Any, model: torch.nn.Module, shapes: list[tuple[int, tuple[int, int, int] | None, int]],
                    *, seed: int = 0, dtype: torch.dtype = torch.float64) -> list[dict[str, Any]]:
    """Documents of a cross-attention family as its processor gives them.

    Mllama: ``text, <|image|> per image, text``; every image ``[max_num_tiles, C, S, S]`` with its real tiles first
    (the rest zero), its ``aspect_ratio_ids`` (1 + the index of its tiles' ``[rows, cols]`` in
    ``supported_aspect_ratios``) and ``aspect_ratio_mask``; ``cross_attention_mask [1, n, images, max_num_tiles]``:
    each image's real tiles from its placeholder to the document's end (the tokens before it attend to none). A grid
    ``(t, h, w)`` gives an image of ``ceil(h / 4) x ceil(w / 4)`` tiles, and a grid of 64 patches or more a second
    image of ``1 x 2`` tiles. Idefics: ``[1, images, C, S, S]`` and ``image_attention_mask [1, n, images]`` the same
    way, without placeholders (its config names none), and an image in every document (it runs none without).

    Returns:
        One dict per document (``input_ids [n]``, ``labels [n]``: -100 on the placeholders, the image inputs).
    """
    v = config.vision_config
    c, size = int(getattr(v, "num_channels", 3)), int(v.image_size)
    tiled = "aspect_ratio_ids" in signature_params(type(model).forward)
    tiles = int(v.max_num_tiles) if tiled else 1
    ratios = [list(r) for r in v.supported_aspect_ratios] if tiled else []
    token = image_token_id(config) if tiled else None
    low = min(config.get_text_config().vocab_size, token if token is not None else 10 ** 9)
    g = torch.Generator().manual_seed(seed)
    docs = []
    for before, grid, after in shapes:
        grid = grid if grid is not None or tiled else (1, 2, 2)  # Idefics: every document has an image
        layouts = [] if grid is None else [[-(-grid[1] // 4), -(-grid[2] // 4)]] + \
            ([[1, 2]] if grid[1] * grid[2] >= 64 else [])
        if not tiled:
            layouts = [[1, 1] for _ in layouts]
        n_img = len(layouts)
        marks = torch.full((n_img,), token) if token is not None else torch.zeros(0, dtype=torch.int64)
        ids = torch.cat([torch.randint(3, low, (before,), generator=g), marks,
                         torch.randint(3, low, (after,), generator=g)])
        doc: dict[str, Any] = {"input_ids": ids, "labels": torch.where(ids >= low, -100, ids)}
        if n_img:
            pixels = torch.zeros(1, n_img, tiles, c, size, size, dtype=dtype)
            mask = torch.zeros(1, ids.numel(), n_img, tiles, dtype=torch.int64)
            ratio_mask = torch.zeros(1, n_img, tiles, dtype=torch.int64)
            for j, (rows, cols) in enumerate(layouts):
                real = rows * cols
                pixels[0, j, :real] = torch.randn(real, c, size, size, generator=g, dtype=dtype)
                ratio_mask[0, j, :real] = 1
                mask[0, before + (j if token is not None else 0):, j, :real] = 1
            if tiled:
                doc.update(pixel_values=pixels, cross_attention_mask=mask, aspect_ratio_mask=ratio_mask,
                           aspect_ratio_ids=torch.tensor([[ratios.index(r) + 1 for r in layouts]]))
            else:
                doc.update(pixel_values=pixels[:, :, 0], image_attention_mask=mask[..., 0])
        docs.append(doc)
    return docs


def _positions_need_mask(model: torch.nn.Module) -> bool:
    """Whether the forward computes its multimodal rotary positions only when given an ``attention_mask`` (the omni
    thinkers' ``compute_3d_position_ids``; without one a document alone would run on 1-D positions)."""
    fn = getattr(feature_module(model), "compute_3d_position_ids", None)
    try:
        return callable(fn) and "and attention_mask is not None" in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


AUDIO_DOCS = (2, 4)  # the documents an omni model's audio is added to (documents())


def audio_maker(config: Any, model: torch.nn.Module) -> Callable[..., Any] | None:
    """An audio maker for a model whose spec carries audios (an audio modality beside its images), else ``None``.

    Returns:
        ``audio(frames, real, generator, dtype) -> (keys, placeholders)``: ``input_features [1, mel, frames]`` (zero
        past the ``real`` frames) with its ``feature_attention_mask [1, frames]``, and as many placeholders as the
        model's ``get_audio_features`` returns rows.
    """
    from hf_hsap.multimodal import vision_spec

    inner = feature_module(model)
    try:  # audios only where the model's spec carries them (Gemma 4's are not carried yet)
        if not any(m.name == "audio" for m in vision_spec(model).layout.modalities):
            return None
    except ValueError:
        return None
    mel = getattr(config.audio_config, "num_mel_bins", None)
    if mel is None:  # a waveform input (Muse Spark's input_values): not made here, its documents have no audio
        return None
    mel = int(mel)

    def audio(frames: int, real: int, g: torch.Generator, dtype: torch.dtype) -> tuple[dict[str, Any], int]:
        mask = torch.zeros(1, frames, dtype=torch.int64)
        mask[:, :real] = 1
        feats = torch.randn(1, mel, frames, generator=g, dtype=dtype) * mask[:, None]
        with torch.no_grad():
            out = inner.get_audio_features(feats.to(model.dtype), feature_attention_mask=mask, return_dict=True)
        return {"input_features": feats, "feature_attention_mask": mask}, int(out.last_hidden_state.shape[0])

    return audio


VIDEO_DOCS = (1, 3)  # the documents a grid family's video is added to (documents())


def grid_video(config: Any, model: torch.nn.Module, kind: str, make: Maker) -> Callable[..., Any] | None:
    """A grid family's video maker, where its ``get_video_features`` takes a ``video_grid_thw`` (else ``None``).

    Returns:
        ``video(thw, generator, dtype) -> (keys, runs)``: ``pixel_values_videos`` and ``video_grid_thw`` (and
        ``second_per_grid_ts`` where the rope index reads it), and the placeholder runs: one per frame where the
        model's rope index places each frame apart (Qwen3-VL, GLM-4V: a timestamp between frames), else one; the
        video placeholder is the image token where the model's placeholder mask says so (GLM-4V: ``video.shared``;
        such a model's own forward cannot take an image and a video together, so its video documents hold no image).
    """
    from hf_hsap.multimodal.grid import video_marks

    inner = feature_module(model)
    vtoken = next((getattr(config, n) for n in ("video_token_id", "video_token_index")
                   if isinstance(getattr(config, n, None), int)), None)
    encode = signature_params(getattr(inner, "get_video_features", None))
    needs = {n for n, p in encode.items() if p.default is inspect.Parameter.empty and
             p.kind is p.POSITIONAL_OR_KEYWORD} - {"self", "pixel_values_videos", "video_grid_thw", "video_merge_sizes"}
    if not kind.startswith("grid") or vtoken is None or "video_grid_thw" not in encode or needs:
        return None  # no grid video, or one that needs inputs not made here
    itoken = image_token_id(config)
    marks = video_marks(model, inner, itoken, vtoken)  # as grid_spec reads it: no video where it reads none
    if marks is None:
        return None
    token = itoken if marks == "image" else vtoken
    rope = getattr(inner, "get_rope_index", None)
    per_frame = callable(rope) and "repeat_interleave(video_grid_thw" in inspect.getsource(rope)
    seconds = next((k for k in ("second_per_grid_ts", "video_second_per_grid") if k in signature_params(type(model).forward)),
                   None)  # a video's seconds per temporal patch, where the forward takes them
    compress = "video_compression_mask" in signature_params(type(model).forward)  # a mask of the encoder's rows kept

    def video(thw: tuple[int, int, int], g: torch.Generator, dtype: torch.dtype) -> tuple[dict[str, Any], list]:
        image = make(thw, g, dtype)
        keys = {"pixel_values_videos": image["pixel_values"], "video_grid_thw": image["image_grid_thw"]}
        if seconds:
            keys[seconds] = torch.tensor([1.0])
        if "video_merge_sizes" in encode:  # VideoLLaMA3: its video processor's merge size (its images': 1)
            keys["video_merge_sizes"] = torch.tensor([2])
        with torch.no_grad():
            given = {k: v for k, v in keys.items() if k in encode and k != "pixel_values_videos"}
            out = inner.get_video_features(pixel_values_videos=keys["pixel_values_videos"].to(model.dtype), **given,
                                           return_dict=True)
        feats = out.pooler_output
        n = feats.numel() // feats.shape[-1] if torch.is_tensor(feats) else sum(f.numel() // f.shape[-1] for f in feats)
        if compress:  # VideoLLaMA3's token compression: a later frame's unchanged rows dropped (here every other one)
            keep = torch.ones(n, dtype=torch.bool)
            keep[n // thw[0]::2] = False
            keys["video_compression_mask"] = keep
            n = int(keep.sum())
        frames = thw[0] if per_frame else 1
        return keys, [torch.full((n // frames,), token) for _ in range(frames)]

    video.shared = token == itoken  # type: ignore[attr-defined]  # a document holds a video or images, not both
    return video


def with_videos(config: Any, model: torch.nn.Module, docs: list[dict[str, Any]], *, frames: int = 2, every: int = 2,
                seed: int = 1, dtype: torch.dtype = torch.float64) -> list[dict[str, Any]]:
    """``docs`` with a video (``pixel_values_videos [1, frames, C, S, S]``) at the end of every ``every``-th one,
    its placeholders (``video_token_id``) as many as the model's ``get_video_features`` returns rows.

    Args:
        config: the family's tiny config; model: a model of it; docs: from :func:`documents`; frames: per video;
        every: which documents get a video; seed: the videos' pixels; dtype: of the pixels.

    Returns:
        New document dicts (the inputs are not modified).
    """
    c, size, _, _ = tower_geometry(config)
    token = next(getattr(config, n) for n in ("video_token_id", "video_token_index")
                 if isinstance(getattr(config, n, None), int))
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, doc in enumerate(docs):
        doc = dict(doc)
        if i % every == 0:
            video = torch.randn(1, frames, c, size, size, generator=g, dtype=dtype)
            with torch.no_grad():
                feats = feature_module(model).get_video_features(video.to(model.dtype), return_dict=True).pooler_output
            n = feats.numel() // feats.shape[-1]
            doc["pixel_values_videos"] = video
            doc["input_ids"] = torch.cat([doc["input_ids"], torch.full((n,), token), torch.tensor([5])])
            doc["labels"] = torch.cat([doc["labels"], torch.full((n,), -100), torch.tensor([5])])
            for key in ("token_type_ids", "mm_token_type_ids"):
                if key in doc:
                    doc[key] = (doc["input_ids"] == image_token_id(config)).to(torch.int64)
        out.append(doc)
    return out
