"""Preemption on spawned gloo ranks: every rank stops after the same step when any one got the signal, and the
HSAP trainer saves a complete checkpoint, returns from ``train`` and resumes from the newest complete
checkpoint with the losses of the uninterrupted run (a partial newer one is skipped)."""
from __future__ import annotations

import pytest

from workers import preemption as W

TIMEOUT_S = 150


def test_every_rank_stops_when_one_rank_got_the_signal(pools) -> None:
    assert pools(2, TIMEOUT_S).run(W.ranks_agree_on_a_signal, 1) == [[False, True], [False, True]]


def test_trainer_preempted_saves_and_resumes_with_the_uninterrupted_losses(pools, tmp_path) -> None:
    for res in pools(2, TIMEOUT_S).run(W.trainer_preempted_then_resumed, 2, str(tmp_path)):
        assert res["preempted"] and not res["resumed_preempted"] and res["handler_back"], res
        assert [s for s, _ in res["first"]] == [1, 2, 3]  # stopped after the step the signal arrived in
        assert res["after_preemption"] == ["checkpoint-3*"]  # save_total_limit=1: checkpoint-2 rotated out
        assert res["resume_step"] == 3  # from checkpoint-3, not the partial checkpoint-4 nor step 0
        full = dict(res["full"])
        assert [s for s, _ in res["resumed"] if s > 3] == [4, 5]
        for step, loss in res["first"] + [(s, l) for s, l in res["resumed"] if s > 3]:
            assert loss == pytest.approx(full[step], rel=1e-5), (step, res)
