#!/usr/bin/env bash
# The memory levers beside DeepSpeed's ALST levers on CPU (issue 41): tensor peaks and step times per rank against
# row length at SP 2, and the pretraining recipe's peak resident memory per token (benchmarks/memory_levers.py);
# then the memory model's validation and longest rows (benchmarks/memory_model.py). Writes
# benchmarks/results/memory_levers.json and memory_model.json, each then rendered into benchmarks/results/memory.md
# and BENCHMARKS.md. Arguments go to `python -m benchmarks.memory_levers` (e.g. --quick, --no-write-md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ds_env.sh  # VENV: DeepSpeed's environment, made if needed
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$VENV/bin/python" -m benchmarks.memory_levers "$@"
exec "$VENV/bin/python" -m benchmarks.memory_model
