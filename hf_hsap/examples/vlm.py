"""Tiny vision-language models and packed image / video + text documents, built offline (random init, pixels
generated here): what the tests, the benchmarks, the VLM recipe and the README use.

    model = tiny_vlm("qwen2_5_vl")                          # AutoModelForImageTextToText, random weights
    docs = vlm_documents(model.config, [(3, (1, 4, 4), 5)])  # one document: 3 text, a 4x4-patch image, 5 text
    batch = PackingCollator(64, vision=vision_spec(model))(docs)

Placeholder ids sit at the top of the vocabulary: image ``V - 4``, video ``V - 3``, vision start / end ``V - 2`` /
``V - 1`` (what a processor would insert around each item).
"""
from __future__ import annotations

from typing import Any

import torch

from ..data.packing import IGNORE_INDEX

__all__ = ["TINY_VLMS", "qwen_vl_config", "tiny_vlm", "tiny_vlm_config", "vlm_documents", "vlm_sft_rows"]

TINY_VLMS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "gemma3")
_TEXT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, max_position_embeddings=1024)
_PATCH = 2  # pixels per patch side (grid families: also 2 frames per temporal patch)


def _special(vocab: int) -> dict[str, int]:
    return {"image_token_id": vocab - 4, "video_token_id": vocab - 3, "vision_start_token_id": vocab - 2,
            "vision_end_token_id": vocab - 1}


def tiny_vlm_config(family: str, vocab_size: int = 128) -> Any:
    """The config of a tiny random model of ``family`` (one of :data:`TINY_VLMS`).

    Args:
        family: the model type; vocab_size: the text vocabulary (the last 4 ids are placeholders).

    Returns:
        A Transformers config (``AutoModelForImageTextToText.from_config`` builds it).
    """
    import transformers as T

    text = dict(vocab_size=vocab_size, bos_token_id=None, eos_token_id=None, pad_token_id=None, **_TEXT)
    special = _special(vocab_size)
    if family == "qwen2_vl":
        return T.Qwen2VLConfig(text_config={**text, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}},
                               vision_config=dict(depth=2, embed_dim=16, hidden_size=32, mlp_ratio=2, num_heads=2,
                                                  patch_size=_PATCH, temporal_patch_size=2, spatial_merge_size=2),
                               tie_word_embeddings=False, **special)
    if family in ("qwen2_5_vl", "qwen3_vl"):
        return qwen_vl_config(family, text, special)
    clip = dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2, image_size=8,
                patch_size=_PATCH, projection_dim=16)
    if family == "llava":
        return T.LlavaConfig(text_config={"model_type": "llama", **text},
                             vision_config={"model_type": "clip_vision_model", **clip},
                             image_token_index=special["image_token_id"], vision_feature_layer=-1,
                             tie_word_embeddings=False)
    if family == "gemma3":
        return T.Gemma3Config(text_config={**text, "sliding_window": 8, "query_pre_attn_scalar": 8,
                                           "layer_types": ["sliding_attention", "full_attention"]},
                              vision_config={**clip, "model_type": "siglip_vision_model"}, mm_tokens_per_image=4,
                              image_token_index=special["image_token_id"], boi_token_index=special["vision_start_token_id"],
                              eoi_token_index=special["vision_end_token_id"], tie_word_embeddings=False)
    raise ValueError(f"no tiny config for {family!r}; choose one of {TINY_VLMS}")


def qwen_vl_config(family: str, text: dict[str, Any], special: dict[str, int]) -> Any:
    """A tiny Qwen2.5-VL or Qwen3-VL config: a 2-layer grid tower of 2-pixel patches (2 frames per temporal patch,
    2 x 2 merge) over ``text``, the placeholders ``special`` (``image_token_id``, ``video_token_id``,
    ``vision_start_token_id``, ``vision_end_token_id``); shared by :func:`tiny_vlm_config` and the TRL set
    (:mod:`.trl_vlms`)."""
    import transformers as T

    grid_vision = dict(depth=2, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=32,
                       patch_size=_PATCH, temporal_patch_size=2, spatial_merge_size=2, in_channels=3)
    if family == "qwen2_5_vl":
        return T.Qwen2_5_VLConfig(
            text_config={**text, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}},
            vision_config={**grid_vision, "window_size": 8, "fullatt_block_indexes": [1]},
            tie_word_embeddings=False, **special)
    return T.Qwen3VLConfig(
        text_config={**text, "rope_scaling": {"rope_type": "default", "mrope_section": [2, 1, 1],
                                              "mrope_interleaved": True}},
        vision_config={**grid_vision, "deepstack_visual_indexes": [0], "num_position_embeddings": 16},
        tie_word_embeddings=False, **special)


def tiny_vlm(family: str, dtype: torch.dtype = torch.float32, attn: str = "hsap", seed: int = 0,
             vocab_size: int = 128) -> torch.nn.Module:
    """A tiny random vision-language model (the same weights for the same ``seed``), in train mode.

    Args:
        family: one of :data:`TINY_VLMS`; dtype: parameter dtype; attn: ``attn_implementation``; seed: init seed;
        vocab_size: the text vocabulary.
    """
    from transformers import AutoModelForImageTextToText

    if attn == "hsap":
        from ..integrations import register

        register()
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(tiny_vlm_config(family, vocab_size), attn_implementation=attn)
    _no_zero_matrices(model, seed)
    return model.to(dtype).train()


def _no_zero_matrices(model: torch.nn.Module, seed: int) -> None:
    """Draw the weight matrices a family initialises to zero (Gemma 3's image projection), so that every part of a
    tiny model, the vision tower included, reaches the loss and its gradient is a real test."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not bool(p.any()):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.02)


def _tokens_per_image(config: Any) -> int:
    if hasattr(config, "mm_tokens_per_image"):
        return int(config.mm_tokens_per_image)
    v = config.vision_config
    return (v.image_size // v.patch_size) ** 2  # CLIP patches without the class token


def vlm_documents(config: Any, shapes: list[tuple[int, tuple[int, int, int] | None, int]], seed: int = 0,
                  video: bool = False, dtype: torch.dtype = torch.float32) -> list[dict[str, Any]]:
    """Documents as a processor would give them: ``text, <start> image placeholders <end>, text``.

    Args:
        config: the model's config (:func:`tiny_vlm_config`); shapes: per document ``(text before, grid, text
            after)``, the grid ``(t, h, w)`` in patches for grid families (``None``: no image; other families
            ignore its size: one fixed-size image); seed: the random tokens and pixels; video: grid families
            encode the item as a video; dtype: pixel dtype.

    Returns:
        One dict per document: ``input_ids [n]``, ``labels [n]``, the family's pixel keys and token types
        (``mm_token_type_ids`` for grid families, ``token_type_ids`` for Gemma 3).
    """
    g = torch.Generator().manual_seed(seed)
    special = _special(config.text_config.vocab_size)
    grid_family = hasattr(config.vision_config, "spatial_merge_size")
    docs = []
    for before, grid, after in shapes:
        doc: dict[str, Any] = {}
        body = [torch.randint(1, special["image_token_id"], (before,), generator=g)]
        if grid is not None:
            if grid_family:
                t, h, w = grid
                n_tok = t * h * w // config.vision_config.spatial_merge_size ** 2
                pix = torch.randn(t * h * w, 3 * 2 * _PATCH * _PATCH, generator=g, dtype=dtype)
                key = "video" if video else "image"
                doc[f"pixel_values{'_videos' if video else ''}"] = pix
                doc[f"{key}_grid_thw"] = torch.tensor([list(grid)])
                if video and config.model_type == "qwen2_5_vl":
                    doc["second_per_grid_ts"] = torch.tensor([1.0])
                token = special["video_token_id" if video else "image_token_id"]
            else:
                n_tok = _tokens_per_image(config)
                size = config.vision_config.image_size
                doc["pixel_values"] = torch.randn(1, 3, size, size, generator=g, dtype=dtype)
                token = special["image_token_id"]
            frames = grid[0] if video and config.model_type.startswith("qwen3_vl") and grid_family else 1
            for _ in range(frames):  # Qwen3-VL: each frame after its timestamp text (here one random token)
                if frames > 1:
                    body.append(torch.randint(1, special["image_token_id"], (1,), generator=g))
                body += [torch.tensor([special["vision_start_token_id"]]), torch.full((n_tok // frames,), token),
                         torch.tensor([special["vision_end_token_id"]])]
        body.append(torch.randint(1, special["image_token_id"], (after,), generator=g))
        ids = torch.cat(body)
        doc["input_ids"] = ids
        types = torch.zeros_like(ids)
        types[ids == special["image_token_id"]] = 1
        types[ids == special["video_token_id"]] = 2
        if grid_family:
            doc["mm_token_type_ids"] = types
        elif config.model_type == "gemma3":
            doc["token_type_ids"] = types
        labels = ids.clone()
        labels[ids >= special["image_token_id"]] = IGNORE_INDEX  # no loss on placeholders
        doc["labels"] = labels
        docs.append(doc)
    return docs


_COLORS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (230, 210, 40),
           "white": (245, 245, 245), "black": (15, 15, 15)}
_SHAPES = ("square", "bar", "cross", "dot")


def _image(shape: str, color: str, background: str, size: int = 16) -> Any:
    """A ``size`` x ``size`` RGB picture of one shape (a PIL image)."""
    import numpy as np
    from PIL import Image

    img = np.empty((size, size, 3), dtype=np.uint8)
    img[:] = _COLORS[background]
    a, b, c = size // 4, size // 2, 3 * size // 4
    fill = _COLORS[color]
    if shape == "square":
        img[a:c, a:c] = fill
    elif shape == "bar":
        img[b - 2:b + 2, 2:size - 2] = fill
    elif shape == "cross":
        img[b - 1:b + 1, a:c] = fill
        img[a:c, b - 1:b + 1] = fill
    else:
        img[b - 2:b + 2, b - 2:b + 2] = fill
    return Image.fromarray(img)


def vlm_sft_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """A generated image + text SFT set in TRL's conversational vision format (no download).

    Each row holds ``images`` (one to three pictures of coloured shapes) and ``messages``: a user turn with the
    images and a question, an assistant turn describing every picture.

    Args:
        n: rows; seed: the draw.

    Returns:
        ``[{"images": [PIL.Image, ...], "messages": [...]}, ...]`` (``datasets.Dataset.from_list`` takes it).
    """
    import random

    rng = random.Random(seed)
    colors = list(_COLORS)
    rows = []
    for _ in range(n):
        pictures = []
        for _ in range(rng.choice((1, 1, 2, 3))):
            color, background = rng.sample(colors, 2)
            pictures.append((rng.choice(_SHAPES), color, background))
        question = rng.choice(("What do you see?", "Describe the pictures.", "Which shapes are shown?"))
        answer = " Then ".join(f"a {c} {s} on {b}." for s, c, b in pictures)
        content = [{"type": "image"} for _ in pictures] + [{"type": "text", "text": question}]
        rows.append({"images": [_image(*p) for p in pictures],
                     "messages": [{"role": "user", "content": content},
                                  {"role": "assistant", "content": [{"type": "text", "text": answer}]}]})
    return rows
