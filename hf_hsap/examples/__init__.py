"""Ready-made inputs for examples, docs and tests on a machine without a model hub: the built-in tiny
model configs (random init) saved as a Transformers model directory with the shipped tokenizer, and the
shipped SFT set written as a ``datasets`` directory (``train.jsonl`` / ``test.jsonl``).

    model_dir = save_tiny_model("runs/tiny-llama")       # AutoModelForCausalLM.from_pretrained(model_dir)
    data_dir = save_sft_data("runs/sft-data")             # datasets.load_dataset(data_dir)["train"]

Tiny vision-language models, their documents and a generated image + text set: :mod:`.vlm` (``tiny_vlm``,
``vlm_documents``, ``vlm_sft_rows``, ...); the eight VLMs of TRL's SFT examples as tiny models with their own
processors: :mod:`.trl_vlms` (``tiny_trl_vlm``, ``save_tiny_vlm``, ...); all re-exported here.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .trl_vlms import TRL_VLMS, save_tiny_vlm, tiny_trl_config, tiny_trl_processor, tiny_trl_vlm
from .vlm import TINY_VLMS, tiny_vlm, tiny_vlm_config, vlm_documents, vlm_sft_rows

__all__ = ["BUILTIN_MODELS", "TINY_VLMS", "TRL_VLMS", "builtin_config", "save_sft_data", "save_tiny_model",
           "save_tiny_vlm", "tiny_trl_config", "tiny_trl_processor", "tiny_trl_vlm", "tiny_vlm", "tiny_vlm_config",
           "vlm_documents", "vlm_sft_rows", "write_splits"]

# Built-in model configs: random init, no download. Heads are multiples of 8 for the GPU-sized ones (so
# --ulysses_size 8 divides them); the tiny ones use 4 query / 2 key-value heads (Ulysses 2 on CPU).
BUILTIN_MODELS: dict[str, tuple[str, dict[str, int]]] = {
    "tiny-llama": ("llama", dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)),
    "tiny-qwen2": ("qwen2", dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2)),
    "small-llama": ("llama", dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12,
                                  num_attention_heads=16, num_key_value_heads=8)),
    # a hybrid: gated delta rule layers (with a short convolution), every 4th layer gated attention
    "tiny-qwen3.5": ("qwen3_5_text", dict(hidden_size=64, intermediate_size=176, num_hidden_layers=4,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                          linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                                          linear_value_head_dim=16)),
}


def builtin_config(name: str, vocab_size: int, max_length: int = 2048) -> Any:
    """The Transformers config of a built-in model.

    Args:
        name: a key of :data:`BUILTIN_MODELS`.
        vocab_size: the tokenizer's size.
        max_length: tokens per packed row (the config gets at least this many positions).
    """
    from transformers import AutoConfig

    kind, sizes = BUILTIN_MODELS[name]
    return AutoConfig.for_model(kind, vocab_size=vocab_size, max_position_embeddings=max(2048, max_length),
                                pad_token_id=1, bos_token_id=0, eos_token_id=0, tie_word_embeddings=False, **sizes)


def save_tiny_model(path: str | os.PathLike[str], name: str = "tiny-llama", seed: int = 0,
                    max_length: int = 2048) -> str:
    """Save a built-in model (random init from ``seed``, float32) and the shipped tokenizer to ``path``.

    Returns:
        ``path`` as a string, for ``from_pretrained`` / ``--model_name_or_path``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..data import tokenizer_path

    tok = AutoTokenizer.from_pretrained(str(tokenizer_path()))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(builtin_config(name, len(tok), max_length), dtype=torch.float32)
    Path(path).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return str(path)


def save_sft_data(path: str | os.PathLike[str], n_train: int | None = None, n_test: int = 0,
                  format: str = "prompt_completion", source: str | os.PathLike[str] | None = None) -> str:
    """Write an SFT set as ``train.jsonl`` (and ``test.jsonl``) in ``path``: ``load_dataset(path)`` reads it.

    Args:
        n_train: examples in the train split (default: all but the test ones).
        n_test: examples in the test split (taken after the train ones).
        format: ``"prompt_completion"`` (shipped ``data/sft.jsonl``) or ``"messages"`` (``data/sft_chat.jsonl``).
        source: another JSONL file of the same format.

    Returns:
        ``path`` as a string, for ``load_dataset`` / ``--dataset_name``.
    """
    from ..data import default_data_dir

    src = Path(source) if source else default_data_dir() / ("sft.jsonl" if format == "prompt_completion"
                                                           else "sft_chat.jsonl")
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    n_train = len(rows) - n_test if n_train is None else n_train
    if n_train < 1 or n_train + n_test > len(rows):
        raise ValueError(f"{src} has {len(rows)} examples; asked for {n_train} train + {n_test} test")
    return write_splits(path, {"train": rows[:n_train], "test": rows[n_train:n_train + n_test]})


def write_splits(path: str | os.PathLike[str], splits: dict[str, Any]) -> str:
    """Write each split's rows (dicts) as ``<path>/<split>.jsonl``; an empty split leaves no file.

    Returns:
        ``path`` as a string (``datasets.load_dataset(path)`` reads the splits back).
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        file = out / f"{split}.jsonl"
        text = "".join(json.dumps(r) + "\n" for r in rows)
        if text:
            file.write_text(text)
        else:
            file.unlink(missing_ok=True)
    return str(out)
