"""Worker functions for tests/distributed/test_preemption.py: the preemption handler and the HSAP trainer's
atomic checkpoints and preemption on spawned gloo ranks."""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import torch.distributed as dist

from helpers import environ_kept
from hf_hsap.checkpoint import COMPLETE_MARKER, PreemptionHandler

from .sp_model import _trainer_rows, make_model


def ranks_agree_on_a_signal(signal_rank: int) -> list[bool]:
    """``should_stop`` before and after ``signal_rank`` sent itself SIGUSR1 (every rank calls it each time)."""
    with PreemptionHandler() as handler:
        seen = [handler.should_stop()]
        if dist.get_rank() == signal_rank:
            os.kill(os.getpid(), signal.SIGUSR1)
        seen.append(handler.should_stop())
    return seen


@environ_kept  # a pool rank runs later tests: Trainer / Accelerate set launch variables
def trainer_preempted_then_resumed(sp_size: int, out_dir: str) -> dict[str, Any]:
    """HSAPTrainer, 5 steps, a checkpoint every 2: uninterrupted; then SIGTERM on rank 1 during step 3 (saved as
    checkpoint-3, one complete checkpoint kept); then a partial checkpoint-4 appears and
    ``resume_from_checkpoint=True`` must take checkpoint-3 and log steps 4-5 of the uninterrupted run."""
    from transformers import TrainerCallback, TrainingArguments

    from hf_hsap.data import PackingCollator
    from hf_hsap.integrations import HSAPTrainer

    rows = _trainer_rows(sp_size, seed=11, n=60)

    class SigtermAt(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2 and dist.get_rank() == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    def run(out: str, resume: Any = None, callbacks: list[Any] | None = None) -> tuple[Any, list[tuple[int, float]]]:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=5, logging_steps=1,
                                 learning_rate=1e-2, report_to=[], use_cpu=True, save_strategy="steps", save_steps=2,
                                 save_total_limit=1, seed=0, data_seed=0, disable_tqdm=True,
                                 remove_unused_columns=False)
        trainer = HSAPTrainer(model=make_model("qwen2"), args=args, train_dataset=rows, callbacks=callbacks,
                              data_collator=PackingCollator(max_length=64), sp=sp_size)
        trainer.train(resume_from_checkpoint=resume)
        return trainer, [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]

    full = run(os.path.join(out_dir, "full"))[1]
    out = os.path.join(out_dir, "preempted")
    trainer, first = run(out, callbacks=[SigtermAt()])
    handler_back = signal.getsignal(signal.SIGTERM) is not trainer._hsap_preemption._on_signal
    after_preemption = sorted(p.name + ("*" if (p / COMPLETE_MARKER).exists() else "") for p in Path(out).iterdir())
    dist.barrier()
    if dist.get_rank() == 0:  # a save of step 4 killed before its marker (Transformers' get_last_checkpoint picks it)
        (Path(out) / "checkpoint-4").mkdir()
        shutil.copy(Path(out) / "checkpoint-3" / "trainer_state.json", Path(out) / "checkpoint-4")
    dist.barrier()
    resumed_trainer, resumed = run(out, resume=True)
    return {"full": full, "first": first, "preempted": trainer.hsap_preempted, "handler_back": handler_back,
            "after_preemption": after_preemption, "resumed": resumed,
            "resumed_preempted": resumed_trainer.hsap_preempted, "resume_step": resumed_trainer._hsap_resume_step}
