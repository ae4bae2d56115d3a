"""The benchmarks read the one table of GPU kinds and model shapes (``hf_hsap.hardware``): the GPU calibration
(:mod:`benchmarks.suites.gpu_calibrate`, beside ``recipes/common.py``) and the benchmark cost model
(:mod:`benchmarks.analytic.cost_model`) hold no table of their own.

Device names are passed in (``torch.cuda.get_device_name`` is patched), so every check runs without a GPU.
"""
import importlib

import pytest
import torch

import benchmarks.analytic.cost_model as bcm
import benchmarks.suites.gpu_calibrate as gcal
from helpers import DEVICE_NAMES
from hf_hsap import hardware
from hf_hsap.model_shape import MODEL_SHAPES
from hf_hsap.plan.cost import HARDWARE_LINKS


def _common():
    """``recipes/common.py`` (a namespace package: the repository root is on the path)."""
    return importlib.import_module("recipes.common")


@pytest.mark.parametrize("name", list(DEVICE_NAMES))
def test_recipes_and_calibration_read_the_table(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    cuda = torch.device("cuda")
    peak = hardware.peak_flops_for_device_name(name)
    assert _common().guess_peak_flops(cuda, None) == peak
    assert _common().guess_peak_flops(cuda, 100.0) == 100e12  # --peak_tflops wins
    key = hardware.hardware_for_device_name(name)
    want = (name, key, peak) if key is not None else (name, name.replace(" ", "_"), None)
    assert gcal.device_peak(cuda, torch.bfloat16) == want
    assert gcal.peak_for_device_name(name) == want[1:]


def test_recipes_and_calibration_have_no_table_of_their_own(monkeypatch):
    """A kind added to the one table is seen by both: they hold no copy."""
    fake = hardware.GPUKind("ZZ9000", ("ZZ9000",), 7e15)
    monkeypatch.setattr(hardware, "GPU_KINDS", (*hardware.GPU_KINDS, fake))
    monkeypatch.setattr(hardware, "_BY_KEY", {**hardware._BY_KEY, "ZZ9000": fake})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA ZZ9000 SXM")
    assert _common().guess_peak_flops(torch.device("cuda"), None) == 7e15
    assert gcal.device_peak(torch.device("cuda"), torch.bfloat16) == ("NVIDIA ZZ9000 SXM", "ZZ9000", 7e15)


def test_cpu_has_no_peak():
    assert _common().guess_peak_flops(torch.device("cpu"), None) is None
    assert gcal.device_peak(torch.device("cpu"), torch.float32) == ("cpu", "cpu", None)
    assert gcal.PEAKS["H200"] == ("H100", 989e12) and gcal.PEAKS["B200"] == ("B200", 2.25e15)


def test_benchmark_cost_model_reads_the_table():
    assert set(bcm.HARDWARE) == {"A100", "H100"}
    for key, spec in bcm.HARDWARE.items():
        kind = hardware.gpu_kind(key)
        assert (spec.name, spec.peak_flops, spec.intra_bw, spec.inter_bw, spec.gpus_per_node) == (
            key, kind.peak_bf16_flops, kind.nvlink_bytes_per_s, kind.network_bytes_per_s, 8)
        assert HARDWARE_LINKS[key] == (spec.peak_flops, spec.intra_bw, spec.inter_bw)
    assert bcm.MODELS is MODEL_SHAPES and set(MODEL_SHAPES) == {"llama2-7b", "llama3-8b"}
    assert bcm.MODELS["llama3-8b"].layer_linear_params == 4096 * 128 * (64 + 16) + 3 * 4096 * 14336
    assert bcm.HardwareSpec.from_table("B200").peak_flops == 2.25e15
    with pytest.raises(ValueError, match="no link figures"):
        bcm.HardwareSpec.from_table("L40S")
