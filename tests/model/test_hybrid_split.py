"""Every hybrid family on a row whose long document spans several ranks (every rank under zigzag) and whose short
documents leave runs shorter than the convolution's ``k - 1``, at SP 4 with Ulysses 1 and 2 and gradient
checkpointing (each layer, its summary exchanges included, recomputed in the backward), in both recurrent modes
(summaries; the heads all-to-all): logits and every parameter gradient equal each document alone, in float64."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_hsap.plan.chain import state_chain
from workers import hybrid_split as W
from workers import zoo
from workers import zoo_configs as ZC

TIMEOUT_S = 300
FAMILIES = ["qwen3_5_text", "kimi_linear", "bamba", "falcon_mamba", "minimax", "lfm2"]
HEADS_FIT = {"qwen3_5_text", "kimi_linear", "bamba", "falcon_mamba", "lfm2"}  # a kernel with heads dividing 4


@pytest.mark.parametrize("family", FAMILIES)
def test_split_documents_with_checkpointing_are_exact(pools, family: str) -> None:
    config = ZC.tiny_config(family)
    with zoo.full_precision(config, torch.float64):
        state = {k: v.detach().clone() for k, v in
                 ZC.build_model(config, "eager", torch.float64, draw=torch.float64).state_dict().items()}
        ref = zoo.reference(config, state, lens=W.LENS)
    cu = np.concatenate([[0], np.cumsum(W.LENS)])
    for ulysses, placement, mode in ((1, "zigzag", "summaries"), (2, "contiguous", "summaries"),
                                     (1, "zigzag", "heads"), (2, "zigzag", "heads")):
        records = pools(4, TIMEOUT_S).run(W.split_run, family, state, 4, ulysses, placement, mode)
        res = zoo.combine_sp(ref, [{"ok": True, **r} for r in records], 4, zoo.TOL["fp64"])
        assert res["outcome"] == "exact", (ulysses, placement, mode, res)
        # U 1: only the heads mode all-to-alls (where a kernel's heads divide the group; others take summaries)
        if ulysses == 1:
            assert (sum(r["a2a_bytes"] for r in records) > 0) == (mode == "heads" and family in HEADS_FIT), family
        tokens = [r["index"].numpy() for r in records]
        chains = [state_chain(cu, tokens, r) for r in range(4)]
        holders = {r for ch in chains for s in ch.segments if s.doc == 0 for r in (*s.earlier, ch.rank)}
        assert len(holders) >= 3 and (placement != "zigzag" or len(holders) == 4)
        short = [s for ch in chains for s in ch.segments if s.continued and s.end - s.start < 3]
        assert short or placement == "contiguous"  # zigzag: continued runs shorter than k - 1, halos from several ranks
