"""Unit tests for hf_hsap.data.packing (PackingCollator, shift_labels_packed, best_fit_decreasing)."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import hf_hsap
from helpers import ci_examples
from hf_hsap.data import PackingCollator, shift_labels_packed
from hf_hsap.data.packing import best_fit_decreasing

PAD = 0  # example tokens are drawn from 1.. so padding is recognisable


def naive_cu_seqlens(position_ids):
    """Document starts (position 0, or a row start) over the flattened batch, plus the total, as int32."""
    B, L = position_ids.shape
    starts = [r * L + i for r in range(B) for i in range(L) if i == 0 or position_ids[r, i] == 0]
    return torch.tensor([*starts, B * L], dtype=torch.int32)


def segments(batch):
    """(row, start, end) of every cu_seqlens segment, in row coordinates."""
    cu = batch["cu_seq_lens_q"].tolist()
    L = batch["input_ids"].shape[1]
    out = []
    for a, b in zip(cu[:-1], cu[1:]):
        r = a // L
        assert (b - 1) // L == r, "a segment spans two rows"
        out.append((r, a - r * L, b - r * L))
    return out


def real_docs(batch):
    """Token tuples of the non-padding documents (padding docs: all PAD tokens and all -100 labels at a row end)."""
    ids, labels = batch["input_ids"], batch["labels"]
    L = ids.shape[1]
    docs = []
    for r, a, b in segments(batch):
        is_pad = b == L and bool((ids[r, a:b] == PAD).all()) and bool((labels[r, a:b] == -100).all())
        if not is_pad:
            docs.append(tuple(ids[r, a:b].tolist()))
    return docs


def check_invariants(batch, collator):
    ids, labels, pos = batch["input_ids"], batch["labels"], batch["position_ids"]
    B, L = ids.shape
    assert L == collator.row_length and L % collator.pad_to_multiple_of == 0 and L >= collator.max_length
    assert labels.shape == pos.shape == (B, L)
    assert ids.dtype == labels.dtype == pos.dtype == torch.int64
    cu = batch["cu_seq_lens_q"]
    assert cu.dtype == torch.int32 and torch.equal(cu, batch["cu_seq_lens_k"])
    assert cu[0] == 0 and cu[-1] == B * L and bool((cu.diff() > 0).all())
    assert torch.equal(cu, naive_cu_seqlens(pos))  # cu_seqlens consistent with position_ids
    assert torch.equal(cu.long(), hf_hsap.cu_seqlens_from_position_ids(pos).long())  # and with the planner's view
    assert isinstance(batch["max_length_q"], int) and batch["max_length_q"] == batch["max_length_k"]
    assert batch["max_length_q"] == int(cu.diff().max())
    flat = pos.reshape(-1)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        assert torch.equal(flat[a:b], torch.arange(b - a))
    for r in range(B):  # every row starts a document; at most one padding doc, at the row end
        assert pos[r, 0] == 0
    assert bool((labels[pos == 0] == -100).all())  # first token of every document is not a target
    return B, L


def expected_pieces(examples, max_length, overflow="split"):
    pieces = []
    for ex in examples:
        ids = list(ex["input_ids"])
        if overflow == "truncate":
            pieces.append(tuple(ids[:max_length]))
        else:
            pieces += [tuple(ids[i : i + max_length]) for i in range(0, len(ids), max_length)]
    return pieces


def random_examples(rng, n, max_len):
    return [{"input_ids": [rng.randint(1, 500) for _ in range(rng.randint(1, max_len))]} for _ in range(n)]


def test_docstring_example():
    batch = PackingCollator(max_length=8)([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7, -100, 9, -100, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 5, 8]
    assert batch["max_length_q"] == 3


@settings(max_examples=ci_examples(60))
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 12),
    max_length=st.integers(1, 40),
    mult=st.sampled_from([1, 2, 4, 8]),
    overflow=st.sampled_from(["split", "truncate"]),
)
def test_every_example_exactly_once(seed, n, max_length, mult, overflow):
    rng = random.Random(seed)
    examples = random_examples(rng, n, 3 * max_length)
    collator = PackingCollator(max_length, pad_to_multiple_of=mult, overflow=overflow, pad_token_id=PAD)
    batch = collator(examples)
    B, L = check_invariants(batch, collator)
    docs = real_docs(batch)
    want = expected_pieces(examples, max_length, overflow)
    assert Counter(docs) == Counter(want)  # contents, one document per piece
    assert all(len(d) <= max_length for d in docs)
    real_tokens = Counter(t for d in want for t in d)
    assert Counter(batch["input_ids"][batch["input_ids"] != PAD].tolist()) == real_tokens  # token multiset
    # no row holds more than L tokens; at most one padding document per row, at its end
    per_row = Counter(r for r, _, _ in segments(batch))
    assert sum(len(d) for d in docs) <= B * L and len(per_row) == B


def test_best_fit_decreasing_tight():
    lengths = [1, 6, 2, 5, 1, 4, 3, 2]  # 24 tokens: BFD makes 3 full bins of 8 (next-fit in order needs 4)
    bins = best_fit_decreasing(lengths, 8)
    assert len(bins) == 3 and all(sum(lengths[i] for i in b) == 8 for b in bins)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    examples = [{"input_ids": list(range(1, n + 1))} for n in lengths]
    batch = PackingCollator(8)(examples)
    assert batch["input_ids"].shape == (3, 8)
    assert len(batch["cu_seq_lens_q"]) == len(lengths) + 1  # exactly full rows: no padding documents
    assert not bool((batch["input_ids"] == PAD).any())


def test_best_fit_prefers_tightest_bin():
    # 7 opens bin0 (free 3), 5 opens bin1 (free 5), 3 must go to bin0 (tightest), 4 then fits bin1.
    assert best_fit_decreasing([5, 7, 3, 4], 10) == [[1, 2], [0, 3]]


def test_labels_first_token_padding_and_given_labels():
    ex = [{"input_ids": [11, 12, 13, 14], "labels": [-100, -100, 13, 14]}, {"input_ids": [21, 22]}]
    batch = PackingCollator(max_length=9, pad_token_id=PAD)(ex)
    assert batch["input_ids"].tolist() == [[11, 12, 13, 14, 21, 22, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, -100, 13, 14, -100, 22, -100, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 0, 1, 2]]


@pytest.mark.parametrize("key", ["completion_mask", "assistant_masks"])
def test_completion_only_loss(key):
    ex = [{"input_ids": [1, 2, 3, 4, 5], key: [0, 0, 1, 1, 1], "attention_mask": [1] * 5}]
    on = PackingCollator(5, completion_only_loss=True)(ex)
    assert on["labels"].tolist() == [[-100, -100, 3, 4, 5]]
    off = PackingCollator(5, completion_only_loss=False)(ex)
    assert off["labels"].tolist() == [[-100, 2, 3, 4, 5]]
    # a mask that is 1 on the first token still gets -100 there (document start)
    ex2 = [{"input_ids": [7, 8, 9], key: [1, 0, 1]}]
    assert PackingCollator(3, completion_only_loss=True)(ex2)["labels"].tolist() == [[-100, -100, 9]]


def test_pad_to_multiple_of():
    collator = PackingCollator(max_length=10, pad_to_multiple_of=4, pad_token_id=PAD)
    assert collator.row_length == 12
    batch = collator([{"input_ids": [1] * 7}, {"input_ids": [2] * 5}, {"input_ids": [3] * 3}])
    B, L = check_invariants(batch, collator)
    assert L == 12 and (B * L) % 4 == 0
    assert sorted(real_docs(batch)) == sorted([(1,) * 7, (2,) * 5, (3,) * 3])
    assert PackingCollator(max_length=12, pad_to_multiple_of=4).row_length == 12
    assert PackingCollator(max_length=1, pad_to_multiple_of=8).row_length == 8
    assert PackingCollator(max_length=5, pad_to_multiple_of=None).row_length == 5


def test_split_vs_truncate():
    ids = list(range(1, 26))
    split = PackingCollator(10, overflow="split")([{"input_ids": ids}])
    assert sorted(real_docs(split)) == sorted([tuple(ids[:10]), tuple(ids[10:20]), tuple(ids[20:])])
    assert int((split["labels"] != -100).sum()) == 25 - 3  # each piece's first token is masked
    trunc = PackingCollator(10, overflow="truncate")([{"input_ids": ids}])
    assert trunc["input_ids"].tolist() == [ids[:10]] and trunc["cu_seq_lens_q"].tolist() == [0, 10]


def test_trl_seq_lengths_and_tensor_inputs():
    ex = {
        "input_ids": torch.tensor([1, 2, 3, 4, 5, 6, 7]),
        "labels": torch.tensor([1, 2, 3, 4, -100, 6, 7]),
        "seq_lengths": [3, 4],
    }
    batch = PackingCollator(8)([ex])
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0]]
    assert batch["labels"].tolist() == [[-100, 2, 3, -100, -100, 6, 7, -100]]
    np_batch = PackingCollator(8, return_tensors="np")([{"input_ids": np.array([3, 4])}])
    assert isinstance(np_batch["input_ids"], np.ndarray) and np_batch["cu_seq_lens_q"].dtype == np.int32


def naive_shift(labels, pos):
    out = torch.full_like(labels, -100)
    for b in range(labels.shape[0]):
        for i in range(labels.shape[1] - 1):
            if pos[b, i + 1] != 0:
                out[b, i] = labels[b, i + 1]
    return out


@settings(max_examples=ci_examples(80))
@given(seed=st.integers(0, 2**31 - 1), B=st.integers(1, 4), L=st.integers(1, 30))
def test_shift_labels_packed_matches_naive(seed, B, L):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(-100, 50, (B, L), generator=g)
    starts = torch.rand(B, L, generator=g) < 0.25
    starts[:, 0] = True
    idx = torch.arange(L).expand(B, L)
    pos = idx - torch.cummax(torch.where(starts, idx, 0), dim=1).values  # restarts at 0 at every start
    assert bool((pos[starts] == 0).all()) and bool((pos[~starts] > 0).all())
    assert torch.equal(shift_labels_packed(labels, pos), naive_shift(labels, pos))


def test_shift_labels_on_collated_batch():
    rng = random.Random(0)
    batch = PackingCollator(16, pad_to_multiple_of=4)(random_examples(rng, 10, 20))
    shifted = shift_labels_packed(batch["labels"], batch["position_ids"])
    assert torch.equal(shifted, naive_shift(batch["labels"], batch["position_ids"]))
    assert (shifted[:, -1] == -100).all()
    with pytest.raises(ValueError, match="same shape"):
        shift_labels_packed(batch["labels"], batch["position_ids"][:, :-1])


def test_dataloader_with_datasets():
    datasets = pytest.importorskip("datasets")
    rng = random.Random(1)
    rows = random_examples(rng, 40, 50)
    ds = datasets.Dataset.from_list([{**r, "text": "x"} for r in rows])
    collator = PackingCollator(32, pad_to_multiple_of=8, pad_token_id=PAD)
    seen = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=collator):
        check_invariants(batch, collator)
        seen += real_docs(batch)
    assert Counter(seen) == Counter(expected_pieces(rows, 32))
    iterable = datasets.IterableDataset.from_generator(lambda: iter(rows))
    seen = []
    for batch in torch.utils.data.DataLoader(iterable, batch_size=8, collate_fn=collator):
        seen += real_docs(batch)
    assert Counter(seen) == Counter(expected_pieces(rows, 32))
    torch_ds = datasets.Dataset.from_list(rows).with_format("torch")
    batch = next(iter(torch.utils.data.DataLoader(torch_ds, batch_size=4, collate_fn=collator)))
    assert Counter(real_docs(batch)) == Counter(expected_pieces(rows[:4], 32))


def test_packed_rows_match_unpacked_forward():
    """A tiny Llama on the packed batch gives each document the logits it gets alone (no cross-document leak)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    rng = random.Random(2)
    examples = [{"input_ids": [rng.randint(1, 63) for _ in range(n)]} for n in (9, 3, 6, 12, 1)]
    batch = PackingCollator(16, pad_token_id=PAD)(examples)
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        for r, a, b in segments(batch):
            doc = batch["input_ids"][r, a:b]
            if (doc == PAD).all():
                continue
            alone = model(input_ids=doc[None], use_cache=False).logits[0]
            torch.testing.assert_close(packed[r, a:b], alone, atol=1e-5, rtol=1e-4)


def test_as_trl_sft_data_collator(tmp_path):
    """SFTTrainer (prompt-completion data, completion-only loss) trains a step with PackingCollator as collator."""
    trl = pytest.importorskip("trl")
    transformers = pytest.importorskip("transformers")
    from hf_hsap.data import load_sft_dataset, tokenizer_path

    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_path()))
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = transformers.LlamaForCausalLM(cfg)
    seen = []

    class Recording(PackingCollator):
        def __call__(self, examples):
            seen.append(examples)
            return super().__call__(examples)

    collator = Recording(128, pad_to_multiple_of=4, pad_token_id=tok.pad_token_id, completion_only_loss=True)
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=4,
        max_length=None,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    ds = load_sft_dataset(format="prompt_completion").select(range(8))
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, data_collator=collator)
    result = trainer.train()
    assert math.isfinite(result.training_loss)
    assert seen and {"input_ids", "labels"} <= set(seen[0][0])  # TRL folded completion_mask into labels
    batch = collator(seen[0])
    assert bool((batch["labels"] == -100).any()) and batch["input_ids"].shape[1] == 128


@pytest.mark.parametrize(
    "kwargs, examples, match",
    [
        ({"max_length": 0}, None, "max_length"),
        ({"max_length": 8, "pad_to_multiple_of": 0}, None, "pad_to_multiple_of"),
        ({"max_length": 8, "overflow": "drop"}, None, "overflow"),
        ({"max_length": 8, "return_tensors": "tf"}, None, "return_tensors"),
        ({"max_length": 8}, [{"input_ids": []}], "empty input_ids"),
        ({"max_length": 8}, [], "empty batch"),
        ({"max_length": 8}, [{"input_ids": [1, 2], "labels": [1]}], "labels"),
        ({"max_length": 8}, [{"text": "no ids"}], "input_ids"),
        ({"max_length": 8}, [{"input_ids": [[1, 2], [3, 4]]}], "1-D"),
        ({"max_length": 8}, [{"input_ids": [1, 2, 3], "seq_lengths": [1, 1]}], "seq_lengths"),
        ({"max_length": 8, "completion_only_loss": True}, [{"input_ids": [1, 2], "completion_mask": [1]}], "mask"),
    ],
)
def test_bad_inputs_raise(kwargs, examples, match):
    with pytest.raises(ValueError, match=match):
        collator = PackingCollator(**kwargs)
        collator(examples)
