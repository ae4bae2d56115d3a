"""One HSAPSFTTrainer run (fp32, tiny Llama, 4 steps) for the engine checks on CPU; prints ``LOSS [...]`` (the
per-step losses, full precision) and ``OPTIMIZER <class>`` on rank 0.

    python scripts/engine_sft_worker.py MODEL DATA OUT                                 # the single-process reference
    accelerate launch --config_file <DeepSpeed / FSDP config> scripts/cpu_engine.py scripts/engine_sft_worker.py ...

Used by scripts/deepspeed_cpu_check.py (DeepSpeed ZeRO-2 / ZeRO-3 / ZeRO-3 offload) and
tests/recipes/test_fsdp2_offload.py (FSDP2 with CPUOffloadPolicy); under ``accelerate launch`` run it through
``scripts/cpu_engine.py``, which makes Accelerate run the engine on CPU processes.
"""
import json
import os
import sys

from datasets import load_dataset

from hf_hsap.integrations import HSAPSFTConfig, HSAPSFTTrainer

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
    engine = getattr(trainer, "deepspeed", None)  # the DeepSpeed engine: its ZeRO optimizer and the basic one inside
    inner = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    print("OPTIMIZER", f"{type(engine.optimizer).__name__}({type(engine.basic_optimizer).__name__})" if engine
          else type(inner).__name__, flush=True)
trainer.end()
