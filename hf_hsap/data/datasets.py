"""Loaders for the project's shipped data (``data/`` at the repository root) and a tokenizer helper.

The shipped files are made by ``data/make_data.py`` (see ``data/README.md``):

* ``data/corpus.jsonl``: pretraining corpus, one ``{"text": ...}`` document per line.
* ``data/sft.jsonl``: ``{"prompt": ..., "completion": ...}`` pairs.
* ``data/sft_chat.jsonl``: ``{"messages": [{"role": ..., "content": ...}, ...]}`` conversations.
* ``data/tokenizer/``: a byte-level BPE tokenizer, ``AutoTokenizer.from_pretrained(tokenizer_path())``.

Set ``HSAP_DATA_DIR`` to use another directory laid out the same way (e.g. when hf_hsap is installed without
its repository).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import datasets as hf_datasets

from ..log import get_logger

__all__ = [
    "DATA_DIR",
    "default_data_dir",
    "load_pretrain_corpus",
    "load_sft_dataset",
    "tokenize_corpus",
    "tokenizer_path",
]

logger = get_logger(__name__)

_SUFFIX_BUILDERS = {".jsonl": "json", ".json": "json", ".txt": "text", ".csv": "csv", ".parquet": "parquet"}
_SFT_FORMATS = {
    "prompt_completion": ("sft.jsonl", ("prompt", "completion")),
    "messages": ("sft_chat.jsonl", ("messages",)),
}


def default_data_dir() -> Path:
    """The shipped data directory: ``$HSAP_DATA_DIR`` if set, else ``<repo root>/data``."""
    env = os.environ.get("HSAP_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "data"


DATA_DIR: Path = default_data_dir()


def tokenizer_path() -> Path:
    """Directory of the shipped tokenizer (load it with ``AutoTokenizer.from_pretrained``)."""
    return default_data_dir() / "tokenizer"


def _shipped(name: str) -> Path:
    path = default_data_dir() / name
    if not path.exists():
        raise FileNotFoundError(
            f"shipped data file {path} not found; run `python data/make_data.py` from the repository root, "
            "or set HSAP_DATA_DIR to a directory holding it, or pass an explicit path"
        )
    return path


def _load(path: str | os.PathLike[str], split: str) -> hf_datasets.Dataset:
    """Load a local file, a local dataset directory, or a dataset name from the Hub (in that order)."""
    local = Path(path).expanduser()
    if local.is_file():
        builder = _SUFFIX_BUILDERS.get(local.suffix.lower())
        if builder is None:
            raise ValueError(f"cannot load {local}: use one of {sorted(_SUFFIX_BUILDERS)} files")
        return hf_datasets.load_dataset(builder, data_files=str(local), split="train")
    if local.is_dir():
        if (local / "dataset_info.json").exists() or (local / "dataset_dict.json").exists():
            ds = hf_datasets.load_from_disk(str(local))
            return ds[split] if isinstance(ds, hf_datasets.DatasetDict) else ds
        return hf_datasets.load_dataset(str(local), split=split)
    return hf_datasets.load_dataset(str(path), split=split)


def load_pretrain_corpus(
    path: str | os.PathLike[str] | None = None, split: str = "train", text_field: str = "text"
) -> hf_datasets.Dataset:
    """Load a pretraining corpus with one document per row in a ``text`` column.

    Args:
        path: ``None`` for the shipped ``data/corpus.jsonl``; else a local ``.jsonl/.json/.txt/.csv/.parquet``
            file, a directory (``save_to_disk`` output or data files), or a ``datasets`` Hub name.
        split: Split to take from a directory or Hub dataset.
        text_field: Column holding the text; renamed to ``text`` if different.

    Returns:
        A ``datasets.Dataset`` with (at least) a ``text`` column.
    """
    ds = _load(_shipped("corpus.jsonl") if path is None else path, split)
    if text_field != "text":
        if text_field not in ds.column_names:
            raise ValueError(f"column {text_field!r} not in {ds.column_names}; pass text_field=<the text column>")
        ds = ds.rename_column(text_field, "text")
    if "text" not in ds.column_names:
        raise ValueError(f"no 'text' column in {ds.column_names}; pass text_field=<the text column>")
    return ds


def load_sft_dataset(
    path: str | os.PathLike[str] | None = None, format: str = "prompt_completion", split: str = "train"
) -> hf_datasets.Dataset:
    """Load an SFT dataset in TRL's ``prompt``/``completion`` or conversational ``messages`` format.

    Args:
        path: ``None`` for the shipped ``data/sft.jsonl`` (``format="prompt_completion"``) or
            ``data/sft_chat.jsonl`` (``format="messages"``); else a local file, directory or Hub name.
        format: ``"prompt_completion"`` or ``"messages"``; the required columns are checked.
        split: Split to take from a directory or Hub dataset.

    Returns:
        A ``datasets.Dataset`` with ``prompt`` and ``completion`` string columns, or a ``messages`` column of
        ``[{"role": ..., "content": ...}, ...]`` lists.
    """
    if format not in _SFT_FORMATS:
        raise ValueError(f"format must be one of {sorted(_SFT_FORMATS)}, got {format!r}")
    default_file, required = _SFT_FORMATS[format]
    ds = _load(_shipped(default_file) if path is None else path, split)
    missing = [c for c in required if c not in ds.column_names]
    if missing:
        raise ValueError(f"{format} dataset needs columns {list(required)}, missing {missing} in {ds.column_names}")
    return ds


def _detect_format(columns: list[str]) -> str:
    if "messages" in columns:
        return "messages"
    if "prompt" in columns and "completion" in columns:
        return "prompt_completion"
    if "text" in columns:
        return "text"
    raise ValueError(f"cannot tokenize columns {columns}: need 'text', 'prompt'+'completion' or 'messages'")


def tokenize_corpus(
    dataset: hf_datasets.Dataset | hf_datasets.IterableDataset,
    tokenizer: Any,
    text_field: str = "text",
    add_eos: bool = True,
    num_proc: int | None = None,
) -> hf_datasets.Dataset | hf_datasets.IterableDataset:
    """Tokenize a dataset into examples ready for :class:`~hf_hsap.data.PackingCollator`.

    The format is detected from the columns:

    * ``text`` (or ``text_field``): ``input_ids`` = tokens of the text (+ EOS if ``add_eos``).
    * ``prompt`` + ``completion`` (strings): ``input_ids`` = prompt tokens + completion tokens (+ EOS), and
      ``completion_mask`` (0 on prompt, 1 on completion and EOS). The two parts are tokenized separately, so the
      boundary is exact.
    * ``messages``: the tokenizer's chat template with ``return_assistant_tokens_mask=True``: ``input_ids`` and
      ``assistant_masks`` (1 on assistant turns, including their end-of-turn token).

    Other columns are dropped, and so are examples that tokenize to nothing.

    Args:
        dataset: A map-style or iterable ``datasets`` dataset.
        tokenizer: A Transformers tokenizer (e.g. ``AutoTokenizer.from_pretrained(tokenizer_path())``).
        text_field: Text column for plain corpora.
        add_eos: Append ``tokenizer.eos_token_id`` to text and completion examples.
        num_proc: Worker processes for ``Dataset.map`` (ignored for iterable datasets).

    Returns:
        A dataset of the same kind with ``input_ids`` (and ``completion_mask`` / ``assistant_masks``).
    """
    columns = dataset.column_names
    if columns is None:  # an IterableDataset without known features
        columns = list(next(iter(dataset)).keys())
    fmt = "text" if text_field in columns and text_field != "text" else _detect_format(list(columns))
    eos = [tokenizer.eos_token_id] if add_eos and tokenizer.eos_token_id is not None else []
    if add_eos and not eos and fmt != "messages":
        logger.warning("tokenize_corpus: add_eos=True but the tokenizer has no eos_token_id, so no EOS is appended "
                       "and the model never learns where a document ends; set tokenizer.eos_token")
    logger.info("tokenize_corpus: columns %s tokenized as %r", list(columns), fmt)

    def encode(texts: list[str]) -> list[list[int]]:
        return tokenizer(texts, add_special_tokens=False)["input_ids"]

    if fmt == "text":

        def fn(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
            return {"input_ids": [ids + eos for ids in encode(batch[text_field])]}

    elif fmt == "prompt_completion":

        def fn(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
            out: dict[str, list[Any]] = {"input_ids": [], "completion_mask": []}
            for p, c in zip(encode(batch["prompt"]), encode(batch["completion"])):
                out["input_ids"].append(p + c + eos)
                out["completion_mask"].append([0] * len(p) + [1] * (len(c) + len(eos)))
            return out

    else:

        def fn(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
            out: dict[str, list[Any]] = {"input_ids": [], "assistant_masks": []}
            for messages in batch["messages"]:
                enc = tokenizer.apply_chat_template(
                    messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
                )
                out["input_ids"].append(list(enc["input_ids"]))
                out["assistant_masks"].append(list(enc["assistant_masks"]))
            return out

    kwargs: dict[str, Any] = {"batched": True, "remove_columns": list(columns)}
    if isinstance(dataset, hf_datasets.Dataset):
        kwargs.update(num_proc=num_proc, desc=f"Tokenizing ({fmt})")
    ds = dataset.map(fn, **kwargs)
    kept = ds.filter(lambda ex: len(ex["input_ids"]) > 0)
    if isinstance(ds, hf_datasets.Dataset) and len(kept) < len(ds):
        logger.info("tokenize_corpus: dropped %d of %d examples that tokenize to nothing", len(ds) - len(kept), len(ds))
    return kept
