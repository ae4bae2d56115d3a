"""DeepSeek-sparse ``"indexed_attention"`` layers on packed rows (``hf_hsap.integrations.indexed``): a tiny
DeepSeek-V3.2 whose indexer keeps 8 keys per query, on the zoo's row of five documents (7, 30, 1, 19 and 15 tokens),
against each document run alone with Transformers' eager attention, in float64: logits and every parameter gradient,
at SP 1 (the plain row and through ``shard_batch``) and at SP 2 with U 1, and U 2 with gradient checkpointing (the
30-token document split across both ranks).
Layer 0's indexer scores all tie at 0 in one case: the top-k is then ``torch.topk``'s order among ties, which
hf_hsap reproduces by running each document's indexer alone."""
from __future__ import annotations

import copy

import pytest
import torch

import hf_hsap
from hf_hsap.integrations import UnsupportedModelError
from hf_hsap.integrations.indexed import indexed_layers
from hf_hsap.testing import rel_err
from workers import indexed as W
from workers import zoo
from workers import zoo_configs as ZC

TIMEOUT_S = 240


@pytest.mark.parametrize("tied", [False, True])
def test_packed_row_is_exact_at_sp1(tied: bool) -> None:
    config, state = W.tiny_state(tied)
    with zoo.full_precision(config, torch.float64):
        ref = zoo.reference(config, state)
        native = zoo.packed_run(config, state, "eager", torch.float64)  # Transformers alone on the packed row
        runs = [zoo.packed_run(config, state, "hsap", torch.float64, via_shard=s) for s in (False, True)]
    for run in runs:
        res = zoo.compare(ref, run["logits"], run["loss"], run["grads"], zoo.TOL["fp64"])
        assert res["outcome"] == "exact", res
    # the selection matters: Transformers' own packed row takes its top-k over other scores and ties
    assert zoo.compare(ref, native["logits"], native["loss"], native["grads"], zoo.TOL["fp64"])["outcome"] == "WRONG"


@pytest.mark.parametrize("ulysses,checkpointing", [(1, False), (2, True)])
def test_document_split_over_two_ranks_is_exact(pools, ulysses: int, checkpointing: bool) -> None:
    config, state = W.tiny_state(tied=True)
    with zoo.full_precision(config, torch.float64):
        ref = zoo.reference(config, state)
    records = pools(2, TIMEOUT_S).run(W.sp_run, state, 2, ulysses, checkpointing)
    res = zoo.combine_sp(ref, [{"ok": True, **r} for r in records], 2, zoo.TOL["fp64"])
    assert res["outcome"] == "exact", res
    starts = torch.tensor([0, 7, 37, 38, 57, 72])
    split = [d for d in range(5) if all(((r["index"] >= starts[d]) & (r["index"] < starts[d + 1])).any()
                                        for r in records)]
    assert split, "no document spans both ranks"


def test_padded_rows_are_exact() -> None:
    """Two rows, the second right-padded, called with a padding mask (Transformers then finds no packed documents in
    the positions: hf_hsap's layers do, as the local attention does)."""
    rows = [[7, 30, 1], [19, 15]]
    config, state = W.tiny_state(tied=True)
    ids = torch.randint(3, config.vocab_size, (2, 38), generator=torch.Generator().manual_seed(3))
    pos = torch.stack([torch.cat([torch.arange(n) for n in r] + [torch.arange(38 - sum(r))]) for r in rows])
    pad = torch.ones(2, 38, dtype=torch.long)
    pad[1, 34:] = 0
    with zoo.full_precision(config, torch.float64):
        ref = ZC.build_model(copy.deepcopy(config), "eager", torch.float64, state_dict=state)
        model = ZC.build_model(config, "hsap", torch.float64, state_dict=state)
        hf_hsap.prepare_model(model, sp_size=1)
        out = model(input_ids=ids, position_ids=pos, attention_mask=pad, use_cache=False).logits  # [2, 38, V]
        for b, lens in enumerate(rows):
            for start, n in zip(torch.tensor([0, *lens]).cumsum(0).tolist(), lens):
                alone = ref(input_ids=ids[b:b + 1, start:start + n], position_ids=pos[b:b + 1, start:start + n],
                            use_cache=False).logits[0]
                assert rel_err(out[b, start:start + n], alone) < zoo.TOL["fp64"], (b, start)


def test_unprepared_model_and_cache_are_refused() -> None:
    config, state = W.tiny_state(tied=False)
    model = ZC.build_model(config, "hsap", torch.float64, state_dict=state)
    batch = zoo.global_batch(config.vocab_size)
    with pytest.raises(UnsupportedModelError, match="prepare_model"):
        model(**batch)
    prepared = hf_hsap.prepare_model(model, sp_size=1)
    assert len(indexed_layers(model)) == config.num_hidden_layers
    model(**batch)  # prepared: runs
    with pytest.raises(UnsupportedModelError, match="KV cache"):
        model(input_ids=batch["input_ids"][:, :5], use_cache=True)
    prepared.undo()
    with pytest.raises(UnsupportedModelError, match="prepare_model"):  # undone: refused again
        model(**batch)

