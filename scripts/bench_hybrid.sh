#!/usr/bin/env bash
# A hybrid model's training step under SP on CPU (python -m benchmarks hybrid, benchmarks/suites/hybrid_step.py), then
# one document split over the SP group in recurrent-only models (benchmarks/suites/recurrent_split.py): writes
# benchmarks/results/hybrid_step.json and recurrent_split.json, then re-renders benchmarks/results/hybrid.md and
# BENCHMARKS.md.
# Arguments pass through (e.g. --quick: tiny sizes, no timing, the pages left alone; pair it with --out).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m benchmarks hybrid "$@"
