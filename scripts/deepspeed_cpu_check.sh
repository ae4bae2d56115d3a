#!/usr/bin/env bash
# DeepSpeed ZeRO-2 / ZeRO-3 / ZeRO-3 offload and FSDP2 CPU offload, each through its shipped Accelerate config, with
# HSAPSFTTrainer and recipes/pretrain.py on 2 CPU processes (HSAP SP 2, fp32) against one process without an engine
# (scripts/deepspeed_cpu_check.py). DeepSpeed is not an hf_hsap dependency, so this uses its own virtual environment
# (scripts/ds_env.sh: HSAP_DS_VENV, default .venv-ds, with the CPU torch wheel, hf_hsap and deepspeed). The first run
# compiles DeepSpeed's CPU ops (communication, CPU Adam: g++ and ninja; several minutes); a run takes about 8 minutes
# on 2 CPU cores. Writes benchmarks/results/offload_check.json; exits 1 on a mismatch.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ds_env.sh
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$VENV/bin/python" scripts/deepspeed_cpu_check.py "$@"
