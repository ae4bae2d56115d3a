"""One HSAPSFTTrainer run for ``scripts/deepspeed_cpu_check.py`` (fp32, tiny Llama); prints ``LOSS [...]`` on
rank 0. Under ``accelerate launch`` with a DeepSpeed config it runs ZeRO on CPU processes.

On a machine without GPUs, Accelerate 1.15 gives DeepSpeed no backend and then counts one process (the
ranks would train apart; ``init_sequence_parallel`` refuses that state). DeepSpeed itself runs on gloo there,
so this script (and only this script: it is a check harness, not library code) makes Accelerate's backend
choice gloo / MULTI_CPU for that case before anything creates the Accelerator.
"""
import json
import os
import sys

import torch

if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and not torch.cuda.is_available():
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    _prepare_backend = PartialState._prepare_backend

    def _gloo_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        chosen, kind = _prepare_backend(self, cpu, sagemaker_dp, backend)
        return ("gloo", DistributedType.MULTI_CPU) if chosen is None else (chosen, kind)

    PartialState._prepare_backend = _gloo_backend

from datasets import load_dataset  # noqa: E402

from hf_hsap.integrations import HSAPSFTConfig, HSAPSFTTrainer  # noqa: E402

model, data, out = sys.argv[1:4]
deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
world = int(os.environ.get("WORLD_SIZE", "1"))
args = HSAPSFTConfig(output_dir=out, packing=True, use_cpu=not deepspeed, bf16=False, fp16=False,
                     max_length=128, max_steps=4, per_device_train_batch_size=1, gradient_accumulation_steps=2,
                     learning_rate=1e-3, logging_steps=1, report_to="none", seed=0, save_strategy="no",
                     hsap_sp_size=world)
trainer = HSAPSFTTrainer(model=model, args=args, train_dataset=load_dataset(data, split="train"))
assert trainer.is_deepspeed_enabled == deepspeed and trainer.accelerator.num_processes == world
trainer.train()
if trainer.is_world_process_zero():
    print("LOSS", json.dumps([h["loss"] for h in trainer.state.log_history if "loss" in h]), flush=True)
    print("OPTIMIZER", type(trainer.optimizer.optimizer if deepspeed else trainer.optimizer).__name__, flush=True)
trainer.end()
