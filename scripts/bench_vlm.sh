#!/usr/bin/env bash
# A VLM training step under SP on CPU (issue 42): per-rank tensor peak and step time of one forward + backward of a
# Qwen2.5-VL on a packed image + text row at SP 1, 2 and 4, hf_hsap beside "every rank encodes every image"
# (benchmarks/vlm_step.py). Writes benchmarks/results/vlm_step.json, then renders it into benchmarks/results/vlm.md
# and BENCHMARKS.md's headline (benchmarks/publish.py). Arguments go to `python -m benchmarks.vlm_step` (e.g.
# --quick: tiny sizes, memory only, the pages left alone; pair it with --out).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m benchmarks.vlm_step "$@"
