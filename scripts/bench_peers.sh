#!/usr/bin/env bash
# hf_hsap beside DeepSpeed's own sequence parallelism (DistributedAttention and ALST's UlyssesSPAttentionHF) on
# CPU: world 4 on gloo, one attention layer fwd + bwd, every scheme over hf_hsap's CPU kernel, checked against a
# float64 reference, then timed interleaved and its peak memory measured (python -m benchmarks peers,
# benchmarks/suites/peers.py). Writes benchmarks/results/peers.json, then re-renders benchmarks/results/peers.md and
# BENCHMARKS.md; arguments pass through (e.g. --quick, --T 8192, --no-write-md).
# DeepSpeed is not an hf_hsap dependency, so this uses its own virtual environment (HSAP_DS_VENV, default
# .venv-ds, shared with scripts/deepspeed_cpu_check.sh): the CPU torch wheel, hf_hsap (editable), then deepspeed
# with DS_BUILD_OPS=0 (nothing compiled at install). deepspeed.init_distributed still JIT-compiles DeepSpeed's
# CPU shared-memory communication op on the first run in a fresh environment (g++ and ninja, about 2 minutes on
# 2 cores; cached in ~/.cache/torch_extensions afterwards); the all-to-alls measured here go through gloo.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ds_env.sh  # VENV: DeepSpeed's environment, made if needed
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$VENV/bin/python" -m benchmarks peers "$@"
