"""HSAPSFTTrainer trains the VLMs of TRL's SFT examples and docs (tiny random models with their own processors) on a
vision dataset with ``packing=True`` (which TRL's own SFTTrainer refuses): under SP it logs the losses of the
single-process run (float32; SP changes only the order of the sums).

The default suite runs one representative (Qwen2.5-VL: multimodal rotary positions per document, images split
across ranks) at SP 4 with Ulysses 1 and 2; ``pytest -m slow`` runs every family of the set."""
from __future__ import annotations

import pytest

from hf_hsap.examples import TRL_VLMS
from workers import vlm_sft as W

TIMEOUT_S = 300
REL_TOL = 1e-5  # float32 on CPU; observed differences are below 1e-6


def _check_sp4(pools, tmp_path, family: str, steps: int) -> None:
    sp1 = W.vlm_sft_losses(1, str(tmp_path / "sp1"), steps=steps, family=family)
    assert len(sp1["losses"]) == steps and sp1["losses"][-1] < sp1["losses"][0]  # it trains
    # the decoder runs "hsap", the vision tower keeps the user's "sdpa"; rows of several documents with images;
    # assistant-only loss: fewer trained tokens than tokens
    assert sp1["attn"] == ("hsap", "sdpa")
    assert sp1["docs"] >= 4 and sp1["images"] >= 4 and 0 < sp1["trained"] < sp1["tokens"] // 2
    # TRL's num_tokens: the packed rows' tokens so far (Qwen-VL's rotary positions are [4, rows, tokens])
    seen = sp1["num_tokens"]
    assert all(n % W.ROW == 0 for n in seen) and W.ROW <= seen[0] < seen[-1]
    for ulysses in ("1", "2"):
        ranks = pools(4, TIMEOUT_S).run(W.sp_losses, family, str(tmp_path / f"sp4u{ulysses}"), ulysses, steps)
        for res in ranks:
            assert res["losses"] == pytest.approx(sp1["losses"], rel=REL_TOL), (family, ulysses)
            assert res["num_tokens"] == sp1["num_tokens"]  # TRL's token count: every rank's share summed


def test_vision_packing_sp4_logs_the_sp1_losses(pools, tmp_path) -> None:
    _check_sp4(pools, tmp_path, "qwen2_5_vl", steps=3)


@pytest.mark.slow
@pytest.mark.parametrize("family", [f for f in TRL_VLMS if f != "qwen2_5_vl"])
def test_every_trl_vlm_trains_at_sp4_with_the_sp1_losses(pools, tmp_path, family: str) -> None:
    _check_sp4(pools, tmp_path, family, steps=2)
