"""The one table of GPU kinds and model shapes (``hf_hsap.hardware``), and the library's places that read it (the
benchmarks' calibration and cost model read it too: ``tests/benchmarks/test_hardware_table.py``).

Device names are passed in (``torch.cuda.get_device_name`` is patched where a caller queries it), so
every check runs without a GPU.
"""
import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers import DEVICE_NAMES
import hf_hsap.devices as devices
from hf_hsap import HSAPConfig, hardware
from hf_hsap.devices import detect_hardware
from hf_hsap.plan.cost import HARDWARE_LINKS, CostModel

ROOT = Path(__file__).resolve().parents[2]
LLAMA3 = SimpleNamespace(num_attention_heads=32, num_key_value_heads=8, hidden_size=4096, intermediate_size=14336)


def _imports(path: Path) -> set[str]:
    """Top-level names of the modules a source file imports (relative imports as ``.name``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add("." * node.level + (node.module or "").split(".")[0])
    return out


@pytest.mark.parametrize("name,key", DEVICE_NAMES.items())
def test_device_name_mapping(name, key):
    assert hardware.hardware_for_device_name(name) == key
    want_peak = None if key is None else hardware.gpu_kind(key).peak_bf16_flops
    assert hardware.peak_flops_for_device_name(name) == want_peak
    want_cost = key if key in ("A100", "H100", "B200", "GB200") else "A100"
    assert hardware.cost_hardware_for_device_name(name) == want_cost


def test_resolved_figures():
    """One value per GPU: Hopper variants are an H100; Blackwell has its own figures; A100 / H100 unchanged."""
    peak = hardware.peak_flops_for_device_name
    assert peak("NVIDIA H200") == peak("NVIDIA GH200 480GB") == peak("NVIDIA H100 80GB HBM3") == 989e12
    assert peak("NVIDIA B200") == 2.25e15 and peak("NVIDIA GB200") == 2.5e15
    assert peak("NVIDIA A100-SXM4-80GB") == peak("NVIDIA A800-SXM4-80GB") == 312e12
    assert dict(HARDWARE_LINKS) == {"A100": (312e12, 300e9, 25e9), "H100": (989e12, 450e9, 50e9),
                                    "B200": (2.25e15, 900e9, 50e9), "GB200": (2.5e15, 900e9, 50e9)}
    assert hardware.cost_model_kinds() == tuple(HARDWARE_LINKS)
    assert hardware.cost_hardware_for_device_name(None) == hardware.DEFAULT_HARDWARE == "A100"


def test_table_is_consistent():
    keys = [k.key for k in hardware.GPU_KINDS]
    assert len(keys) == len(set(keys))
    subs = [s for k in hardware.GPU_KINDS for s in k.name_substrings]
    assert len(subs) == len(set(subs))  # a substring names one kind
    for kind in hardware.GPU_KINDS:
        assert kind.peak_bf16_flops > 0
        for sub in kind.name_substrings:  # longest match wins: "GB200" is not a B200, "L40S" not an L4
            assert hardware.hardware_for_device_name(f"NVIDIA {sub} 80GB") == kind.key, sub
    with pytest.raises(ValueError, match="unknown hardware 'TPU'.*A100"):
        hardware.gpu_kind("TPU")
    with pytest.raises(dataclasses.FrozenInstanceError):
        hardware.GPU_KINDS[0].peak_bf16_flops = 1.0
    with pytest.raises(TypeError):
        HARDWARE_LINKS["A100"] = (1.0, 1.0, 1.0)


def test_from_config_takes_an_explicit_hardware():
    params = 4096 * 128 * (64 + 16) + 3 * 4096 * 14336
    for hw, (peak, nvl, net) in (("A100", (312e12, 300e9, 25e9)), ("H100", (989e12, 450e9, 50e9))):
        want = CostModel.from_shapes(32, 8, 128, params, net * 0.8, peak, alpha_s=20e-6, a2a_bytes_per_s=nvl * 0.8)
        assert CostModel.from_config(LLAMA3, "network", hw) == want
    assert CostModel.from_config(LLAMA3, "nvlink", "B200") != CostModel.from_config(LLAMA3, "nvlink", "H100")
    # the planner queries no device: the default is a fixed kind, this process's GPU is passed explicitly
    assert CostModel.from_config(LLAMA3, "network") == CostModel.from_config(LLAMA3, "network", "A100")
    with pytest.raises(ValueError, match="unknown hardware 'auto'"):
        CostModel.from_config(LLAMA3, "network", "auto")
    with pytest.raises(ValueError, match="unknown hardware 'L40S'"):
        CostModel.from_config(LLAMA3, "network", "L40S")  # in the table, but without link figures


@pytest.mark.parametrize("available,name,key", [
    (False, None, "A100"), (True, "NVIDIA H200", "H100"), (True, "NVIDIA GH200 480GB", "H100"),
    (True, "NVIDIA B200", "B200"), (True, "NVIDIA L40S", "A100"), (True, "Tesla T4", "A100"),
])
def test_detect_hardware(monkeypatch, available, name, key):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert devices.device_name() == name
    assert devices.detect_hardware() == key


def test_cost_for_prices_the_detected_gpu(monkeypatch):
    cfg = HSAPConfig(model_config=LLAMA3)
    monkeypatch.setattr(devices, "detect_hardware", lambda: "H100")
    h100 = CostModel.from_config(LLAMA3, "network", "H100")
    assert cfg.cost_for("network") == h100 != CostModel.from_config(LLAMA3, "network", "A100")
    monkeypatch.setattr(devices, "detect_hardware", lambda: "A100")
    assert cfg.cost_for("network") == CostModel.from_config(LLAMA3, "network", "A100")


def test_no_device_query_in_the_planner_and_pure_modules():
    for f in sorted((ROOT / "hf_hsap" / "plan").glob("*.py")):
        text = f.read_text()
        for query in ("cuda.is_available", "get_device_name", "cuda.current_device", "get_device_properties"):
            assert query not in text, f"{f.name} queries the device ({query})"
    for table in ("hardware.py", "model_shape.py"):
        assert _imports(ROOT / "hf_hsap" / table) <= {"__future__", "dataclasses", "types", "typing"}
    assert _imports(ROOT / "hf_hsap" / "data" / "lengths.py") <= {"__future__", "types", "typing", "numpy"}
