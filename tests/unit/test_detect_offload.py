"""detect_offload reads what the engine keeps on the host from the shipped DeepSpeed configs and Accelerate's FSDP
plugin (the FSDP2 recipe / trainer runs under a real Accelerator are in tests/recipes/test_fsdp2_offload.py)."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from hf_hsap.integrations.memory_fit import detect_offload

DS = Path(__file__).resolve().parents[2] / "accelerate_configs" / "deepspeed"


def _ds(config: dict) -> SimpleNamespace:
    return SimpleNamespace(distributed_type=DistributedType.DEEPSPEED,
                           state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=config)))


@pytest.mark.parametrize("name, expected", [("zero2.json", "none"), ("zero3.json", "none"),
                                            ("zero3_offload_optimizer.json", "optimizer"),
                                            ("zero3_offload.json", "params")])
def test_shipped_deepspeed_configs(name, expected):
    assert detect_offload(_ds(json.loads((DS / name).read_text()))) == expected


def test_deepspeed_param_offload_alone_is_refused():
    config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                                    "offload_optimizer": {"device": "none"}}}
    with pytest.raises(ValueError, match="offload_optimizer"):
        detect_offload(_ds(config))


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("offload", [False, True])
def test_fsdp_plugin(version, offload):
    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, cpu_offload=offload)
    acc = SimpleNamespace(distributed_type=DistributedType.FSDP, state=SimpleNamespace(fsdp_plugin=plugin))
    assert detect_offload(acc) == ("params" if offload else "none")


def test_other_engines_offload_nothing():
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload=True)  # present but not the engine in use
    for kind in (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.NO):
        acc = SimpleNamespace(distributed_type=kind, state=SimpleNamespace(fsdp_plugin=plugin))
        assert detect_offload(acc) == "none"


def test_the_fit_check_prices_the_engines_offload(monkeypatch):
    """check_device_row_fits asks the memory model about the offload the accelerator's engine runs (unless told)."""
    import torch

    import hf_hsap.memory.advice as advice
    from hf_hsap.integrations.memory_fit import check_device_row_fits

    seen = []
    monkeypatch.setattr(advice, "check_row_fits", lambda *a, **kw: seen.append(kw["offload"]))
    acc = _ds(json.loads((DS / "zero3_offload_optimizer.json").read_text()))
    acc.device, acc.num_processes = torch.device("cpu"), 2
    sp = SimpleNamespace(size=2, ulysses_size=1)
    config = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    for told in (None, "params"):
        check_device_row_fits(acc, config, 1024, memory_gib=8.0, sp=sp, levers=None, offload=told,
                              host_memory_gib=64.0, footprint_gib=1.0)
    assert seen == ["optimizer", "params"]


def test_pinned_offload_buffers_are_read_from_the_engine():
    """The shipped DeepSpeed offload configs pin their buffers; DeepSpeed's own default and pin_memory: false do not
    (then the fit check prices the buffers at their bytes, not rounded up to powers of two)."""
    from hf_hsap.integrations.memory_fit import detect_offload_pinned

    shipped = json.loads((DS / "zero3_offload_optimizer.json").read_text())
    assert detect_offload_pinned(_ds(shipped)) is True
    unpinned = json.loads(json.dumps(shipped))
    unpinned["zero_optimization"]["offload_optimizer"]["pin_memory"] = False
    assert detect_offload_pinned(_ds(unpinned)) is False
    unpinned["zero_optimization"]["offload_optimizer"].pop("pin_memory")  # DeepSpeed's default: false
    assert detect_offload_pinned(_ds(unpinned)) is False
    from torch.distributed.fsdp import CPUOffloadPolicy

    for pin in (True, False):
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_offload=CPUOffloadPolicy(pin_memory=pin))
        acc = SimpleNamespace(distributed_type=DistributedType.FSDP, state=SimpleNamespace(fsdp_plugin=plugin))
        assert detect_offload_pinned(acc) is pin


def test_the_fit_check_prices_unpinned_buffers_at_their_bytes(monkeypatch):
    import torch

    import hf_hsap.memory.advice as advice
    from hf_hsap.integrations.memory_fit import check_device_row_fits

    seen = []
    monkeypatch.setattr(advice, "check_row_fits", lambda *a, **kw: seen.append(kw.get("pinned_round_limit_mb")))
    config = json.loads((DS / "zero3_offload_optimizer.json").read_text())
    sp = SimpleNamespace(size=2, ulysses_size=1, gpus_per_node=2)
    for pin, expected in ((True, None), (False, 0)):
        config["zero_optimization"]["offload_optimizer"]["pin_memory"] = pin
        acc = _ds(config)
        acc.device, acc.num_processes = torch.device("cpu"), 2
        check_device_row_fits(acc, SimpleNamespace(), 4096, memory_gib=80.0, sp=sp, levers=None,
                              host_memory_gib=100.0, footprint_gib=1.0)
        assert seen[-1] == expected
