"""The planner prices a hybrid model's recurrent layers: every part runs its runs at once, a run that continues a
split document pays the summarising call, and a split adds one summary exchange however many parts it spans
(``plan.chain.part_mixer_tokens``, the planner's view of the runtime's ``state_chain``;
``CostModel.mixer_token_cost`` / ``handoff_cost``)."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaConfig, Qwen3_5TextConfig

import hf_hsap
from hf_hsap.plan.chain import part_mixer_tokens, state_chain
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
def test_part_mixer_tokens_are_the_runtime_runs(lens: list[int], parts: int, placement: str) -> None:
    cu = np.concatenate([[0], np.cumsum(lens)])
    if cu[-1] < 2 * parts:
        return
    plan = hf_hsap.plan_sequence(cu, parts, placement=placement)
    pl = plan.placement
    tokens, continued, remote = part_mixer_tokens(pl.doc, pl.start, pl.part, pl.end - pl.start, parts)
    rank_tokens = [plan.local_token_indices(r).numpy() for r in range(parts)]
    for r in range(parts):
        ch = state_chain(cu, rank_tokens, r)
        assert tokens[r] == ch.total
        assert continued[r] == sum(s.end - s.start for s in ch.segments if s.continued)
        assert remote == ch.remote


def test_splitting_a_document_over_more_parts_costs_no_more_exchanges() -> None:
    """The parallel hand-off's price: one exchange per split, not one step per part."""
    cost = CostModel.from_config(Qwen3_5TextConfig(), "network", "H100")
    cu = np.array([0, 4096])
    times = []
    for parts in (2, 4, 8):
        pl = contiguous(hf_hsap.plan_sequence(cu, parts).layout, parts)
        tokens, continued, remote = part_mixer_tokens(pl.doc, pl.start, pl.part, pl.end - pl.start, parts)
        assert remote and continued[0] == 0 and (continued[1:] == tokens[1:]).all()
        times.append(mixer_time(pl, cost))
        assert times[-1] == cost.mixer_token_cost * 2 * 4096 / parts + cost.handoff_cost
    assert times[0] > times[1] > times[2]


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
    # the same layout planned for attention alone pays more for its recurrent layers
    plain = hf_hsap.plan_sequence(cu, 4, cost=CostModel.from_config(LlamaConfig(), "network", "H100"))
    assert mixer_time(plan.placement, hybrid) <= mixer_time(plain.placement, hybrid)


def test_the_cheaper_recurrent_mode_is_picked_and_priced() -> None:
    """Inside one node the heads all-to-all is offered and priced; between nodes only summaries are; a row whose
    documents all stay whole moves nothing in either mode."""
    from hf_hsap.plan.cost import recurrent_mode

    node = CostModel.from_config(Qwen3_5TextConfig(), "nvlink", "H100")
    nodes = CostModel.from_config(Qwen3_5TextConfig(), "network", "H100")
    assert node.mixer_a2a_token_cost > 0 and nodes.mixer_a2a_token_cost == 0
    split = contiguous(hf_hsap.plan_sequence(np.array([0, 8192]), 4).layout, 4)
    whole = contiguous(hf_hsap.plan_sequence(np.array([0, 2048, 4096, 6144, 8192]), 4).layout, 4)
    heads = (node.mixer_token_cost + node.mixer_a2a_token_cost) * 8192 / 4
    summaries = node.mixer_token_cost * 2 * 2048 + node.handoff_cost
    assert recurrent_mode(split, node) == ("heads" if heads < summaries else "summaries")
    assert mixer_time(split, node) == min(heads, summaries)
    assert recurrent_mode(split, nodes) == "summaries"
    assert recurrent_mode(whole, node) == "summaries" and mixer_time(whole, node) == node.mixer_token_cost * 2048
