"""The memory levers (chunked loss, gradient checkpointing, tiled MLP, recomputed norms, tiled attention at SP 1) exact
on packed rows, at SP 1 and under SP 2 / 4 with U 1 and 2 (spawned gloo ranks), against each document run alone in
float64 eager: logits of every token, the loss ``sum(CE) / N`` and every parameter's gradient (summed over the SP
group)."""
from __future__ import annotations

import pytest
import torch

from helpers import rel_err
from workers import levers as L
from workers import sp_model as W

TIMEOUT_S = 150
TOL = {torch.float32: 1e-4, torch.float64: 1e-6}
ALL = {"chunked_loss": True, "loss_tile_tokens": 16, "gradient_checkpointing": True, "tiled_mlp": True,
       "mlp_tile_tokens": 8, "recompute_norms": True}
_REFERENCES: dict = {}


def reference(kind: str) -> dict:
    """float64 eager, each document alone: logits ``[T, V]``, the loss ``sum(CE) / N`` and its gradients."""
    if kind not in _REFERENCES:
        _REFERENCES[kind] = W.documents_alone(kind, torch.float64, weighted=False)
    return _REFERENCES[kind]


def check(kind: str, results: list[dict], dtype: torch.dtype = torch.float32) -> None:
    ref, tol = reference(kind), TOL[dtype]
    logits = torch.full_like(ref["logits"], float("nan"))
    for r in results:
        logits[r["index"]] = r["logits"]
    assert rel_err(logits, ref["logits"]) <= tol  # a token no rank produced stays NaN and fails
    for r in results:
        assert r["num_items"] == ref["n_items"]
        assert abs(r["loss"] - ref["loss"]) <= tol * ref["loss"]
        for name, g in r["grads"].items():
            assert rel_err(g, ref["grads"][name]) <= tol, (kind, name)


@pytest.mark.parametrize("levers", [{"loss_tile_tokens": 16}, ALL, {**ALL, "chunked_loss": False},
                                    {"chunked_loss": False, "tiled_mlp": True, "mlp_tile_tokens": 5},
                                    {"chunked_loss": False, "recompute_norms": True},
                                    {"chunked_loss": False, "tiled_attention": True, "attention_tile_tokens": 16},
                                    {**ALL, "tiled_attention": True, "attention_tile_tokens": 7}],
                         ids=["chunked", "all", "checkpointing+tiled", "tiled", "norms", "attention-tiles",
                              "all+attention-tiles"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_sp1_levers_match_documents_alone(levers: dict, dtype: torch.dtype) -> None:
    res = L.levers_forward_backward("qwen2", 1, levers, dtype=dtype)
    assert res["chunked"] == ("ChunkedLMHead" if levers.get("chunked_loss", True) else "Linear")
    assert res["attention_tiles"] == ({levers["attention_tile_tokens"]} if levers.get("tiled_attention") else set())
    check("qwen2", [res], dtype)


@pytest.mark.parametrize("kind,sp_size,ulysses,levers", [
    ("llama", 2, 1, ALL), ("qwen2", 2, 1, {**ALL, "chunked_loss": False}),
    ("llama", 4, 1, ALL), ("qwen2", 4, 2, ALL)], ids=["sp2-u1", "sp2-u1-logits", "sp4-u1", "sp4-u2"])
def test_sp_levers_match_documents_alone(kind: str, sp_size: int, ulysses: int, levers: dict, pools) -> None:
    check(kind, pools(sp_size, TIMEOUT_S).run(L.levers_forward_backward, kind, sp_size, levers, ulysses))


def test_sp2_float64_all_levers(pools) -> None:
    check("llama", pools(2, TIMEOUT_S).run(L.levers_forward_backward, "llama", 2, ALL, 1, torch.float64),
          torch.float64)


def test_hf_trainer_with_levers_logs_the_plain_losses(pools, tmp_path) -> None:
    """HSAPTrainer at SP 2 with gradient checkpointing, the chunked loss (its default) and the tiled MLP logs the
    training and eval losses of one process without any lever (full logits)."""
    plain = W.trainer_losses(1, str(tmp_path / "plain"), hsap_chunked_loss=False)
    levers = dict(gradient_checkpointing=True, hsap_tiled_mlp=True, hsap_mlp_tile_tokens=8, hsap_loss_tile_tokens=16,
                  hsap_recompute_norms=True)
    for res in pools(2, TIMEOUT_S).run(_trainer_levers, str(tmp_path / "levers"), levers):
        assert res["train"] == pytest.approx(plain["train"], rel=1e-5)
        assert res["eval"] == pytest.approx(plain["eval"], rel=1e-5)


def test_sft_trainer_with_levers_logs_the_plain_losses(pools, tmp_path) -> None:
    """HSAPSFTTrainer (TRL's fused LM head) at SP 2 with gradient checkpointing, activation offloading (nothing to
    move on CPU) and the tiled MLP logs the losses of one process without them."""
    plain = W.sft_losses(1, str(tmp_path / "plain"))
    levers = dict(gradient_checkpointing=True, activation_offloading=True, hsap_tiled_mlp=True,
                  hsap_mlp_tile_tokens=8, hsap_recompute_norms=True)
    for losses in pools(2, TIMEOUT_S).run(_sft_levers, str(tmp_path / "levers"), levers):
        assert losses == pytest.approx(plain, rel=1e-5)


def _trainer_levers(out_dir: str, levers: dict) -> dict:
    return W.trainer_losses(2, out_dir, **levers)


def _sft_levers(out_dir: str, levers: dict) -> list:
    return W.sft_losses(2, out_dir, **levers)


def test_sft_trainer_logs_trls_metrics_from_the_chunked_loss(pools, tmp_path) -> None:
    """HSAPSFTTrainer runs hf_hsap's chunked loss by default and logs what TRL's own SFTTrainer logs on one process:
    the loss, the entropy and the mean token accuracy (from the loss's tiles) and the tokens seen, at SP 1 and SP 2.
    A loss type the chunked head does not compute (DFT) keeps TRL's fused LM head, and its losses."""
    trl_logs = W.sft_logs(1, str(tmp_path / "trl"), plain_trl=True)
    assert trl_logs["head"] == "Linear"
    one = W.sft_logs(1, str(tmp_path / "sp1"))
    assert one["head"] == "ChunkedLMHead"
    keys = ("loss", "entropy", "mean_token_accuracy")
    for got, want in zip(one["logs"], trl_logs["logs"], strict=True):
        assert {k: got[k] for k in keys} == pytest.approx({k: want[k] for k in keys}, rel=1e-5)
        assert got["num_tokens"] == want["num_tokens"]
    for res in pools(2, TIMEOUT_S).run(_sft_logs, str(tmp_path / "sp2")):
        assert res["head"] == "ChunkedLMHead"
        for got, want in zip(res["logs"], trl_logs["logs"], strict=True):
            assert {k: got[k] for k in keys} == pytest.approx({k: want[k] for k in keys}, rel=1e-5)
    dft = W.sft_logs(1, str(tmp_path / "dft"), loss_type="dft")
    dft_trl = W.sft_logs(1, str(tmp_path / "dft_trl"), plain_trl=True, loss_type="dft")
    assert dft["head"] == "Linear"
    assert [h["loss"] for h in dft["logs"]] == pytest.approx([h["loss"] for h in dft_trl["logs"]], rel=1e-5)


def _sft_logs(out_dir: str) -> dict:
    return W.sft_logs(2, out_dir)
