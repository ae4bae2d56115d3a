"""The delta rule's summaries as the model path sees them (the call wrapper of ``run_call``): a run that no later run
continues summarises only its initial state's query, and that summary plus the kernel from zero is the kernel from the
true initial state (against the kernel itself, which computes in float32 whatever its inputs' dtype)."""
from __future__ import annotations

import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

from hf_hsap.mixers.calls import _Placed
from hf_hsap.mixers.handoff import summaries
from hf_hsap.mixers.ops import _DeltaRule

H, DK, DV, N = 2, 4, 3, 70  # a run longer than one 64-token chunk


def _run_inputs(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(1, N, H, DK, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, N, H, DV, generator=g, dtype=torch.float64)
    decay = -torch.rand(1, N, H, generator=g, dtype=torch.float64)
    beta = torch.rand(1, N, H, generator=g, dtype=torch.float64)
    return [q, k, v, decay, beta]


def _placed() -> _Placed:
    rec = _DeltaRule(torch_chunk_gated_delta_rule, {}, H, DK, DV, torch.float64)
    return _Placed(rec, list(range(5)), 5)


def test_the_call_wrapper_keeps_the_rerun_and_the_ends() -> None:
    placed = _placed()
    assert placed.rerun  # the handoff reruns a continued run's kernel from its true initial state
    run = _run_inputs(0)
    ending, continued = summaries(placed, [run, run], ends=[True, False])
    assert ending.out is None and ending.final is None and ending.transition is None  # initial state's query only
    assert ending.carry[0].shape == (1, N, H, DK)
    assert continued.out is None and continued.final.shape == (1, H, DK, DV)
    assert continued.transition.shape == (1, H, DK, DK)


def test_summary_and_zero_run_give_the_run_from_any_initial_state() -> None:
    placed = _placed()
    run = _run_inputs(1)
    init = torch.randn(1, H, DK, DV, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    want_out, want_final = torch_chunk_gated_delta_rule(*run[:3], g=run[3], beta=run[4], initial_state=init,
                                                       output_final_state=True)
    zero_out, _ = placed.run(run, None)
    ending, continued = summaries(placed, [run, run], ends=[True, False])
    assert torch.allclose(zero_out + placed.correct(ending, init), want_out, atol=1e-5)
    assert torch.allclose(zero_out + placed.correct(continued, init), want_out, atol=1e-5)
    state = init.to(continued.transition.dtype)  # the kernel's final states come in float32
    assert torch.allclose(placed.transit(continued.transition, state) + continued.final, want_final.to(state.dtype),
                          atol=1e-5)
