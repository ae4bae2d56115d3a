#!/usr/bin/env bash
# The device checks for one lent GPU, in one command (see README "GPU checks"): the CUDA tests, the memory levers
# and the memory model against torch.cuda.max_memory_allocated (tests/cuda/check_memory.py, $OUT/memory.json) and
# the TRL SFT path's memory, chunked loss beside TRL's fused head (tests/cuda/check_sft_memory.py, $OUT/sft_memory.json),
# the activation offloading's pinned slab (tests/cuda/check_slab_offload.py), the
# packed vision-language models (tests/cuda/check_vlm.py), the packed hybrid models with fla / mamba-ssm /
# causal-conv1d where installed (tests/cuda/check_hybrid.py), then the cost-model calibration. Run from the
# repository root on the GPU machine, whose python3 has torch with CUDA. Logs and calibration.json go to $OUT (the
# device tool's folder) or /tmp/hsap_gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/hsap_gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__)" 2>&1 | tee -a "$out/device.txt"
timeout 180 python3 -m pytest -q -p no:cacheprovider tests/cuda/check_cuda.py 2>&1 | tee "$out/cuda_tests.log"
tests_rc=${PIPESTATUS[0]}
OUT=$out timeout 120 python3 -m pytest -q -s -p no:cacheprovider tests/cuda/check_memory.py 2>&1 | tee "$out/memory.log"
mem_rc=${PIPESTATUS[0]}
OUT=$out timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/cuda/check_sft_memory.py 2>&1 | tee "$out/sft_memory.log"
[ "${PIPESTATUS[0]}" = 0 ] || mem_rc=1
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/cuda/check_slab_offload.py 2>&1 | tee "$out/slab_offload.log"
[ "${PIPESTATUS[0]}" = 0 ] || mem_rc=1
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/cuda/check_vlm.py 2>&1 | tee "$out/vlm.log"
vlm_rc=${PIPESTATUS[0]}
timeout 90 python3 -m pytest -q -s -p no:cacheprovider tests/cuda/check_hybrid.py 2>&1 | tee "$out/hybrid.log"
hybrid_rc=${PIPESTATUS[0]}
[ -f benchmarks/calibration.json ] && cp benchmarks/calibration.json "$out/calibration.json"
timeout 240 python3 -m benchmarks calibrate --out "$out/calibration.json" 2>&1 | tee "$out/calibrate.log"
cal_rc=${PIPESTATUS[0]}
echo "cuda tests rc=$tests_rc, memory rc=$mem_rc, vlm rc=$vlm_rc, hybrid rc=$hybrid_rc, calibration rc=$cal_rc" \
  | tee -a "$out/device.txt"
exit $(( tests_rc != 0 || mem_rc != 0 || vlm_rc != 0 || hybrid_rc != 0 || cal_rc != 0 ))
