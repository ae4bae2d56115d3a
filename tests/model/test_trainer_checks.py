"""What the HSAP trainers refuse or read at construction (one process): no silent surprises."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import DataCollatorWithPadding, TrainingArguments

from hf_hsap import HSAPConfig
from hf_hsap.data import PackingCollator
from hf_hsap.integrations import HSAPSFTConfig, HSAPSFTTrainer, HSAPTrainer, HSAPTrainingArguments
from workers.sp_model import VOCAB, make_model


def _rows(n: int = 12) -> Dataset:
    g = torch.Generator().manual_seed(0)
    return Dataset.from_list([{"input_ids": torch.randint(3, VOCAB, (int(k),), generator=g).tolist()}
                              for k in torch.randint(2, 30, (n,), generator=g)])


def _args(tmp_path: Path, cls: type = TrainingArguments, **kw: Any) -> Any:
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, report_to=[], use_cpu=True,
                save_strategy="no", disable_tqdm=True, remove_unused_columns=False)
    return cls(**{**base, **kw})


def _trainer(tmp_path: Path, **kw: Any) -> HSAPTrainer:
    args = kw.pop("args", None) or _args(tmp_path)
    kw.setdefault("data_collator", PackingCollator(max_length=64))
    return HSAPTrainer(model=make_model("qwen2"), args=args, train_dataset=_rows(), **kw)


def test_compute_loss_func_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="compute_loss_func.*shift_labels"):
        _trainer(tmp_path, compute_loss_func=lambda outputs, labels, num_items_in_batch=None: outputs.loss)


def test_padded_batches_are_refused_at_init(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from hf_hsap.data import tokenizer_path

    tok = AutoTokenizer.from_pretrained(str(tokenizer_path()))
    tok.pad_token = tok.pad_token or tok.eos_token
    with pytest.raises(ValueError, match="packed, padding-free batches"):
        _trainer(tmp_path, data_collator=DataCollatorWithPadding(tok))


@pytest.mark.parametrize("field,value,match", [("average_tokens_across_devices", False, "average_tokens"),
                                               ("label_smoothing_factor", 0.1, "label_smoothing")])
def test_arguments_that_break_the_exact_loss_are_refused(tmp_path: Path, field: str, value: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _trainer(tmp_path, args=_args(tmp_path, **{field: value}))


def test_sft_without_packing_is_refused(tmp_path: Path) -> None:
    args = _args(tmp_path, HSAPSFTConfig, packing=False, max_length=64, bf16=False)
    data = Dataset.from_list([{"prompt": "a b", "completion": " c d"}] * 4)
    from transformers import AutoTokenizer

    from hf_hsap.data import tokenizer_path

    with pytest.raises(ValueError, match="packing=True"):
        HSAPSFTTrainer(model=make_model("qwen2"), args=args, train_dataset=data,
                       processing_class=AutoTokenizer.from_pretrained(str(tokenizer_path())))


def test_args_carry_the_hsap_config_and_the_old_spellings_are_gone(tmp_path: Path) -> None:
    args = _args(tmp_path, HSAPTrainingArguments, hsap_placement="zigzag", hsap_rounds="batched",
                 hsap_recv_budget_tokens=64)
    trainer = _trainer(tmp_path, args=args)
    cfg = trainer.hsap_config
    assert (cfg.placement, cfg.rounds, cfg.recv_budget_tokens, cfg.sp_size) == ("zigzag", "batched", 64, 1)
    assert cfg.model_config is trainer.model.config and trainer.sp.cost_model is not None
    assert trainer.get_total_train_batch_size(trainer.args) == 4  # SP 1: Trainer's own figure
    local = next(iter(trainer.get_train_dataloader()))
    assert local["hsap_plan"].recv_budget_tokens == 64 and local["hsap_plan"].round_order == "batched"
    with pytest.raises(TypeError, match="sp_placement"):  # the unreleased spelling is gone: hsap_config
        _trainer(tmp_path, sp_placement="contiguous")
    explicit = _trainer(tmp_path, hsap_config=HSAPConfig(placement="balanced"))
    assert explicit.hsap_config.placement == "balanced"


def test_resume_override_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    args = _args(tmp_path, max_steps=2, save_strategy="steps", save_steps=1)
    _trainer(tmp_path, args=args).train()
    resumed = _trainer(tmp_path, args=_args(tmp_path, max_steps=2, save_strategy="no"))
    with caplog.at_level(logging.WARNING, logger="hf_hsap"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert any("ignore_data_skip" in r.getMessage() for r in caplog.records)
    assert resumed.args.ignore_data_skip is False  # restored after the call


def test_the_sp_argument_must_agree_with_the_configured_size(tmp_path: Path) -> None:
    import hf_hsap

    args = _args(tmp_path, HSAPTrainingArguments, hsap_sp_size=4)
    with pytest.raises(ValueError, match="sp=1 but the HSAP config sets sp_size=\\[4\\]"):
        _trainer(tmp_path, args=args, sp=1)
    group = hf_hsap.init_sequence_parallel(1)
    with pytest.raises(ValueError, match="sp=1"):
        _trainer(tmp_path, sp=group, hsap_config=HSAPConfig(sp_size=2, ulysses_size=1))
    # a caller's group keeps its own config; the trainer plans with the args' options
    args = _args(tmp_path, HSAPTrainingArguments, hsap_placement="zigzag", hsap_recv_budget_tokens=128,
                 hsap_grad_comm_dtype="float32")
    trainer = _trainer(tmp_path, args=args, sp=group)
    assert trainer.sp is group and group.config.placement == "auto"
    assert (trainer.hsap_config.placement, trainer.hsap_config.recv_budget_tokens) == ("zigzag", 128)
    assert group.grad_comm_dtype == torch.float32 and group.cost_model is not None


def test_positional_output_dir_and_wrapped_packing(tmp_path: Path) -> None:
    assert HSAPTrainingArguments(str(tmp_path), use_cpu=True).output_dir == str(tmp_path)
    args = _args(tmp_path, HSAPSFTConfig, packing=True, packing_strategy="wrapped", max_length=64, bf16=False)
    data = Dataset.from_list([{"prompt": "a b", "completion": " c d"}] * 4)
    from transformers import AutoTokenizer

    from hf_hsap.data import tokenizer_path

    with pytest.raises(ValueError, match="packing_strategy='bfd'"):
        HSAPSFTTrainer(model=make_model("qwen2"), args=args, train_dataset=data,
                       processing_class=AutoTokenizer.from_pretrained(str(tokenizer_path())))


def test_the_old_spellings_are_gone(tmp_path: Path) -> None:
    """The unreleased dict / attribute spellings are gone: HSAPConfig carries the options."""
    import hf_hsap

    batch = {"input_ids": torch.arange(20).reshape(1, 20), "position_ids": torch.arange(20).reshape(1, 20)}
    with pytest.raises(TypeError, match="plan_options"):
        hf_hsap.shard_batch(batch, None, plan_options={"rounds": "batched"})
    trainer = _trainer(tmp_path, hsap_config=HSAPConfig(placement="balanced", rounds="batched"))
    loader = trainer.get_train_dataloader()
    assert not hasattr(trainer, "sp_placement") and not hasattr(loader, "plan_options")
    assert loader.config.placement == "balanced" and loader.config.rounds == "batched"
