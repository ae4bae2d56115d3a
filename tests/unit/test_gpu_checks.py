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


def test_gpu_memory_checks_run_on_cpu(monkeypatch) -> None:
    """``tests/cuda/check_memory.py``'s step on CPU at a tiny size: the levers' losses agree in bf16 and the tensor
    peak of the chunked loss is below the full logits' (the GPU run compares with the memory model)."""
    monkeypatch.setitem(os.environ, "HSAP_CHECK_DEVICE", "cpu")
    spec = importlib.util.spec_from_file_location("check_memory_on_cpu", CHECKS.parent / "check_memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.DEV.type == "cpu"
    tiny = {**mod.SIZES, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 4096}
    mod.test_levers_give_the_loss_of_the_plain_step(tiny, 256)
    full, chunked = (mod._step("x", 1024, levers, tiny)[1] for levers in (dict(chunked_loss=False), dict()))
    assert chunked < full


def test_gpu_vlm_checks_run_on_cpu(monkeypatch) -> None:
    """``tests/cuda/check_vlm.py`` on CPU in float32: the packed VLMs against their documents alone, and the image
    block item against the dense mask."""
    monkeypatch.setitem(os.environ, "HSAP_CHECK_DEVICE", "cpu")
    spec = importlib.util.spec_from_file_location("check_vlm_on_cpu", CHECKS.parent / "check_vlm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.DEV.type == "cpu"
    for family in ("qwen2_5_vl", "llava", "gemma3"):
        mod.test_packed_vlm_bf16_matches_documents_alone(family)
    mod.test_image_block_item_on_the_device_kernel()


def test_gpu_hybrid_checks_run_on_cpu(monkeypatch) -> None:
    """``tests/cuda/check_hybrid.py`` on CPU in float32: packed hybrid models against their documents alone."""
    monkeypatch.setitem(os.environ, "HSAP_CHECK_DEVICE", "cpu")
    spec = importlib.util.spec_from_file_location("check_hybrid_on_cpu", CHECKS.parent / "check_hybrid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.DEV.type == "cpu"
    mod.test_kernels_installed()
    for family in mod.FAMILIES:
        mod.test_packed_hybrid_bf16_matches_documents_alone(family)



def test_gpu_sft_memory_check_arithmetic() -> None:
    """``tests/cuda/check_sft_memory.py`` (the SFT path's memory on a GPU): its recipe flags name the loss path, and
    the model it compares with grows less per token with the chunked loss than with TRL's fused head (on CPU the
    measurement itself is ``python -m benchmarks sft_memory``)."""
    spec = importlib.util.spec_from_file_location("check_sft_memory_on_cpu", CHECKS.parent / "check_sft_memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from hf_hsap.examples import builtin_config

    assert "--hsap_chunked_loss" not in mod.recipe_flags(4096, True, Path("o"), Path("m"))
    assert mod.recipe_flags(4096, False, Path("o"), Path("m"))[-2:] == ["--hsap_chunked_loss", "false"]
    config = builtin_config(mod.MODEL, mod.VOCAB, max(mod.LENGTHS)).to_dict()
    chunked, fused = (mod.predicted_growth(config, mod.LENGTHS, c) for c in (True, False))
    assert 0 < chunked < fused / 10
    runs = {n: {"peak_gib": n / 2**20} for n in mod.LENGTHS}
    assert mod.measured_growth(runs, mod.LENGTHS) == 1024
