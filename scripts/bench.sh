#!/usr/bin/env bash
# Run every benchmark and write BENCHMARKS.md, benchmarks/plots/*.png and benchmarks/results/results.json.
# Arguments pass through: --quick (small sizes), --skip-cpu (no CPU timing / memory runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1
exec .venv/bin/python -m benchmarks.run "$@"
