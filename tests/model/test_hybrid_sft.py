"""HSAPSFTTrainer trains a hybrid model (a tiny Qwen3.5 text model: gated delta rule layers beside full attention)
with ``packing=True``: under SP its recurrent layers hand the split documents' states on, and it logs the losses of
the single-process run."""
from __future__ import annotations

import pytest

from workers import hybrid_sft as W

TIMEOUT_S = 300
STEPS = 3
KERNELS = 2  # a Gated DeltaNet layer calls two hooked kernels: causal_conv1d_fn and chunk_gated_delta_rule
RUNS = 2  # TRL's default gradient checkpointing: every step's forward, and its recomputation in the backward


def test_hybrid_packing_sp4_logs_the_sp1_losses(pools, tmp_path) -> None:
    """SP 4 at Ulysses 1 and 2 logs the single-process losses (rel 1e-5); in every run the rows hold several
    documents and each forward and its recomputation ran all 3 recurrent layers document-cut (prepared by
    prepare_model)."""
    sp1 = W.hybrid_sft_losses(1, str(tmp_path / "sp1"), steps=STEPS)
    assert len(sp1["losses"]) == STEPS and sp1["losses"][0] > sp1["losses"][-1]  # it trains
    assert sp1["attn"] == "hsap"
    # packed rows of several documents (the recurrent states must not cross them)
    assert min(sp1["row_docs"]) >= 2 and sp1["docs"] >= 4
    assert sp1["mixers"] == sp1["prepared"] == sp1["cut_layers"] == 3
    assert sp1["checkpointing"] and sp1["cut_calls"] == KERNELS * 3 * STEPS * RUNS
    for ulysses in ("1", "2"):
        for res in pools(4, TIMEOUT_S).run(W.hybrid_sft_losses, 4, str(tmp_path / f"sp4u{ulysses}"), ulysses, STEPS):
            assert res["losses"] == pytest.approx(sp1["losses"], rel=1e-5)
            assert res["rows"] == sp1["rows"] and res["row_docs"] == sp1["row_docs"]  # the same packed data
            assert res["mixers"] == res["prepared"] == res["cut_layers"] == 3
            assert res["cut_calls"] == KERNELS * 3 * STEPS * RUNS
