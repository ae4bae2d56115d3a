#!/usr/bin/env bash
# Run every benchmark and write benchmarks/results/results.json and benchmarks/plots/*.png, then BENCHMARKS.md and
# the detail files benchmarks/results/*.md (rendered from every results JSON there: benchmarks/publish.py).
# Arguments pass through: --quick (small sizes), --skip-cpu (no CPU timing / memory runs), --render-only (measure
# nothing: redraw the plots and re-render the pages from the JSON).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1
exec .venv/bin/python -m benchmarks.run "$@"
