"""CUDA checks for a lent GPU: ``bash scripts/gpu_check.sh`` runs this file (CI has no GPU and never
collects it: the name does not match ``test_*.py``). References: float64 (the model: float32 eager).

1. The CUDA kernels (flash-attn or PyTorch's varlen flash in bf16/fp16, math in fp32) on the segment
   shapes the runtime issues (causal squares, full rectangles, bottom-right causal with fewer queries
   than keys), and on edge shapes (queries that see no key, empty segments).
2. The whole SAP runtime of a plan on one GPU (``run_plan_loopback``: one thread per part), bf16,
   with Llama-like heads, with and without a receive budget.
3. A small Llama with ``attn_implementation="hsap"`` under bf16 autocast against its documents run alone.
4. Sliding windows, soft-capping, both, and attention sinks on every CUDA kernel available (flash-attn when
   installed, PyTorch's varlen flash, the math kernel in fp32): forward out / lse and dq / dk / dv against
   the float64 reference; PyTorch's varlen flash refuses a softcap (and windows, where its op has none)
   with the fix in the message.

``HSAP_CHECK_DEVICE=cpu`` runs the same checks on CPU (a dry run of their logic).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import hf_hsap
from hf_hsap.loopback import run_plan_loopback
from hf_hsap.kernels import (MathKernel, VarlenSpec, reference_attention, reference_varlen_attention, select_kernel,
                             varlen_attention)
from hf_hsap.testing import check_kernel_against_reference
from helpers import rel_err

DEV = torch.device(os.environ.get("HSAP_CHECK_DEVICE", "cuda"))  # "cpu": dry run of these checks' logic
if DEV.type == "cuda" and not torch.cuda.is_available():
    raise SystemExit("tests/cuda/check_cuda.py needs a CUDA device (run scripts/gpu_check.sh on a GPU machine)")
RUNTIME_SHAPES = [(37, 37), (1024, 1024), (300, 300), (65, 200), (128, 257), (1, 9), (513, 2000)]
EDGE_SHAPES = [(200, 65), (9, 1), (16, 16), (0, 5), (5, 0)]


def _check_kernel(kernel, dtype: torch.dtype, shapes, causal: bool, tol: float) -> None:
    check_kernel_against_reference(kernel, dtype, shapes, causal, tol, device=DEV, heads=(8, 2, 128), scale=0.09,
                                   seed=11)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_kernel_runtime_shapes(dtype: torch.dtype, causal: bool) -> None:
    _check_kernel(select_kernel(DEV, dtype), dtype, RUNTIME_SHAPES, causal, 2e-2)


def test_math_kernel_fp32_runtime_shapes() -> None:
    _check_kernel(MathKernel(), torch.float32, RUNTIME_SHAPES, True, 1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_flash_kernel_edge_shapes(dtype: torch.dtype) -> None:
    _check_kernel(select_kernel(DEV, dtype), dtype, EDGE_SHAPES, True, 2e-2)


@pytest.mark.parametrize("P,rounds,budget", [(4, "auto", None), (8, "by_peer", None), (8, "batched", 2048)])
def test_sap_runtime_on_one_gpu(P: int, rounds: str, budget: int | None) -> None:
    rng = np.random.default_rng(P)
    lengths = np.concatenate([rng.integers(16, 400, size=20), [3000, 1800]])
    rng.shuffle(lengths)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    T = int(cu[-1])
    plan = hf_hsap.plan_sequence(cu, P, "auto", rounds=rounds, recv_budget_tokens=budget)
    g = torch.Generator(device="cpu").manual_seed(5)
    q, k, v, dout = (torch.randn(T, h, 128, generator=g).to(DEV) for h in (16, 4, 4, 16))
    qr, kr, vr = (x.double().requires_grad_(True) for x in (q, k, v))
    ref_out, ref_lse = reference_attention(qr, kr, vr, torch.from_numpy(cu))
    ref = torch.autograd.grad(ref_out, (qr, kr, vr), dout.double())
    out, lse, dq, dk, dv, stats = run_plan_loopback(plan, *(x.bfloat16() for x in (q, k, v, dout)))
    assert rel_err(lse, ref_lse) < 1e-2
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), (ref_out, *ref)):
        assert rel_err(got, want) < 3e-2, f"{name}: {rel_err(got, want):.2e}"
    assert sum(s.rows_recv for s in stats) > 0


def test_packed_model_matches_documents_alone() -> None:
    """A small Llama with ``attn_implementation="hsap"`` on the device: a packed row's logits and
    parameter gradients against every document run alone with eager attention (float32 math on the
    device, so only the kernels' rounding separates them)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from hf_hsap.integrations import register

    register()
    cfg = LlamaConfig(vocab_size=211, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    eager = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").to(DEV)
    hsap = AutoModelForCausalLM.from_config(cfg, attn_implementation="hsap").to(DEV)
    hsap.load_state_dict(eager.state_dict())
    lens = [1, 70, 300, 5, 1000, 2]
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, 211, (1, sum(lens)), generator=g).to(DEV)
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0).to(DEV)
    w = torch.randn(sum(lens), 211, generator=g).to(DEV)
    pieces, start = [], 0
    for n in lens:
        pieces.append(eager(input_ids=ids[:, start:start + n]).logits)
        start += n
    ref = torch.cat(pieces, dim=1)
    (ref[0] * w).sum().backward()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=DEV.type == "cuda"):
        logits = hsap(input_ids=ids, position_ids=pos).logits  # bf16 attention through the flash kernel
    (logits[0].float() * w).sum().backward()
    assert rel_err(logits.float(), ref) < 5e-2  # bf16 autocast against fp32; a wrong mask is off by O(1)
    grads = dict(eager.named_parameters())
    worst = max(rel_err(p.grad, grads[n].grad) for n, p in hsap.named_parameters())
    assert worst < 1e-1, worst


def test_autocast_reaches_a_flash_kernel() -> None:
    """Under bf16 autocast Transformers hands the attention fp32 q/k and bf16 v: hf_hsap casts them to bf16
    and picks a flash kernel; fp32 outside autocast is refused instead of running the O(N^2) math kernel."""
    from hf_hsap.kernels.cuda import FlashAttnKernel, TorchCUDAFlashKernel
    from hf_hsap.kernels.dtypes import cast_qkv

    q = k = torch.randn(64, 8, 128, device=DEV)
    v = torch.randn(64, 2, 128, device=DEV, dtype=torch.bfloat16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        cq, ck, cv = cast_qkv(q, k, v)
    assert cq.dtype == ck.dtype == cv.dtype == torch.bfloat16
    assert isinstance(select_kernel(DEV, cq.dtype), (FlashAttnKernel, TorchCUDAFlashKernel))
    with pytest.raises(ValueError, match="bf16"):
        select_kernel(DEV, torch.float32)


# ---- 4. windows, softcap, sinks ------------------------------------------------------------------------------
MASK_SHAPES = [(300, 300), (1024, 1024), (65, 200), (128, 257), (1, 9), (200, 65)]
# flash-attn's window_left; 5000 hides nothing in any segment. Causal window 0 (a query sees only itself) has
# dq = dk = 0 exactly, which a relative error cannot measure: its forward is in the unit tests, here 1 instead.
WINDOWS = {True: [1, 63, 255, 5000], False: [0, 1, 63, 255, 5000]}
SOFTCAP = 2.0  # scores (scale 0.09, D 128, unit inputs) have a std of about 1: the tanh bites


def _flash_kernels(dtype: torch.dtype) -> list:
    """The flash kernels of this device for ``dtype``: flash-attn when installed, PyTorch's varlen flash (on CUDA);
    the CPU kernel in a dry run."""
    if DEV.type != "cuda":
        return [select_kernel(DEV, dtype)]
    from hf_hsap.kernels.cuda import FlashAttnKernel, TorchCUDAFlashKernel

    return ([FlashAttnKernel()] if FlashAttnKernel.available() else []) + [TorchCUDAFlashKernel()]


def _torch_op_has_windows() -> bool:
    from hf_hsap.kernels.cuda import _has_window_args

    return all(_has_window_args(op) for op in (torch.ops.aten._flash_attention_forward,
                                               torch.ops.aten._flash_attention_backward))


def _masked_check(kernel, dtype: torch.dtype, shapes, causal: bool, window: int | None, softcap: float | None,
                  tol: float) -> None:
    """``check_kernel_against_reference`` with a window (flash-attn's ``window_left``) and a softcap."""
    g = torch.Generator().manual_seed(13)
    spec = VarlenSpec.from_lengths([a for a, _ in shapes], [b for _, b in shapes], causal, window)
    q, dout = (torch.randn(spec.total_q, 8, 128, generator=g).to(DEV) for _ in range(2))
    k, v = (torch.randn(spec.total_k, 2, 128, generator=g).to(DEV) for _ in range(2))
    qr, kr, vr = (x.double().requires_grad_(True) for x in (q, k, v))
    ref_out, ref_lse = reference_varlen_attention(qr, kr, vr, spec, 0.09, softcap=softcap)
    ref = torch.autograd.grad(ref_out, (qr, kr, vr), dout.double())
    q, k, v, dout = (x.to(dtype) for x in (q, k, v, dout))
    kw = {} if softcap is None else {"softcap": softcap}
    out, lse = kernel.forward(q, k, v, spec, 0.09, **kw)
    grads = kernel.backward(dout, q, k, v, out, lse, spec=spec, scale=0.09, **kw)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), seen), "rows that see no key must have an infinite lse, the others finite"
    assert not bool(out[~seen].abs().any()), "rows that see no key must have output 0"
    label = f"{kernel.name} causal={causal} window={window} softcap={softcap}"
    assert rel_err(lse[seen], ref_lse[seen]) < tol, f"{label} lse: {rel_err(lse[seen], ref_lse[seen]):.2e}"
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref_out, *ref)):
        err = rel_err(got, want)
        assert got.dtype == dtype and err < tol, f"{label} {name}: {err:.2e}"


@pytest.mark.parametrize("causal", [True, False])
def test_flash_kernels_windows(causal: bool) -> None:
    for kernel in _flash_kernels(torch.bfloat16):
        if kernel.name == "torch-cuda-flash" and not _torch_op_has_windows():
            with pytest.raises(ValueError, match="no sliding windows"):
                _masked_check(kernel, torch.bfloat16, MASK_SHAPES, causal, 63, None, 2e-2)
            continue
        for window in WINDOWS[causal]:
            _masked_check(kernel, torch.bfloat16, MASK_SHAPES, causal, window, None, 2e-2)


@pytest.mark.parametrize("window", [None, 63])
def test_flash_kernels_softcap(window: int | None) -> None:
    """flash-attn soft-caps (alone and with a window); PyTorch's varlen flash refuses with the fix."""
    for kernel in _flash_kernels(torch.bfloat16):
        if kernel.name == "torch-cuda-flash":
            with pytest.raises(ValueError, match="flash-attn >= 2.7.*prefer='math'"):
                _masked_check(kernel, torch.bfloat16, MASK_SHAPES, True, window, SOFTCAP, 2e-2)
            continue
        for causal in (True, False):
            _masked_check(kernel, torch.bfloat16, MASK_SHAPES, causal, window, SOFTCAP, 2e-2)


def test_math_kernel_fp32_windows_and_softcap() -> None:
    for window, softcap in ((63, None), (None, SOFTCAP), (1, SOFTCAP)):
        _masked_check(MathKernel(), torch.float32, MASK_SHAPES, True, window, softcap, 1e-4)


@pytest.mark.parametrize("window,softcap", [(None, None), (100, None), (100, SOFTCAP)])
def test_sinks_on_every_kernel(window: int | None, softcap: float | None) -> None:
    """``varlen_attention`` with sinks (GPT-OSS): out and the gradients of q, k, v and the sinks against the
    float64 reference (sinks as an extra softmax column), on every kernel that runs the mask."""
    lens = [1, 300, 17, 1000, 64]
    cu = np.concatenate([[0], np.cumsum(lens)]).tolist()
    g = torch.Generator().manual_seed(21)
    q, dout = (torch.randn(cu[-1], 8, 128, generator=g).to(DEV) for _ in range(2))
    k, v = (torch.randn(cu[-1], 2, 128, generator=g).to(DEV) for _ in range(2))
    sinks = torch.linspace(-2.0, 3.0, 8).to(DEV)
    leaves = [x.double().requires_grad_(True) for x in (q, k, v, sinks)]
    ref_out, _ = reference_attention(*leaves[:3], cu, 0.09, window=window, softcap=softcap, sinks=leaves[3])
    ref = torch.autograd.grad(ref_out, leaves, dout.double())
    kernels = [(kn, torch.bfloat16, 3e-2) for kn in _flash_kernels(torch.bfloat16)] + [(MathKernel(), torch.float32,
                                                                                         1e-4)]
    for kernel, dtype, tol in kernels:
        if kernel.name == "torch-cuda-flash" and (softcap is not None or (window is not None
                                                                          and not _torch_op_has_windows())):
            continue  # refused (tested above)
        got = [x.to(dtype).requires_grad_(True) for x in (q, k, v)] + [sinks.clone().requires_grad_(True)]
        out = varlen_attention(*got[:3], cu, None, True, softmax_scale=0.09, kernel=kernel, window=window,
                               softcap=softcap, sinks=got[3])
        grads = torch.autograd.grad(out, got, dout.to(dtype))
        assert rel_err(out, ref_out) < tol, f"{kernel.name} out: {rel_err(out, ref_out):.2e}"
        for name, gr, want in zip(("dq", "dk", "dv", "dsinks"), grads, ref):
            assert rel_err(gr, want) < tol, f"{kernel.name} {name}: {rel_err(gr, want):.2e}"
