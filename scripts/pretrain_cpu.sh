#!/usr/bin/env bash
# The main job, from a fresh clone: set up .venv (CPU torch + hf_hsap), then pretrain the tiny built-in
# Llama on the shipped corpus with 4 CPU processes, sequence parallel 4 = Ulysses 2 x HSAP ring 2.
# A few minutes on 2 cores: it prints the loss going down, TGS (tokens/s per device) and the eval loss, and
# writes runs/pretrain_cpu/metrics.jsonl, checkpoints and the final model. Extra arguments go to the recipe
# (e.g. `bash scripts/pretrain_cpu.sh --max_steps 50`); MAIN_PROCESS_PORT changes the rendezvous port.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec .venv/bin/python -m accelerate.commands.launch --config_file accelerate_configs/cpu_4proc.yaml \
  --main_process_port "${MAIN_PROCESS_PORT:-29500}" \
  recipes/pretrain.py --model tiny-llama --sp_size 4 --ulysses_size 2 \
  --max_length 512 --docs_per_step 16 --max_steps 200 --learning_rate 3e-3 \
  --eval_every 50 --save_every 100 --log_every 10 --output_dir runs/pretrain_cpu "$@"
