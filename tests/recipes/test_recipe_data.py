"""Fast checks of the recipes' data paths: the pretraining step data does not depend on the DP layout, and
``SPDataLoader`` skips exactly (and refuses Accelerate's rebuild) when resuming."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hf_hsap import SPGroup
from hf_hsap.data import PackingCollator
from hf_hsap.integrations import SPDataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes"))
from pretrain_data import StepData, deal_documents, split_train_eval  # noqa: E402


class _Rows:
    """A stand-in for a tokenized ``datasets.Dataset``: ``rows[list]["input_ids"]``."""

    def __init__(self, docs: list[list[int]]) -> None:
        self.docs = docs

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, rows: list[int]) -> dict[str, list[list[int]]]:
        return {"input_ids": [self.docs[i] for i in rows]}


def _step_data(seed: int = 0, docs_per_step: int = 6) -> StepData:
    g = torch.Generator().manual_seed(5)
    docs = [torch.randint(3, 50, (int(n),), generator=g).tolist() for n in torch.randint(1, 40, (23,), generator=g)]
    train, _ = split_train_eval(len(docs), 3, seed)
    return StepData(_Rows(docs), train, docs_per_step, PackingCollator(max_length=16), seed)


def _tokens(batches: list) -> list[int]:
    return sorted(t for m in batches for t in m.batch["input_ids"][m.batch["labels"] != -100].tolist())


def test_step_data_is_the_same_for_every_dp_layout() -> None:
    data = _step_data()
    for step in (0, 3, 7):  # 7 crosses into the second epoch (20 train docs, 6 per step)
        one = data.micro_batches(step, 1, 0, 1)
        for dp, accum in ((2, 1), (3, 2)):
            parts = [m for r in range(dp) for m in data.micro_batches(step, dp, r, accum)]
            assert _tokens(parts) == _tokens(one)
            assert sum(m.targets for m in parts) == sum(m.targets for m in one)
            assert sum(m.tokens for m in parts) == sum(m.tokens for m in one)
    a, b = _step_data(seed=0), _step_data(seed=1)
    assert a.step_documents(0) != b.step_documents(0)
    assert a.step_documents(4) == _step_data(seed=0).step_documents(4)  # a pure function of (seed, step)


def test_deal_documents_balances_and_refuses_empty_bins() -> None:
    bins = deal_documents([9, 1, 8, 2, 7, 3], 3)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert sorted(sum([9, 1, 8, 2, 7, 3][i] for i in b) for b in bins) == [10, 10, 10]
    with pytest.raises(ValueError, match="docs_per_step"):
        deal_documents([1, 2], 3)


def _batches(n: int) -> list[dict[str, torch.Tensor]]:
    out = []
    for i in range(n):
        ids = torch.tensor([[100 + i, 1, 2, 3]])
        out.append({"input_ids": ids, "labels": ids.clone(), "position_ids": torch.tensor([[0, 1, 0, 1]])})
    return out


def test_sp_loader_skip_first_batches() -> None:
    loader = SPDataLoader(_batches(5), SPGroup.single())
    firsts = [int(b["hsap_plan"].gather(b["input_ids"][0])[0]) for b in loader]
    assert firsts == [100, 101, 102, 103, 104]
    skipped = loader.skip_first_batches(2)
    assert len(skipped) == 3 and len(loader) == 5
    assert [int(b["input_ids"][0, 0]) for b in skipped] == [102, 103, 104]
    assert [int(b["input_ids"][0, 0]) for b in skipped] == [102, 103, 104]  # skips on every pass
    once = loader.skip_first_batches(3, first_pass_only=True)
    assert len(once) == 5  # a resumed epoch still counts as a full one for Trainer's epoch arithmetic
    assert [int(b["input_ids"][0, 0]) for b in once] == [103, 104]
    assert [int(b["input_ids"][0, 0]) for b in once] == [100, 101, 102, 103, 104]


def test_sp_loader_refuses_accelerates_rebuild() -> None:
    """Accelerate's skip_first_batches rebuilds a plain loader from ``sampler`` / ``batch_sampler`` (it would
    yield this rank's unsharded batches): the wrapper does not expose them, so that path fails loudly."""
    inner = torch.utils.data.DataLoader(_batches(4), batch_size=None)
    loader = SPDataLoader(inner, SPGroup.single())
    assert loader.dataset is inner.dataset and len(loader) == 4  # other attributes are still forwarded
    for name in ("sampler", "batch_sampler"):
        with pytest.raises(AttributeError, match="skip_first_batches"):
            getattr(loader, name)
    assert getattr(loader, "batch_sampler", None) is None  # Trainer's optional look-up still works
    assert [int(b["input_ids"][0, 0]) for b in loader.skip_first_batches(3)] == [103]
