"""Offload in the memory model, the host's terms (hf_hsap/memory/host.py), the host's limit beside the device's
(longest_row, hsap-plan --max-length) and the host check before the first step."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hf_hsap.inspect import main as hsap_plan
from hf_hsap.memory import MemoryLevers
from hf_hsap.memory.advice import MEMORY_MODELS, check_row_fits
from hf_hsap.memory.fit import longest_row
from hf_hsap.memory.host import HOST_RESERVE_FRACTION, host_budget_bytes, host_memory, pinned_bytes
from hf_hsap.memory.model import predict_step_memory
from hf_hsap.model_shape import ModelShape

L8 = MEMORY_MODELS["llama-3-8b"]
P = ModelShape.from_config(L8).params
ALL = MemoryLevers(gradient_checkpointing=True, activation_offloading=True, tiled_mlp=True, recompute_norms=True)
GIB = 2**30


def step(offload: str = "none", sharding: str = "zero3", tokens: int = 1 << 20, **kw):
    return predict_step_memory(L8, tokens, world=8, sp_size=8, sharding=sharding, levers=ALL, offload=offload, **kw)


def test_pinned_allocations_round_up_to_a_power_of_two_unless_past_the_limit() -> None:
    assert pinned_bytes(3 * GIB) == 4 * GIB and pinned_bytes(4 * GIB, 3) == 12 * GIB and pinned_bytes(0) == 0
    assert pinned_bytes(3 * GIB, round_limit_mb=1024) == 3 * GIB  # PYTORCH_ALLOC_CONF pinned_max_round_threshold_mb
    assert pinned_bytes(3 * 2**20, round_limit_mb=1024) == 4 * 2**20


def test_offloading_the_optimizer_moves_states_and_gradient_shards_to_the_host() -> None:
    none, opt, params = step(), step("optimizer"), step("params")
    n = P / 8
    assert none.host_terms.keys() == {"activations"} and opt.states == 0 and none.states == pytest.approx(12 * n)
    # DeepSpeed: float32 master + two float32 moments (+ one sub-group's 16-bit copy), two float32 gradient buffers
    assert opt.host_terms["optimizer"] == pytest.approx(12 * n + 2 * min(n, 10**9))
    assert 8 * n <= opt.host_terms["grads"] <= 16 * n and opt.host_terms["params"] == 0
    assert opt.stages["optimizer"] < none.stages["optimizer"] / 5  # the device keeps the 16-bit shard alone
    assert params.weights < opt.weights and params.host_terms["params"] >= 2 * n  # the shard on the host too
    assert params.total < opt.total < none.total and opt.activations == none.activations == 0
    assert none.host == pytest.approx(none.host_terms["activations"]) and opt.host == pytest.approx(
        sum(opt.host_terms.values()))


def test_fsdp2_offloads_the_parameters_with_the_optimizer_and_ddp_none() -> None:
    fsdp = step("params", "fsdp2")
    assert fsdp.states == 0 and fsdp.host_terms["params"] >= 4 * P / 8  # float32 shards (the master weights)
    with pytest.raises(ValueError, match="offload='params'"):
        step("optimizer", "fsdp2")
    with pytest.raises(ValueError, match="needs sharding 'zero3'"):
        step("optimizer", "ddp")


def test_host_memory_per_node_and_on_cpu() -> None:
    m = step("optimizer")
    h = host_memory(m, gpus_per_node=8, footprint_gib=8)
    assert h.per_process == pytest.approx(8 * GIB + m.host) and h.per_node == pytest.approx(8 * h.per_process)
    assert h.cpu_step == 0
    cpu = predict_step_memory(L8, 4096, world=1, sp_size=1, sharding="none", levers=ALL, device="cpu")
    hc = host_memory(cpu, gpus_per_node=1, footprint_gib=1, device="cpu")
    assert cpu.host == 0 and hc.per_process == pytest.approx(GIB + cpu.total)  # every tensor in host memory
    assert host_budget_bytes(2048, gpus_per_node=8) == pytest.approx(2048 * (1 - HOST_RESERVE_FRACTION) * GIB / 8)


def test_longest_row_reports_both_limits_and_the_binding_one() -> None:
    kw = dict(gpus=8, memory_per_gpu_gib=80, levers=ALL, sharding="zero3", offload="optimizer", gpus_per_node=8,
              footprint_gib=8)
    free = longest_row(L8, **kw)
    assert free.host_tokens is None and free.tokens == free.device_tokens
    for host_gib, binds in ((2048, None), (1024, "host"), (10**6, "device")):
        fit = longest_row(L8, host_memory_gib=host_gib, **kw)
        assert fit.device_tokens == free.device_tokens and fit.tokens == min(fit.device_tokens, fit.host_tokens)
        assert binds is None or fit.binds == binds
        budget = host_budget_bytes(host_gib, gpus_per_node=8)
        assert fit.host.per_process <= budget or fit.tokens == 0
        past = host_memory(step("optimizer", tokens=fit.host_tokens + 8), gpus_per_node=8, footprint_gib=8)
        assert past.per_process > budget or fit.host_tokens >= 1 << 39
    assert longest_row(L8, host_memory_gib=1024, **kw).limiting_term.startswith("host: ")


def test_the_host_check_names_what_fixes_it() -> None:
    kw = dict(world=8, sp_size=8, sharding="zero3", levers=ALL, gpus_per_node=8, footprint_gib=8, memory_gib=80)
    tokens = 1 << 21
    host = {o: host_memory(step(o, tokens=tokens), gpus_per_node=8, footprint_gib=8).per_node / GIB
            for o in ("none", "optimizer", "params")}
    assert host["none"] < host["optimizer"] < host["params"]
    check_row_fits(L8, tokens, host_memory_gib=host["params"] / (1 - HOST_RESERVE_FRACTION) + 1, offload="params",
                   **kw)  # fits: no error
    between = (host["optimizer"] + host["params"]) / 2 / (1 - HOST_RESERVE_FRACTION)
    with pytest.raises(ValueError, match=r"of host memory per process .* offload='optimizer'$"):
        check_row_fits(L8, tokens, host_memory_gib=between, offload="params", **kw)
    with pytest.raises(ValueError, match=r"at most [1-9][\d,]+ tokens fit \(host: activations limits it\)"):
        check_row_fits(L8, tokens, host_memory_gib=host["none"] * 0.9, offload="params", **kw)


def test_hsap_plan_max_length_side_by_side(capsys) -> None:
    argv = ["--max-length", "--gpus", "8", "--offload", "optimizer", "--host-memory", "1024", "--gpus-per-node", "8"]
    assert hsap_plan(argv) == 0
    out = capsys.readouterr().out
    fit = longest_row(L8, gpus=8, memory_per_gpu_gib=80, levers=ALL, sharding="zero3", offload="optimizer",
                      host_memory_gib=1024, gpus_per_node=8)
    assert f"device allows {fit.device_tokens:,} tokens; host allows {fit.host_tokens:,} tokens" in out
    assert f"the {fit.binds} binds" in out and "per node" in out and "other offloads: --offload none" in out
    assert hsap_plan(["--max-length", "--sharding", "ddp", "--offload", "params"]) == 2
    with pytest.raises(SystemExit):
        hsap_plan(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--offload", "--host-memory", "--gpus-per-node", "--host-footprint", "--pinned-round-limit-mb"):
        assert flag in text
    assert "less 10% kept for the OS" in text


def test_the_trainers_check_counts_this_machines_processes_and_host(monkeypatch) -> None:
    """On CPU the device is not checked without a budget, but the host is (each process's own footprint measured)."""
    from hf_hsap.integrations.memory_fit import HOST_FLAGS, check_device_row_fits

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    acc = SimpleNamespace(device=torch.device("cpu"), num_processes=2,
                          distributed_type=SimpleNamespace(name="MULTI_CPU"))
    sp = SimpleNamespace(size=2, ulysses_size=1)
    common = dict(memory_gib=None, sp=sp, levers=MemoryLevers(), param_dtype="fp32", compute_dtype="fp32",
                  master_weights=False, spelling=HOST_FLAGS)
    check_device_row_fits(acc, L8, 8192, host_memory_gib=10**4, **common)  # 2 processes: 32 GiB of fp32 weights each
    with pytest.raises(ValueError, match=r"for 2 processes per node.*--hsap_host_memory_gib"):
        check_device_row_fits(acc, L8, 8192, host_memory_gib=64, **common)


def test_the_recipes_host_flag_reaches_the_check(monkeypatch) -> None:
    """recipes/common.py: --host_memory_gib is the node's host memory of the check before the first step."""
    import argparse
    import importlib

    recipes = importlib.import_module("recipes.common")
    parser = argparse.ArgumentParser()
    recipes.add_memory_args(parser)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    acc = SimpleNamespace(device=torch.device("cpu"), num_processes=1, distributed_type=SimpleNamespace(name="NO"),
                          mixed_precision="no")
    sp = SimpleNamespace(size=1, ulysses_size=1)
    args = parser.parse_args(["--host_memory_gib", "1"])
    args.max_length, args.recv_budget_tokens = 8192, None
    with pytest.raises(ValueError, match=r"needs about .* of host memory per process.*\(--host_memory_gib\)"):
        recipes.check_row_fits(args, L8, sp, acc)  # 32 GiB of fp32 weights alone
    args = parser.parse_args(["--host_memory_gib", "1000"])
    args.max_length, args.recv_budget_tokens = 8192, None
    recipes.check_row_fits(args, L8, sp, acc)
