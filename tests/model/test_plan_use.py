"""Under SP, a forward whose attention layers did not all consume the plan is an error (never a wrong loss).

A model loaded without ``attn_implementation="hsap"``, or one whose attention drops the keyword arguments
(StableLM) and that ``prepare_model`` did not see (it relays the plan round such layers), attends only to each
rank's own tokens under SP. The error comes in the step itself (the loss
helper with ``sp=``, ``check_plan_used``, the trainers) and at the latest at the next ``shard_batch``.
"""
from __future__ import annotations

from workers import plan_use as W

TIMEOUT_S = 150  # each task's hang guard (DistPool.run)


def test_loops_whose_model_does_not_run_the_plan_raise(pools) -> None:
    for res in pools(2, TIMEOUT_S).run(W.loops_without_the_plan, 2):
        assert res["sdpa_loss"].startswith("PlanNotUsedError") and "attn_implementation='hsap'" in res["sdpa_loss"]
        assert res["sdpa_next_shard"].startswith("PlanNotUsedError") and "previous batch" in res["sdpa_next_shard"]
        # StableLM's decoder layer calls its attention without the kwargs: unchecked, the plan never reaches it;
        # check_model only reads (the plan still misses it); prepare_model relays the plan round that layer, and
        # then every attention layer consumes it
        assert res["stablelm_check_plan_used"].startswith("PlanNotUsedError")
        assert res["stablelm_check_model"] is None and res["stablelm_checked_plan_used"].startswith("PlanNotUsedError")
        assert res["stablelm_prepare_model"] is None and res["stablelm_relayed_plan_used"] is None
        # an "hsap" model is fine however many of shard_batch's keys the loop passes
        assert res["hsap_some_keys_loss"] is None and res["hsap_layers"] == res["hsap_expected"] == 2
        assert res["hsap_all_keys_next_shard"] is None and res["hsap_check_plan_used"] is None


def test_a_layer_missing_from_the_record_raises(pools) -> None:
    for err in pools(2, TIMEOUT_S).run(W.half_the_layers, 2):
        assert err is not None and "only 1 of the model's 2 attention layers" in err


def test_config_count() -> None:
    assert W.llama_config_sanity() == 3
