"""Tiny HF models under HSAP sequence parallelism (spawned gloo ranks) against documents run alone.

Every check compares with the same model run on each document by itself with eager attention: the
logits of every token, the model's loss (``sum(CE) / N`` over the whole global batch) and every
parameter's gradient (summed over the SP group), relative error <= 1e-4 in float32.
"""
from __future__ import annotations

import pytest
import torch

from helpers import rel_err
from workers import sp_model as W

TOL = 1e-4
TIMEOUT_S = 150  # each pool task's hang guard (DistPool.run)


_REFERENCES: dict = {}


def reference(kind: str) -> dict:
    """Logits ``[T, V]``, loss and gradients of ``loss + sum(w * logits)`` with each document alone (eager)."""
    if kind not in _REFERENCES:
        _REFERENCES[kind] = W.documents_alone(kind)
    return _REFERENCES[kind]


def _check(kind: str, results: list[dict], sp_size: int) -> None:
    ref = reference(kind)
    for group_start in range(0, len(results), sp_size):  # every SP group (DP replicas) on its own
        group = results[group_start:group_start + sp_size]
        logits = torch.full_like(ref["logits"], float("nan"))
        for r in group:
            logits[r["index"]] = r["logits"]
        assert rel_err(logits, ref["logits"]) <= TOL  # NaN left = a token no rank produced -> fails
        for r in group:
            assert r["num_items"] == ref["n_items"]
            assert abs(r["loss"] - ref["loss"]) <= TOL * ref["loss"]
            for name, g in r["grads"].items():
                assert rel_err(g, ref["grads"][name]) <= TOL, (kind, sp_size, name)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_sp1_matches_documents_alone(kind: str) -> None:
    _check(kind, [W.sp_forward_backward(kind, 1)], 1)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_sp2_matches_documents_alone(kind: str, pools) -> None:
    _check(kind, pools(2, TIMEOUT_S).run(W.sp_forward_backward, kind, 2), 2)


@pytest.mark.parametrize("kind,ulysses,placement", [("llama", 1, "auto"), ("qwen2", 1, "contiguous"),
                                                    ("qwen2", 2, "auto")])
def test_sp4_matches_documents_alone(kind: str, ulysses: int, placement: str, pools) -> None:
    _check(kind, pools(4, TIMEOUT_S).run(W.sp_forward_backward, kind, 4, ulysses, placement), 4)


@pytest.mark.parametrize("kv_token_cost,a2a_token_cost,degree", [(3.0, 20.0, 1), (30.0, 20.0, 2), (1000.0, 0.1, 4)])
def test_sp4_per_batch_degree_matches_documents_alone(kv_token_cost: float, a2a_token_cost: float, degree: int,
                                                      pools) -> None:
    """``ulysses_size="per_batch"``: the batch runs at the degree the group's cost model prices fastest (each
    case meets another one), and logits, loss and every gradient still equal the documents run alone."""
    cost = {"token_cost": 0.0, "kv_token_cost": kv_token_cost, "round_cost": 50.0, "a2a_token_cost": a2a_token_cost}
    res = pools(4, TIMEOUT_S).run(W.sp_forward_backward, "qwen2", 4, "per_batch", "auto", cost)
    assert {r["ulysses"] for r in res} == {degree}
    _check("qwen2", res, 4)


def test_sp2_with_two_dp_groups(pools) -> None:
    _check("qwen2", pools(4, TIMEOUT_S).run(W.sp_forward_backward, "qwen2", 2), 2)


def test_all_ignored_labels_and_refusals(pools) -> None:
    for res in pools(2, TIMEOUT_S).run(W.all_ignored_and_refusals, 2):
        assert res["loss"] == 0.0 and res["zero_grads"]
        assert "different global batches" in res["errors"]["differ"]
        assert "attention_mask" in res["errors"]["padding"]
        assert "position_ids" in res["errors"]["no_layout"]


def test_dataloader_adapter_shares_batches(pools) -> None:
    """5 batches over 2 ranks (3 + 2): every rank yields all 5, in the order one process reads them."""
    res = pools(2, TIMEOUT_S).run(W.loader_order, 2, 5)
    single = [int(W.global_batch([3, 5], seed=100 + i)["input_ids"][0, 0]) for i in range(5)]
    for r in res:
        assert r["yielded"] == 5 and r["firsts"] == single


def test_trl_sft_packing_sp2_logs_the_sp1_losses(pools, tmp_path) -> None:
    sp1 = W.sft_losses(1, str(tmp_path / "sp1"))
    sp2 = pools(2, TIMEOUT_S).run(W.sft_losses, 2, str(tmp_path / "sp2"))
    assert len(sp1) == 3
    for losses in sp2:
        assert losses == pytest.approx(sp1, rel=1e-5)


def test_hf_trainer_packing_collator_sp2_matches_sp1(pools, tmp_path) -> None:
    sp1 = W.trainer_losses(1, str(tmp_path / "sp1"))
    for res in pools(2, TIMEOUT_S).run(W.trainer_losses, 2, str(tmp_path / "sp2")):
        assert res["train"] == pytest.approx(sp1["train"], rel=1e-5)
        assert res["eval"] == pytest.approx(sp1["eval"], rel=1e-5)


def test_hf_trainer_resume_mid_epoch_sp2_logs_the_uninterrupted_losses(pools, tmp_path) -> None:
    """HSAPTrainer resumed from checkpoint-2 (mid-epoch) logs the losses of steps 3-4 of the full run: the SP
    loader skipped the trained batches itself."""
    for res in pools(2, TIMEOUT_S).run(W.trainer_resume_losses, 2, str(tmp_path / "resume")):
        assert len(res["full"]) == 4 and len(res["resumed"]) == 2, res
        assert res["resumed"] == pytest.approx(res["full"][2:], rel=1e-5)
        assert res["full"][2] != pytest.approx(res["full"][0], rel=1e-3)  # different batches, not a replay
