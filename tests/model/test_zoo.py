"""CI subset of the model-zoo conformance harness (``tests/workers/zoo*.py``; the full sweep is
``scripts/model_zoo.py`` -> MODELS.md).

Each family's tiny random model runs one packed row (documents of 7, 30, 1, 19 and 15 tokens) in float32 and
float64: in one process (the plain packed row, and through ``shard_batch(batch, 1)``) and on 4 gloo ranks at SP 2
(as DP 2 x SP 2) and SP 4 with Ulysses 1 and 2, against the same weights in float64, eager, each document alone.
No mode may be ``WRONG`` or ``crash``, and every family has the outcome per mode that MODELS.md records for it
(``exact``, or ``refused``: hf_hsap raised on purpose with a message naming the fix).
"""
from __future__ import annotations

import pytest
import torch
import transformers
from packaging.version import Version

import hf_hsap
from workers import zoo, zoo_run

SUPPORTED = "exact"  # every mode exact
REFUSED = "refused"  # every mode refused

EXPECT = {
    "llama": SUPPORTED,  # plain multi-head attention
    "mistral": SUPPORTED,  # GQA, every layer a sliding window of 8 tokens (shorter than most documents)
    "gemma2": SUPPORTED,  # logit soft-capping on every layer, a sliding window of 8 on the sliding layers
    "gemma3_text": SUPPORTED,  # sliding layers (window 8) with their own RoPE beside a full layer, q/k norms
    "gpt_oss": SUPPORTED,  # attention sinks on every layer, a sliding window of 8 on the sliding layers, MoE
    "qwen2": SUPPORTED,  # a full layer, then a sliding-window layer of 8 (use_sliding_window, max_window_layers)
    "qwen3": SUPPORTED,  # GQA with q/k norm
    "deepseek_v3": SUPPORTED,  # multi-head latent attention (value head_dim < query head_dim), MoE
    "persimmon": SUPPORTED,  # no position_ids to its attention; dropout kept as an nn.Dropout
    "nemotron": SUPPORTED,  # a decoder layer calls the attention without kwargs: prepare_model relays the plan
    "llama4_text": SUPPORTED,  # chunked attention (16-token chunks here, documents of 19 and 30 split across ranks), MoE
    "lfm2": SUPPORTED,  # hybrid: a short causal convolution layer beside the attention layer
    "bamba": SUPPORTED,  # hybrid: Mamba2 mixers (SSD scan with a convolution) beside an attention layer
    # hybrid: Mamba2 mixers beside an attention layer that the model's position_ids never reach (no rotary
    # positions): prepare_model relays a direct packed call's documents to it
    "granitemoehybrid": SUPPORTED,
    "qwen3_5_text": SUPPORTED,  # hybrid: gated delta rule layers (with a convolution) beside gated attention
    "kimi_linear": SUPPORTED,  # hybrid: Kimi delta attention (KDA) beside MLA, MoE
    "jamba": SUPPORTED,  # hybrid: Mamba mixers (selective scan: a continued run adds the initial state's share), attention
    "mamba": SUPPORTED,  # no attention at all: Mamba mixers only
    "minimax": SUPPORTED,  # hybrid: lightning attention (no kernel hook: its forward replaced per instance)
    "recurrent_gemma": REFUSED,  # hybrid: its convolution and RG-LRU run in its own forward (no kernel hook)
    "bloom": REFUSED,  # attention in its own code (no AttentionInterface), ALiBi
    # before Transformers 5.25 its own attention table: check_config refuses it before construction; from 5.25 it runs
    # Transformers' AttentionInterface, but a layer on the way calls the attention without the model's kwargs (as
    # Nemotron): the 2-token probe finds it and prepare_model relays the plan round it
    "falcon": SUPPORTED if Version(transformers.__version__) >= Version("5.25") else REFUSED,
}


@pytest.fixture(scope="module")
def zoo_pools(pools):
    """The harness's pool manager over the session's pool of :data:`zoo_run.WORLD` ranks."""
    manager = zoo_run.PoolManager(pools=pools)
    yield manager
    manager.close()


def _outcomes(rec: dict) -> dict[str, dict]:
    return {f"{dtype}:{mode}": res for dtype, per_mode in rec["results"].items() for mode, res in per_mode.items()}


@pytest.mark.parametrize("family", list(EXPECT))
def test_family_is_exact_or_refused(family: str, zoo_pools) -> None:
    rec = zoo_run.run_family(family, zoo_pools, sanity=False)
    assert rec["status"] == "run", rec.get("reason")
    got = _outcomes(rec)
    assert len(got) == len(zoo.DTYPES) * len(zoo.MODES)
    bad = {k: v for k, v in got.items() if v["outcome"] in ("WRONG", "crash")}
    assert not bad, f"{family}: {bad}"
    for key, res in got.items():
        want = {SUPPORTED: "exact", REFUSED: "refused"}[EXPECT[family]]
        assert res["outcome"] == want, f"{family} {key}: {res} (expected {want})"


def test_outcome_classification() -> None:
    """A ``raise`` inside hf_hsap is a refusal, anything else a crash; the same from DistPool's traceback text."""
    try:
        hf_hsap.shard_batch({"input_ids": torch.zeros(3, dtype=torch.long)}, 1)  # not [batch, length]
    except ValueError as e:
        refused = zoo.classify(e)
    try:
        torch.zeros(2) @ torch.zeros(3)
    except RuntimeError as e:
        crash = zoo.classify(e)
    assert refused["outcome"] == "refused" and refused["error"].startswith("ValueError: input_ids must be")
    assert crash["outcome"] == "crash" and crash["error"].startswith("RuntimeError")
    for res in (refused, crash):
        again = zoo.classify_traceback(res["traceback"])
        assert (again["outcome"], again["error"]) == (res["outcome"], res["error"])


def test_compare_flags_a_wrong_gradient() -> None:
    ref = {"logits": torch.ones(3, 4, dtype=torch.float64), "loss": 2.0,
           "grads": {"w": torch.tensor([1.0, 0.0], dtype=torch.float64), "b": torch.zeros(2, dtype=torch.float64)}}
    same = {k: v.clone() for k, v in ref["grads"].items()}
    assert zoo.compare(ref, ref["logits"], 2.0, same, 1e-9)["outcome"] == "exact"
    same["b"] = torch.tensor([0.0, 1e-5], dtype=torch.float64)  # above 1e-9 x the floor (1e-3 x largest grad)
    res = zoo.compare(ref, ref["logits"], 2.0, same, 1e-9)
    assert res["outcome"] == "WRONG" and res["err"]["worst_grad"] == "b"
