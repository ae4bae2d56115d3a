"""Tests for the shipped data (data/) and the hf_hsap.data.datasets helpers."""

from __future__ import annotations

import json
import math
import statistics

import pytest

datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")

from hf_hsap.data import (  # noqa: E402
    PackingCollator,
    default_data_dir,
    load_pretrain_corpus,
    load_sft_dataset,
    tokenize_corpus,
    tokenizer_path,
)


@pytest.fixture(scope="module")
def tok():
    return transformers.AutoTokenizer.from_pretrained(str(tokenizer_path()), local_files_only=True)


@pytest.fixture(scope="module")
def corpus():
    return load_pretrain_corpus()


def test_shipped_files_exist():
    root = default_data_dir()
    for name in ("corpus.jsonl", "sft.jsonl", "sft_chat.jsonl", "README.md", "make_data.py", "stats.json"):
        assert (root / name).is_file(), name
    assert (root / "tokenizer" / "tokenizer.json").is_file()
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert total < 5.5 * 2**20, f"shipped data is {total / 2**20:.1f} MiB"


def test_tokenizer_offline_roundtrip(tok):
    assert 2000 <= len(tok) <= 4000
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|pad|>" and tok.pad_token_id != tok.eos_token_id
    for text in [
        "The quiet fox walked to Ashford.",
        "def f(x):\n    return x * 2  # twice\n",
        "Unicode: naïve café, 東京, emoji 😀, tabs\tand  double  spaces.",
        "12 + 30 = 42<|endoftext|>",
    ]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    assert tok.convert_tokens_to_ids("<|im_end|>") in tok("<|im_end|>", add_special_tokens=False)["input_ids"]


def test_chat_template_marks_assistant_turns(tok):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "5."},
        {"role": "user", "content": "Thanks!"},
    ]
    out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    masked = [i for i, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tok.decode(masked) == "5.<|im_end|>"
    prompt = tok.apply_chat_template(msgs[:2], tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    full = tok.apply_chat_template(msgs[:3], tokenize=True, return_dict=True)["input_ids"]
    assert full[: len(prompt)] == prompt  # prefix-preserving, as TRL requires
    trl_utils = pytest.importorskip("trl.chat_template_utils")
    assert trl_utils.has_generation_markers(tok.chat_template)
    assert trl_utils.is_chat_template_stop_token_trained(tok)


def test_corpus_length_spread(corpus, tok):
    assert corpus.column_names == ["text"] and len(corpus) >= 1000
    lengths = [len(ids) for ids in tok(list(corpus["text"]), add_special_tokens=False)["input_ids"]]
    assert min(lengths) >= 1
    assert sum(n < 16 for n in lengths) >= 20  # some tiny documents
    assert sum(n > 1024 for n in lengths) >= 20  # some longer than one rank's shard in the CPU demo
    assert max(lengths) > 4000  # several thousand tokens
    logs = [math.log(n) for n in lengths]  # roughly log-normal: median ~ geometric mean, wide spread
    assert 50 <= statistics.median(lengths) <= 400
    assert abs(statistics.median(logs) - statistics.mean(logs)) < 0.3 and statistics.stdev(logs) > 1.0
    stats = json.loads((default_data_dir() / "stats.json").read_text())
    assert stats["corpus_tokens"]["count"] == len(lengths) and stats["corpus_tokens"]["max"] == max(lengths)


def test_sft_formats(tok):
    pc = load_sft_dataset(format="prompt_completion")
    assert {"prompt", "completion"} <= set(pc.column_names) and len(pc) >= 500
    assert all(isinstance(r["prompt"], str) and r["completion"] for r in pc.select(range(20)))
    chat = load_sft_dataset(format="messages")
    assert "messages" in chat.column_names and len(chat) >= 300
    for row in chat.select(range(50)):
        roles = [m["role"] for m in row["messages"] if m["role"] != "system"]
        assert roles[::2] == ["user"] * len(roles[::2]) and roles[1::2] == ["assistant"] * len(roles[1::2])
        assert roles[-1] == "assistant"
    with pytest.raises(ValueError, match="format"):
        load_sft_dataset(format="alpaca")


def test_load_local_file_and_text_field(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps({"body": f"document {i}"}) for i in range(3)) + "\n")
    ds = load_pretrain_corpus(path, text_field="body")
    assert list(ds["text"]) == ["document 0", "document 1", "document 2"]
    with pytest.raises(ValueError, match="text_field"):
        load_pretrain_corpus(path)


def test_tokenize_all_formats_feed_the_collator(corpus, tok):
    collator = PackingCollator(
        max_length=1024, pad_to_multiple_of=8, pad_token_id=tok.pad_token_id, completion_only_loss=True
    )
    text = tokenize_corpus(corpus.select(range(64)), tok)
    assert text.column_names == ["input_ids"] and all(
        ids[-1] == tok.eos_token_id for ids in list(text["input_ids"])[:8]
    )
    pc = tokenize_corpus(load_sft_dataset(format="prompt_completion").select(range(16)), tok)
    assert set(pc.column_names) == {"input_ids", "completion_mask"}
    ex = pc[0]
    completion = [t for t, m in zip(ex["input_ids"], ex["completion_mask"]) if m]
    assert tok.decode(completion).endswith("<|endoftext|>") and 0 in ex["completion_mask"]
    chat = tokenize_corpus(load_sft_dataset(format="messages").select(range(16)), tok)
    assert set(chat.column_names) == {"input_ids", "assistant_masks"}
    for ds, key in ((text, None), (pc, "completion_mask"), (chat, "assistant_masks")):
        batch = collator(list(ds))
        assert batch["cu_seq_lens_q"][-1] == batch["input_ids"].numel()
        n_target = int((batch["labels"] != -100).sum())
        assert 0 < n_target < sum(len(r["input_ids"]) for r in ds)
        if key:
            assert n_target <= sum(sum(r[key]) for r in ds)
    streamed = tokenize_corpus(corpus.select(range(8)).to_iterable_dataset(), tok)
    assert [r["input_ids"] for r in streamed] == list(text["input_ids"])[:8]
