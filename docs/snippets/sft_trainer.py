from datasets import load_dataset
from hf_hsap.examples import save_sft_data, save_tiny_model
from hf_hsap.integrations import HSAPSFTConfig, HSAPSFTTrainer

model_path = save_tiny_model("runs/tiny-llama")     # a random tiny Llama + tokenizer; or a Hub name / path
dataset = load_dataset(save_sft_data("runs/sft-data", n_train=64), split="train")
training_args = HSAPSFTConfig(output_dir="runs/readme-sft", packing=True, max_length=128, max_steps=2,
                              use_cpu=True,         # on CPU; TRL's bf16 default stays on
                              hsap_sp_size=1)       # ranks sharing one packed sequence
trainer = HSAPSFTTrainer(model=model_path, args=training_args, train_dataset=dataset)
trainer.train()
