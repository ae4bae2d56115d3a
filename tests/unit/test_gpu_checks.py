"""The GPU checks (``tests/cuda/check_cuda.py``, run by ``scripts/gpu_check.sh`` on a lent GPU) stay
runnable: their logic runs here on CPU (``HSAP_CHECK_DEVICE=cpu``), at the checks' own sizes except the
whole-plan runtime check, whose harness ``tests/unit/test_loopback.py`` covers."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

CHECKS = Path(__file__).resolve().parents[1] / "cuda" / "check_cuda.py"


def test_gpu_checks_run_on_cpu(monkeypatch) -> None:
    monkeypatch.setitem(os.environ, "HSAP_CHECK_DEVICE", "cpu")
    spec = importlib.util.spec_from_file_location("check_cuda_on_cpu", CHECKS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.DEV.type == "cpu"
    mod.test_flash_kernel_runtime_shapes(torch.bfloat16, True)
    mod.test_flash_kernel_edge_shapes(torch.bfloat16)
    mod.test_math_kernel_fp32_runtime_shapes()
    mod.test_packed_model_matches_documents_alone()
