#!/usr/bin/env bash
# DeepSpeed ZeRO-2 / ZeRO-3 / ZeRO-3 offload and FSDP2 CPU offload with HSAPSFTTrainer and recipes/pretrain.py on 2 CPU
# processes against one process without an engine
# (scripts/deepspeed_cpu_check.py). DeepSpeed is not an hf_hsap dependency, so this uses its own virtual
# environment (HSAP_DS_VENV, default .venv-ds): the CPU torch wheel, hf_hsap, then deepspeed. The first run
# compiles DeepSpeed's CPU ops (communication, CPU Adam: g++ and ninja; a few minutes). Writes
# benchmarks/results/offload_check.json.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${HSAP_DS_VENV:-.venv-ds}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  wheel=$(ls /opt/wheels/torch-2.13.0*cpu*.whl 2>/dev/null | head -n 1 || true)
  "$VENV/bin/pip" install -q "${HSAP_TORCH_SPEC:-${wheel:-torch==2.13.0}}"
fi
if ! "$VENV/bin/python" -c "import deepspeed, hf_hsap, trl" >/dev/null 2>&1; then
  "$VENV/bin/pip" install -q -e . deepspeed
fi
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$VENV/bin/python" scripts/deepspeed_cpu_check.py "$@"
