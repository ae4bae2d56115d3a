#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite on CPU. This is the command .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"
