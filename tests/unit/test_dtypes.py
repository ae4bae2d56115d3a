"""The dtype the attention runs in (attention_dtype / cast_qkv), the "hsap" attention of a Llama model under
CPU bf16 autocast against SDPA, and select_kernel's refusal of fp32 on CUDA."""
from __future__ import annotations

import sys

import pytest
import torch

from hf_hsap.kernels import MathKernel
from hf_hsap.kernels.cpu import TorchCPUFlashKernel
from hf_hsap.kernels.dtypes import attention_dtype, cast_qkv
from hf_hsap.kernels.select import select_kernel


def _qkv(*dtypes: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 3, 5, 4, generator=g).to(d) for d in dtypes)


# ------------------------------------------------------------------------------------------- attention_dtype
def test_autocast_fp32_qk_bf16_v_runs_in_bf16() -> None:
    q, k, v = _qkv(torch.float32, torch.float32, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attention_dtype(q, k, v) == torch.bfloat16
        cq, ck, cv = cast_qkv(q, k, v)
    assert cq.dtype == ck.dtype == cv.dtype == torch.bfloat16
    assert cv.data_ptr() == v.data_ptr()  # v was already there: not copied
    assert torch.equal(cq, q.to(torch.bfloat16)) and torch.equal(ck, k.to(torch.bfloat16))


def test_autocast_casts_float32_down_and_leaves_float64() -> None:
    q, k, v = _qkv(torch.float64, torch.float32, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attention_dtype(q, k, v) == torch.float64  # autocast (and SDPA under it) leave float64 alone
        assert attention_dtype(*_qkv(torch.float32, torch.float32, torch.float32)) == torch.bfloat16
        assert attention_dtype(*_qkv(torch.float32, torch.float32, torch.bfloat16)) == torch.bfloat16
        # as wide as the autocast dtype (fp16 vs bf16): left alone
        assert attention_dtype(*_qkv(torch.float16, torch.float16, torch.float16)) == torch.float16
        # integers are not floating point: promoted as usual
        ints = tuple(torch.ones(2, 3, dtype=torch.int64) for _ in range(3))
        assert attention_dtype(*ints) == torch.int64


def test_without_autocast_mixed_dtypes_promote() -> None:
    q, k, v = _qkv(torch.float32, torch.float32, torch.bfloat16)
    assert not torch.is_autocast_enabled("cpu")
    assert attention_dtype(q, k, v) == torch.float32
    cq, ck, cv = cast_qkv(q, k, v)
    assert cq.dtype == ck.dtype == cv.dtype == torch.float32
    assert cq.data_ptr() == q.data_ptr() and ck.data_ptr() == k.data_ptr() and cv.data_ptr() != v.data_ptr()
    assert torch.equal(cv, v.float())  # exact: bf16 -> fp32
    assert attention_dtype(*_qkv(torch.bfloat16, torch.float16, torch.bfloat16)) == torch.float32
    assert attention_dtype(*_qkv(torch.float64, torch.float32, torch.bfloat16)) == torch.float64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_equal_dtypes_are_untouched(dtype: torch.dtype) -> None:
    q, k, v = _qkv(dtype, dtype, dtype)
    assert attention_dtype(q, k, v) == dtype
    out = cast_qkv(q, k, v)
    assert all(a is b for a, b in zip(out, (q, k, v)))  # no copies, the same tensors


def test_autocast_bf16_inputs_untouched() -> None:
    q, k, v = _qkv(torch.bfloat16, torch.bfloat16, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = cast_qkv(q, k, v)
    assert all(a is b for a, b in zip(out, (q, k, v)))


def test_cast_is_differentiable() -> None:
    q, k = (x.requires_grad_(True) for x in _qkv(torch.float32, torch.float32))
    (v,) = _qkv(torch.bfloat16)
    v.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cq, ck, cv = cast_qkv(q, k, v)
    (cq.float().sum() + 2 * ck.float().sum() + 3 * cv.float().sum()).backward()
    assert q.grad.dtype == torch.float32 and bool((q.grad == 1).all())
    assert k.grad.dtype == torch.float32 and bool((k.grad == 2).all())
    assert v.grad.dtype == torch.bfloat16 and bool((v.grad == 3).all())


# ------------------------------------------------------------------------------------------- model level
VOCAB = 97
DOC_LENS = [5, 17, 3, 30, 9, 1]  # 65 tokens, 6 documents


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    """The same random tiny Llama (GQA) loaded with attn_implementation "hsap" and "sdpa"."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from hf_hsap.integrations import register

    assert register() == "hsap"
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0,
                         eos_token_id=None, bos_token_id=None, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).float().save_pretrained(path)
    hsap = AutoModelForCausalLM.from_pretrained(path, attn_implementation="hsap", dtype=torch.float32)
    sdpa = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32)
    assert hsap.config._attn_implementation == "hsap" and sdpa.config._attn_implementation == "sdpa"
    return hsap.train(), sdpa.train()


def _packed_row() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (1, sum(DOC_LENS)), generator=g)
    pos = torch.cat([torch.arange(n) for n in DOC_LENS]).unsqueeze(0)  # restarts at every document
    return ids, pos


def test_hsap_under_bf16_autocast_matches_sdpa_and_backward_runs(llama_pair) -> None:
    hsap, sdpa = llama_pair
    ids, pos = _packed_row()
    hsap.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # used to raise "expected scalar type Float but found BFloat16" (fp32 q, k with bf16 v)
        logits = hsap(input_ids=ids, position_ids=pos, use_cache=False).logits
        with torch.no_grad():
            packed = sdpa(input_ids=ids, position_ids=pos, use_cache=False).logits  # document mask from positions
            causal = sdpa(input_ids=ids, use_cache=False).logits  # one causal row: documents see each other
    assert logits.dtype == packed.dtype == torch.bfloat16 and logits.shape == (1, sum(DOC_LENS), VOCAB)
    scale = float(packed.float().abs().max())
    diff = float((logits.detach().float() - packed.float()).abs().max()) / scale
    wrong_mask = float((causal.float() - packed.float()).abs().max()) / scale
    # measured: diff ~2.4e-3 (bf16 rounding of a few ops in another order), wrong_mask ~0.7
    assert diff < 2e-2, diff
    assert wrong_mask > 0.2, wrong_mask  # a document mask that leaked would be this far off
    assert float((logits.detach().float() - causal.float()).abs().max()) / scale > 0.2
    # the first document sees the same tokens either way: there even the causal row must agree
    first = DOC_LENS[0]
    assert float((causal[0, :first].float() - packed[0, :first].float()).abs().max()) / scale < 2e-2
    w = torch.randn(logits.shape[-2:], generator=torch.Generator().manual_seed(2))
    (logits[0].float() * w).sum().backward()
    grads = [p.grad for p in hsap.parameters()]
    assert all(g is not None for g in grads)
    assert all(g.dtype == torch.float32 and bool(torch.isfinite(g).all()) for g in grads)
    assert any(float(g.abs().max()) > 0 for g in grads)
    attn_grads = [p.grad for n, p in hsap.named_parameters() if "self_attn" in n and "q_proj" in n]
    assert len(attn_grads) == 2 and all(float(g.abs().max()) > 0 for g in attn_grads)


def test_hsap_under_bf16_autocast_with_cu_seq_lens(llama_pair) -> None:
    """The same row described by cu_seq_lens (the flash-attention keywords) instead of position_ids."""
    hsap, sdpa = llama_pair
    ids, pos = _packed_row()
    cu = torch.tensor([0, *torch.tensor(DOC_LENS).cumsum(0).tolist()], dtype=torch.int32)
    n = max(DOC_LENS)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        a = hsap(input_ids=ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=n,
                 max_length_k=n, use_cache=False).logits
        b = hsap(input_ids=ids, position_ids=pos, use_cache=False).logits
        ref = sdpa(input_ids=ids, position_ids=pos, use_cache=False).logits
    assert a.dtype == torch.bfloat16
    assert float((a.float() - b.float()).abs().max()) / float(b.float().abs().max()) < 1e-2
    assert float((a.float() - ref.float()).abs().max()) / float(ref.float().abs().max()) < 2e-2


# ------------------------------------------------------------------------------------------- select_kernel
def test_select_kernel_refuses_fp32_on_cuda_before_any_cuda_import(monkeypatch) -> None:
    # a None entry makes `from .cuda import ...` raise ImportError: a ValueError proves the raise comes first
    monkeypatch.setitem(sys.modules, "hf_hsap.kernels.cuda", None)
    for dtype in (torch.float32, torch.float64):
        with pytest.raises(ValueError, match="bf16") as err:
            select_kernel(torch.device("cuda"), dtype)
        assert str(dtype) in str(err.value) and "prefer='math'" in str(err.value)
    with pytest.raises(ValueError, match="bf16"):
        select_kernel("cuda:0", torch.float32)
    with pytest.raises(ImportError):  # the bf16 path does import the CUDA kernels (proves the patch bites)
        select_kernel(torch.device("cuda"), torch.bfloat16)


def test_select_kernel_prefer_math_and_cpu_choices() -> None:
    assert isinstance(select_kernel(torch.device("cuda"), torch.float32, prefer="math"), MathKernel)
    assert isinstance(select_kernel("cpu", torch.float32, prefer="math"), MathKernel)
    assert isinstance(select_kernel("cpu", torch.bfloat16), TorchCPUFlashKernel)
    assert isinstance(select_kernel("cpu", torch.float32), TorchCPUFlashKernel)
    assert isinstance(select_kernel("cpu", torch.float16), MathKernel)
    with pytest.raises(ValueError, match="unknown kernel 'fast'"):
        select_kernel("cpu", torch.float32, prefer="fast")
