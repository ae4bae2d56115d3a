"""Fine-tune as TRL's docs show, with ``HSAPSFTTrainer`` / ``HSAPSFTConfig`` in place of ``SFTTrainer`` /
``SFTConfig`` (TRL's defaults, bf16 included), sequence parallel over every launched process:

    python examples/trl_sft.py MODEL DATA OUT                       # one process
    accelerate launch --config_file accelerate_configs/cpu_4proc.yaml examples/trl_sft.py MODEL DATA OUT

MODEL: a model directory or Hub name; DATA: a ``datasets`` directory or Hub name with a train split
(``hf_hsap.examples.save_tiny_model`` / ``save_sft_data`` make both offline). Extra ``key=value`` arguments
set further ``HSAPSFTConfig`` fields (parsed as JSON where they can be, e.g. ``max_steps=4``).
"""
import json
import os
import sys

from datasets import load_dataset

from hf_hsap.integrations import HSAPSFTConfig, HSAPSFTTrainer

model, data, out, *extra = sys.argv[1:]
fields = {}
for item in extra:
    key, value = item.split("=", 1)
    try:
        fields[key] = json.loads(value)
    except json.JSONDecodeError:
        fields[key] = value

dataset = load_dataset(data, split="train")
training_args = HSAPSFTConfig(
    output_dir=out,
    packing=True,
    use_cpu=not __import__("torch").cuda.is_available(),
    hsap_sp_size=int(os.environ.get("WORLD_SIZE", "1")),  # one SP group over every launched process
    **fields,
)
trainer = HSAPSFTTrainer(model=model, args=training_args, train_dataset=dataset)
trainer.train()
trainer.end()
