"""Worker functions for tests/model/test_plan_use.py: loops whose model does not run the SP plan."""
from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, StableLmConfig

from hf_hsap.integrations import (PlanNotUsedError, UnsupportedModelError, check_model, check_plan_used, prepare_model,
                                  global_num_items, hsap_causal_lm_loss, register, shard_batch)
from workers.sp_model import VOCAB, get_sp, global_batch, make_model


def _error(fn: Any) -> str | None:
    """The PlanNotUsedError / UnsupportedModelError message of ``fn()``, ``None`` if it returns."""
    try:
        fn()
    except (PlanNotUsedError, UnsupportedModelError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def _stablelm() -> torch.nn.Module:
    """A tiny StableLM: its attention forward has no **kwargs (the plan cannot reach it)."""
    register()
    config = StableLmConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="hsap", dtype=torch.float32).train()


def loops_without_the_plan(sp_size: int) -> dict[str, Any]:
    """Hand-written loops under SP whose forward does not run the plan, and one that does.

    Returns the error (or ``None``) of: an sdpa model at the loss helper and at the next ``shard_batch``;
    a StableLM at ``check_plan_used`` before ``check_model``, at ``check_model``, after it (a check changes nothing),
    at ``prepare_model`` and after it; an "hsap" llama that passes only some keys
    (``hsap_plan`` without its record) through the same checks; the sdpa model's wrong loss.
    """
    sp = get_sp(sp_size)
    out: dict[str, Any] = {}
    batch = global_batch()

    sdpa = make_model("llama", attn="sdpa")
    local = shard_batch(batch, sp)
    logits = sdpa(**local).logits  # the plan rides in the kwargs, sdpa ignores it
    n = global_num_items(local["shift_labels"], sp)
    out["sdpa_loss"] = _error(lambda: hsap_causal_lm_loss(logits, local["shift_labels"], n, sp=sp))
    sdpa(**shard_batch(batch, sp))  # a second forward, no loss helper
    out["sdpa_next_shard"] = _error(lambda: shard_batch(batch, sp))
    sp.pending_plan_use = None

    stable = _stablelm()
    local = shard_batch(batch, sp, check_previous=False)
    stable(**local)  # never checked: its attention layers do not get the plan
    out["stablelm_check_plan_used"] = _error(lambda: check_plan_used(local))
    out["stablelm_check_model"] = _error(lambda: check_model(stable, sp_size=sp_size))  # only reads
    local = shard_batch(batch, sp, check_previous=False)
    stable(**local)
    out["stablelm_checked_plan_used"] = _error(lambda: check_plan_used(local, stable))
    out["stablelm_prepare_model"] = _error(lambda: prepare_model(stable, sp_size=sp_size))  # relays the plan round them
    local = shard_batch(batch, sp, check_previous=False)
    stable(**local)
    out["stablelm_relayed_plan_used"] = _error(lambda: check_plan_used(local, stable))

    hsap = make_model("llama")
    local = shard_batch(batch, sp)
    logits = hsap(input_ids=local["input_ids"], position_ids=local["position_ids"],
                  hsap_plan=local["hsap_plan"]).logits  # no hsap_plan_use: the group's record is filled
    out["hsap_some_keys_loss"] = _error(lambda: hsap_causal_lm_loss(logits, local["shift_labels"], n, sp=sp))
    out["hsap_layers"] = len(local["hsap_plan_use"].layers)
    out["hsap_expected"] = check_model(hsap, sp_size=sp_size).attention_layers
    local = shard_batch(batch, sp)
    hsap(**local)
    out["hsap_all_keys_next_shard"] = _error(lambda: shard_batch(batch, sp))
    out["hsap_check_plan_used"] = _error(lambda: check_plan_used(local, hsap))
    sp.pending_plan_use = None
    return out


def half_the_layers(sp_size: int) -> str | None:
    """A forward in which one of the two attention layers did not consume the plan (counted from the model)."""
    sp = get_sp(sp_size)
    model = make_model("llama")
    local = shard_batch(global_batch(), sp, check_previous=False)
    model(**local)
    use = local["hsap_plan_use"]
    first = next(iter(use.layers))
    del use.layers[first]  # as if that layer had run its own attention
    return _error(lambda: check_plan_used(local, model))


def llama_config_sanity() -> int:
    """The config count of attention layers of the tiny llama (no layer_types: num_hidden_layers)."""
    from hf_hsap.integrations.model_check import attention_layer_count

    return int(attention_layer_count(LlamaConfig(num_hidden_layers=3)))


def chunked_llama4(chunk: int = 8) -> torch.nn.Module:
    """A tiny Llama 4 text model, one chunked-attention layer of ``chunk`` tokens and one full layer."""
    from transformers import Llama4TextConfig

    register()
    config = Llama4TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, intermediate_size_mlp=48,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              attention_chunk_size=chunk, num_local_experts=1, moe_layers=[], no_rope_layers=[1, 1],
                              layer_types=["chunked_attention", "full_attention"], max_position_embeddings=256,
                              pad_token_id=0)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="hsap", dtype=torch.float32).train()
