#!/usr/bin/env bash
# A hybrid model's training step under SP on CPU: per-rank tensor peak and step time of one forward + backward of a
# Qwen3.5-like hybrid (linear attention beside full attention) and of a pure-attention Qwen3 of the same size on a
# packed text row at SP 1, 2 and 4, and the recurrent state bytes a split document moves against their formula; the
# hybrid both on the SP group's default plan (attention priced only) and on a plan priced for its recurrent layers
# (CostModel.from_config(config, "network", "H100")) (benchmarks/hybrid_step.py). Writes
# benchmarks/results/hybrid_step.json, then renders it into benchmarks/results/hybrid.md and BENCHMARKS.md's headline
# (benchmarks/publish.py). Arguments go to `python -m benchmarks.hybrid_step`
# (e.g. --quick: tiny sizes, no timing, the pages left alone; pair it with --out).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m benchmarks.hybrid_step "$@"
