#!/usr/bin/env bash
# A VLM training step under SP on CPU (python -m benchmarks vlm, benchmarks/suites/vlm_step.py): writes
# benchmarks/results/vlm_step.json, then re-renders benchmarks/results/vlm.md and BENCHMARKS.md. Arguments pass
# through (e.g. --quick: tiny sizes, memory only, the pages left alone; pair it with --out).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m benchmarks vlm "$@"
