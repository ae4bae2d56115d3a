"""Which lever makes a row fit (the recipes' check before the first step) and ``hsap-plan --max-length``."""
from __future__ import annotations

import pytest

from hf_hsap.inspect import main as hsap_plan
from hf_hsap.memory import MemoryLevers
from hf_hsap.memory.advice import MEMORY_MODELS, check_row_fits, levers_from_names
from hf_hsap.memory.fit import longest_row
from hf_hsap.memory.model import predict_step_memory

L8 = MEMORY_MODELS["llama-3-8b"]
COMMON = dict(world=8, sp_size=8, sharding="zero3")


def _gib(levers: MemoryLevers, tokens: int) -> float:
    return predict_step_memory(L8, tokens, levers=levers, **COMMON).total / 2**30


def test_the_advice_names_the_first_levers_that_make_it_fit() -> None:
    none = levers_from_names("none")
    tokens = 8 * 32768
    with_loss = _gib(none.replace(chunked_loss=True), tokens)
    with_ckpt = _gib(none.replace(chunked_loss=True, gradient_checkpointing=True), tokens)
    assert with_ckpt < with_loss < _gib(none, tokens)  # each lever lowers the peak
    check_row_fits(L8, tokens, memory_gib=_gib(none, tokens) + 0.1, levers=none, **COMMON)  # fits: no error
    with pytest.raises(ValueError, match=r"turn on MemoryLevers\(chunked_loss=True\)$"):
        check_row_fits(L8, tokens, memory_gib=with_loss + 0.1, levers=none, **COMMON)
    with pytest.raises(ValueError, match=r"turn on --a, --b$"):
        check_row_fits(L8, tokens, memory_gib=(with_loss + with_ckpt) / 2, levers=none,
                       spelling={"chunked_loss": "--a", "gradient_checkpointing": "--b"}, **COMMON)
    with pytest.raises(ValueError, match="even with every lever at most"):
        check_row_fits(L8, 1 << 26, memory_gib=80, levers=none, **COMMON)


def test_levers_by_name() -> None:
    assert levers_from_names("all").names == ["chunked_loss", "gradient_checkpointing", "tiled_mlp",
                                              "recompute_norms", "tiled_attention",
                                              "activation_offloading"]  # LEVER_ORDER, the one list of levers
    assert levers_from_names("none").names == []
    assert levers_from_names("tiled_mlp, gradient_checkpointing").names == ["gradient_checkpointing", "tiled_mlp"]
    with pytest.raises(ValueError, match="unknown levers"):
        levers_from_names("flash")


def test_hsap_plan_max_length(capsys) -> None:
    assert hsap_plan(["--max-length", "--gpus", "8", "--gpu-memory", "80", "--levers", "none"]) == 0
    out = capsys.readouterr().out
    fit = longest_row(L8, gpus=8, memory_per_gpu_gib=80, levers=levers_from_names("none"), sharding="zero3")
    assert f"longest packed row: {fit.tokens:,} tokens on 8 GPUs of 80 GiB" in out
    assert f"what stops a longer row: {fit.limiting_term}" in out
    assert hsap_plan(["--max-length", "--levers", "bogus"]) == 2


def test_sft_trainer_refuses_a_row_that_cannot_fit(tmp_path) -> None:
    """HSAPSFTTrainer checks max_length x per_device_train_batch_size against hsap_memory_per_device_gib before the
    first step and names the hsap-sft flag that makes it fit."""
    from datasets import Dataset

    from hf_hsap.integrations import HSAPSFTConfig, HSAPSFTTrainer
    from workers.sp_model import make_model, make_tokenizer

    model = make_model("llama")
    rows = Dataset.from_list([{"input_ids": list(range(3, 40))}] * 8)
    common = dict(max_length=4096, per_device_train_batch_size=2, gradient_checkpointing=False, use_cpu=True,
                  report_to=[], bf16=False, packing=True)
    need = {lever: predict_step_memory(model.config, 8192, world=1, sp_size=1, sharding="none", param_dtype="fp32",
                                       compute_dtype="fp32", master_weights=False, device="cpu",
                                       levers=MemoryLevers(gradient_checkpointing=lever)).total / 2**30
            for lever in (False, True)}
    assert need[True] < need[False]
    args = HSAPSFTConfig(output_dir=str(tmp_path), hsap_memory_per_device_gib=(need[True] + need[False]) / 2, **common)
    with pytest.raises(ValueError, match="turn on --gradient_checkpointing$"):
        HSAPSFTTrainer(model=model, args=args, train_dataset=rows, processing_class=make_tokenizer())
    args = HSAPSFTConfig(output_dir=str(tmp_path), hsap_memory_per_device_gib=need[False] * 1.01, **common)
    HSAPSFTTrainer(model=make_model("llama"), args=args, train_dataset=rows, processing_class=make_tokenizer())


def test_every_spelling_of_the_levers_names_each_lever_once() -> None:
    """The levers are listed once (LEVER_ORDER); the recipes' and the trainers' flags spell each of them."""
    import dataclasses
    import importlib

    from hf_hsap.integrations.memory_fit import TRAINER_LEVER_FLAGS
    from hf_hsap.memory import LEVER_ORDER, MemoryLevers

    recipes = importlib.import_module("recipes.common")
    assert set(TRAINER_LEVER_FLAGS) == set(recipes.LEVER_FLAGS) == set(LEVER_ORDER)
    assert set(LEVER_ORDER) <= {f.name for f in dataclasses.fields(MemoryLevers)}
