"""A recurrent layer's split documents under SP (``hf_hsap.mixers.run_segments``): every rank runs its runs at once,
one summary exchange forward and one back; the output and the gradients of the inputs and of a weight every segment
shares equal the one-process run over the whole row, in float64, for a recurrence with a full matrix transition,
contiguous and zigzag placements at SP 2 and 4 (documents over every rank, runs continued on the same rank, runs of
one token)."""
from __future__ import annotations

import pytest

from workers import handoff as W

TIMEOUT_S = 120


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("placement", ["contiguous", "zigzag"])
def test_summaries_match_one_process(pools, world: int, placement: str) -> None:
    results = pools(world, TIMEOUT_S).run(W.handoff_errors, placement)
    assert sum(r["continued"] for r in results) > 0 and results[0]["summaries"] > 0  # summaries did cross ranks
    assert sum(r["mine"] for r in results) == results[0]["summaries"]
    assert max(r["spans"] for r in results) == world  # a document over every rank
    for res in results:
        assert max(res["out"], res["dx"], res["dw"]) < 1e-12, res
        # one exchange forward (its summaries) and one backward (the gradients of those it received), one message
        # per peer each: no chain of steps
        assert res["sent_rows"] == res["mine"] + res["theirs"] and res["messages"] == res["peers"], res


@pytest.mark.parametrize("rerun", [False, True])
def test_split_runs_hold_no_activation_of_the_caller(pools, rerun: bool) -> None:
    """The hand-off keeps its runs' inputs and outputs as graph edges: a layer input cut from a larger activation
    leaves it to be freed after the forward (the whole row's kernel keeps nothing of it either), and the result is
    still exact, for corrected and rerun continued runs."""
    results = pools(2, TIMEOUT_S).run(W.activation_freed, rerun)
    assert sum(r["continued"] for r in results) > 0
    for res in results:
        assert not res["held"], res
        assert max(res["out"], res["dx"], res["dw"]) < 1e-12, res
