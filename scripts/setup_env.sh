#!/usr/bin/env bash
# Idempotent environment set-up from a clean clone: a virtual environment in .venv with the CPU torch
# wheel installed first (a bare `torch` requirement would pull a multi-GB CUDA build), then hf_hsap with
# its test extra. Set HSAP_TORCH_SPEC to install another torch (e.g. a CUDA build on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  spec=${HSAP_TORCH_SPEC:-}
  if [ -z "$spec" ]; then
    wheel=$(ls /opt/wheels/torch-2.13.0*cpu*.whl 2>/dev/null | head -n 1 || true)
    spec=${wheel:-"torch==2.13.0"}
  fi
  .venv/bin/pip install -q "$spec"
fi
if ! .venv/bin/python -c "import hf_hsap, pytest, hypothesis, trl, matplotlib, importlinter, scipy, mkdocs, material, mkdocstrings, num2words" >/dev/null 2>&1 \
    || [ ! -x .venv/bin/hsap-sft ]; then
  .venv/bin/pip install -q -e ".[test]"
fi
