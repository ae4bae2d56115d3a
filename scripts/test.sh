#!/usr/bin/env bash
# Set up (if needed) and run the default test suite on CPU (about 10 minutes on 2 cores): every test but the ones
# marked slow (end-to-end recipe launches and benchmark smoke runs, each over about 20 s). Arguments go to pytest:
# `bash scripts/test.sh -m slow` runs the slow ones (a later -m replaces this one). .ci/run calls both.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider -m "not slow" tests "$@"
