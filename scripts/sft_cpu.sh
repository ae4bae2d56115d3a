#!/usr/bin/env bash
# TRL SFT on CPU, from a fresh clone: set up .venv, then fine-tune the tiny built-in Llama on the shipped
# prompt/completion set (data/sft.jsonl) with TRL's SFTTrainer (packing, completion-only loss) under
# hf_hsap: 4 CPU processes, sequence parallel 4 = Ulysses 2 x HSAP ring 2. About a minute on 2 cores; writes
# runs/sft_cpu/metrics.jsonl. Pass `--model runs/pretrain_cpu/final_model` to start from the main job's model,
# `--data_format messages` for the chat set; other extra arguments go to the recipe too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec .venv/bin/python -m accelerate.commands.launch --config_file accelerate_configs/cpu_4proc.yaml \
  --main_process_port "${MAIN_PROCESS_PORT:-29500}" \
  recipes/sft_trl.py --model tiny-llama --sp_size 4 --ulysses_size 2 \
  --max_length 512 --rows_per_step 8 --max_steps 60 --learning_rate 2e-3 \
  --eval_every 20 --output_dir runs/sft_cpu "$@"
