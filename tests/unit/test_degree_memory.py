"""The per-batch Ulysses degree's memory cap (hf_hsap.plan.memory, hf_hsap.plan.degree): the activation model and
the rule that no degree holding more than the highest degree's is chosen, whatever time it saves."""
import numpy as np
import pytest

from helpers import cu_of
from hf_hsap.plan.cost import CostModel
from hf_hsap.plan.degree import fastest_degree, rank_step_time
from hf_hsap.plan.group import GroupSpec
from hf_hsap.plan.layout import make_layout
from hf_hsap.plan.memory import OWN_KV, OWN_Q, RECV, SEND, attention_memory, kv_heads_held, plan_memory
from hf_hsap.plan.planner import choose_ulysses_size, plan_layout

CHEAP_KV = CostModel(token_cost=0.0, kv_token_cost=1.0, round_cost=0.0, a2a_token_cost=50.0)


def _plans(lengths, P=4, cost=CHEAP_KV, budget=None):
    layout = make_layout(cu_of(lengths))
    return {U: plan_layout(layout, GroupSpec.offline(P, U, P), "auto", cost=cost, recv_budget_tokens=budget)
            for U in (1, 2, 4)}


def test_kv_heads_held_repeats_to_the_least_common_multiple():
    assert [kv_heads_held(8, u) for u in (1, 2, 4, 8)] == [8, 8, 8, 8]
    assert [kv_heads_held(2, u) for u in (1, 2, 4, 8)] == [2, 2, 4, 8]
    assert kv_heads_held(6, 4) == 12


def test_flat_sap_memory_counts_own_tokens_and_every_kept_buffer():
    plan = _plans([4000])[1]  # one document over four parts: part r receives the r earlier chunks
    tokens = plan.placement.tokens_per_part()
    recv = np.bincount(plan.pieces.dst, weights=plan.pieces.lengths, minlength=4)
    sent = np.bincount(plan.pieces.src, weights=plan.pieces.lengths, minlength=4)
    mem = attention_memory(tokens, plan.pieces, False, 1, 8, 2)
    assert np.allclose(mem, tokens * (OWN_Q * 8 + OWN_KV * 2) + (RECV * recv + SEND * sent) * 2)
    assert recv.max() > 0 and plan_memory(plan, 8, 2) == pytest.approx(mem.max())


def test_a_receive_budget_double_buffers_the_largest_round():
    plan = _plans([4000], budget=200)[1]
    pc = plan.pieces
    assert pc.n_rounds > 1
    recv = np.zeros((4, pc.n_rounds))
    np.add.at(recv, (pc.dst, pc.round), pc.lengths)
    sent = np.zeros((4, pc.n_rounds))
    np.add.at(sent, (pc.src, pc.round), pc.lengths)
    mem = attention_memory(plan.placement.tokens_per_part(), pc, True, 1, 8, 8)
    own = plan.placement.tokens_per_part() * (OWN_Q * 8 + OWN_KV * 8)
    assert np.allclose(mem - own, (1.5 * RECV * recv.max(1) + 2 * SEND * sent.max(1)) * 8)
    assert plan_memory(plan, 8, 8) < plan_memory(_plans([4000])[1], 8, 8)  # the budget bounds the buffers


def test_ulysses_holds_no_received_keys_but_repeats_few_kv_heads():
    plans = _plans([4000])
    mha = {u: plan_memory(p, 8, 8) for u, p in plans.items()}
    gqa = {u: plan_memory(p, 8, 2) for u, p in plans.items()}
    assert mha[4] < mha[1]  # flat SAP keeps 3/4 of the document's K|V at every head
    assert gqa[1] < gqa[4]  # two kv heads: the received keys are cheap, Ulysses repeats them to four


def test_the_cap_overrules_time_and_never_loses_to_the_highest_degree():
    plans = _plans([4000])
    times = {u: rank_step_time(p) for u, p in plans.items()}
    fastest = min(times, key=lambda u: (times[u], u))
    assert fastest == 1  # KV is cheap in this model: flat SAP is priced fastest
    best, t = fastest_degree(plans)  # time alone
    assert best == 1 and t == times
    capped, _ = fastest_degree(plans, (8, 8))
    mem = {u: plan_memory(p, 8, 8) for u, p in plans.items()}
    assert mem[1] > mem[4] and capped != 1 and mem[capped] <= mem[4]
    assert times[capped] <= times[4]  # never slower than the highest degree, which is always allowed
    assert fastest_degree(plans, (8, 2))[0] == 1  # with two kv heads flat SAP is also the lighter


def test_choose_ulysses_size_weighs_the_kv_heads():
    cu = cu_of([4000])
    assert choose_ulysses_size(cu, 4, num_heads=8, gpus_per_node=4, cost=CHEAP_KV, memory_cap=False)[0] == 1
    assert choose_ulysses_size(cu, 4, num_heads=8, gpus_per_node=4, cost=CHEAP_KV, num_kv_heads=2)[0] == 1
    assert choose_ulysses_size(cu, 4, num_heads=8, gpus_per_node=4, cost=CHEAP_KV)[0] != 1  # kv heads = 8
