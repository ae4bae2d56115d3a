#!/usr/bin/env bash
# The memory levers beside DeepSpeed's ALST levers on CPU, then the memory model's validation and longest rows, then
# the SFT recipe's resident memory with hf_hsap's chunked loss and with TRL's fused LM head, then the model's host
# memory against CPU runs' peak resident set (python -m benchmarks memory: benchmarks/suites/memory_levers.py,
# memory_model.py, sft_memory.py, host_memory.py): writes benchmarks/results/memory_levers.json, memory_model.json,
# sft_memory.json and host_memory.json, then re-renders benchmarks/results/memory.md and BENCHMARKS.md. Arguments go to the levers (e.g. --quick, --no-write-md). DeepSpeed's environment: scripts/ds_env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ds_env.sh  # VENV: DeepSpeed's environment, made if needed
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$VENV/bin/python" -m benchmarks memory "$@"
