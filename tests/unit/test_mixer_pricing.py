"""The planner prices a hybrid model's recurrent layers: a document split over parts runs its runs one hand-off
step after the other (``plan.chain.part_steps``, the planner's view of the runtime's ``state_chain``), and every step
after the first waits for one exchange (``CostModel.mixer_token_cost`` / ``handoff_cost``)."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaConfig, Qwen3_5TextConfig

import hf_hsap
from hf_hsap.plan.chain import part_steps, state_chain
from hf_hsap.plan.cost import CostModel, mixer_time, step_time
from hf_hsap.plan.placement import contiguous
from hf_hsap.plan.windows import window_transfers


def test_from_config_prices_the_recurrent_layers_of_a_hybrid_only() -> None:
    hybrid = Qwen3_5TextConfig(num_hidden_layers=8)  # 3 of every 4 layers are gated delta rule layers
    cost = CostModel.from_config(hybrid, "network", "H100")
    assert cost.mixer_token_cost == 6 * cost.token_cost and cost.handoff_cost > 0
    plain = CostModel.from_config(LlamaConfig(num_hidden_layers=8), "network", "H100")
    assert plain.mixer_token_cost == plain.handoff_cost == 0


@given(st.lists(st.integers(1, 60), min_size=1, max_size=8), st.sampled_from([2, 3, 4]),
       st.sampled_from(["contiguous", "zigzag", "balanced"]))
def test_part_steps_are_the_runtime_chain(lens: list[int], parts: int, placement: str) -> None:
    cu = np.concatenate([[0], np.cumsum(lens)])
    if cu[-1] < 2 * parts:
        return
    plan = hf_hsap.plan_sequence(cu, parts, placement=placement)
    pl = plan.placement
    got = part_steps(pl.doc, pl.start, pl.part, pl.end - pl.start, parts)  # [parts, steps]
    tokens = [plan.local_token_indices(r).numpy() for r in range(parts)]
    want = np.zeros_like(got)
    for r in range(parts):
        ch = state_chain(cu, tokens, r)
        assert ch.steps == got.shape[1]
        for s in ch.segments:
            want[r, s.step] += s.end - s.start
    np.testing.assert_array_equal(got, want)


def test_auto_weighs_the_hand_off_steps_of_a_hybrid() -> None:
    cu = np.concatenate([[0], np.cumsum([3000] + [500] * 10)])
    hybrid = CostModel.from_config(Qwen3_5TextConfig(), "network", "H100")
    plan = hf_hsap.plan_sequence(cu, 4, cost=hybrid)
    cut = contiguous(plan.layout, 4)
    trs = {w: plan.kind(w).transfers for w in plan.layer_counts}
    mine = step_time(plan.layout, plan.placement, trs, plan.layer_counts, hybrid)
    theirs = step_time(plan.layout, cut, {w: window_transfers(cut, plan.layout, w) for w in plan.layer_counts},
                       plan.layer_counts, hybrid)
    assert mine <= theirs
    # the same layout planned for attention alone splits the long document into more hand-off steps
    plain = hf_hsap.plan_sequence(cu, 4, cost=CostModel.from_config(LlamaConfig(), "network", "H100"))
    assert mixer_time(plan.placement, hybrid) <= mixer_time(plain.placement, hybrid)
