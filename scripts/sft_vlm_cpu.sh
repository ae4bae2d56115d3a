#!/usr/bin/env bash
# TRL SFT of a vision-language model on CPU, from a fresh clone: set up .venv, then fine-tune a tiny random LLaVA
# (saved to runs/sft_vlm_cpu/base_model) on a generated image + text chat set (pictures of coloured shapes drawn
# by hf_hsap.examples.vlm, no download) with HSAPSFTTrainer: packed image + text rows, assistant-only loss, 4 CPU
# processes, sequence parallel 4 = Ulysses 2 x HSAP ring 2; each rank encodes only the images whose tokens it
# holds. Under a minute on 2 cores: it prints the loss of every step and the packed rows' documents / images per
# row, and writes runs/sft_vlm_cpu/{metrics.jsonl,packing.json} and the model. Extra arguments go to the recipe
# (any hsap-sft flag, e.g. `--max_steps 50`, `--model_name_or_path DIR --dataset_name DIR`), and `--model FAMILY`
# for another built-in tiny VLM of TRL's set (llava_next, mllama, smolvlm, gemma3, qwen2_5_vl, qwen3_vl, mistral3;
# rows of 512 tokens: a LLaVA-NeXT document of three images is 314).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec .venv/bin/python -m accelerate.commands.launch --config_file accelerate_configs/cpu_4proc.yaml \
  --main_process_port "${MAIN_PROCESS_PORT:-29500}" \
  recipes/sft_vlm.py --hsap_sp_size 4 --hsap_ulysses_size 2 \
  --per_device_train_batch_size 8 --train_rows 128 --max_steps 30 \
  --output_dir runs/sft_vlm_cpu "$@"
