"""HSAPSFTTrainer trains a vision-language model on a vision dataset with ``packing=True`` (which TRL's own
SFTTrainer refuses): under SP it logs the losses of the single-process run."""
from __future__ import annotations

import pytest

from workers import vlm_sft as W

TIMEOUT_S = 300


def test_vision_packing_sp4_logs_the_sp1_losses(pools, tmp_path) -> None:
    sp1 = W.vlm_sft_losses(1, str(tmp_path / "sp1"))
    assert len(sp1["losses"]) == 3
    # the decoder runs "hsap", the vision tower keeps the user's "sdpa"; rows of several documents with images;
    # assistant-only loss: fewer trained tokens than tokens
    assert sp1["attn"] == ("hsap", "sdpa")
    assert sp1["docs"] >= 4 and sp1["images"] >= 4 and 0 < sp1["trained"] < sp1["tokens"] // 2
    for ulysses in ("1", "2"):
        for res in pools(4, TIMEOUT_S).run(W.vlm_sft_losses, 4, str(tmp_path / f"sp4u{ulysses}"), ulysses):
            assert res["losses"] == pytest.approx(sp1["losses"], rel=1e-5)
