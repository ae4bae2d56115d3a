#!/usr/bin/env bash
# The core benchmarks (python -m benchmarks core: traffic, windows, the placement sweep, the cost model, planning
# time, the CPU runs); then the plots and every page re-rendered from the JSON in benchmarks/results/. Arguments pass
# through: --quick (small sizes), --skip-cpu (no CPU timing / memory runs). `python -m benchmarks report` re-renders
# without measuring.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export OMP_NUM_THREADS=1
exec .venv/bin/python -m benchmarks core "$@"
