"""A recurrent layer's state handed between ranks (``hf_hsap.mixers.run_segments`` under SP): the output and the
gradients of the inputs and of a weight every segment shares equal the one-process run over the whole row, in
float64, for contiguous and zigzag placements at SP 2 and 4 (split documents, some continued on the same rank)."""
from __future__ import annotations

import pytest

from workers import handoff as W

TIMEOUT_S = 120


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("placement", ["contiguous", "zigzag"])
def test_handoff_matches_one_process(pools, world: int, placement: str) -> None:
    for res in pools(world, TIMEOUT_S).run(W.handoff_errors, placement):
        assert res["handoffs"] > 0 and res["steps"] > 1  # states did cross ranks
        assert max(res["out"], res["dx"], res["dw"]) < 1e-12, res
