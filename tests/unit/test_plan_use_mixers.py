"""The plan-use record of a hybrid model: a forward under SP is complete only when its recurrent layers ran on the
plan too (``PlanUse.record_mixer``), as many as ``prepare_model`` prepared."""
from __future__ import annotations

import torch
from transformers import Qwen3_5TextConfig

from hf_hsap.integrations.plan_use import PlanUse


class _Layer(torch.nn.Module):
    def __init__(self, config: object) -> None:
        super().__init__()
        self.config = config


def test_a_hybrid_forward_needs_its_recurrent_layers_on_the_plan() -> None:
    config = Qwen3_5TextConfig(num_hidden_layers=4)  # 3 gated delta rule layers, 1 attention layer
    use = PlanUse(2)
    use.record(_Layer(config))  # the attention layer consumed the plan
    assert "prepare_model" in use.problem(expected=1)  # no recurrent layer did
    mixers = [_Layer(config) for _ in range(3)]
    use.record_mixer(mixers[0], config)
    assert use.problem(expected=1) is None  # at least one (the count is unknown without the model)
    assert "only 1 of the model's 3" in use.problem(expected=1, expected_mixers=3)
    for m in mixers[1:]:
        use.record_mixer(m, config)
    assert use.problem(expected=1, expected_mixers=3) is None


def test_a_mamba_only_forward_is_complete_with_its_recurrent_layers_alone() -> None:
    use = PlanUse(2)
    assert "reached no attention layer" in use.problem()
    use.record_mixer(torch.nn.Linear(1, 1), None)
    assert use.problem(expected=0, expected_mixers=1) is None
