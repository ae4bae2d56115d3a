"""Chunked attention (Llama 4's ``chunked_attention`` layers) on packed rows under SP: a chunked layer runs the plan
whose documents are its chunks (chunk bounds at document-relative multiples of ``attention_chunk_size``, as for each
document alone). Checked at the plan level (the whole SAP runtime in one process against a dense float64 mask built
from Transformers' rule) and on a tiny Llama 4 text model at SP 2 (a 29-token document over 8-token chunks split
across the ranks): logits, loss and every parameter gradient against each document alone, float64.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import rel_err

import hf_hsap
from hf_hsap.loopback import run_plan_loopback
from hf_hsap.plan.chunks import chunk_layout, chunked_plan
from hf_hsap.plan.layout import make_layout
from workers import chunked as W

TIMEOUT_S = 300
TOL = 1e-10  # float64


def _dense_chunked(q, k, v, positions: torch.Tensor, doc: torch.Tensor, chunk: int):
    """Float64 reference: causal attention where a query sees the keys of its document and chunk
    (``pos // chunk`` equal: ``masking_utils``' ``chunked_overlay`` on packed positions). Returns ``(out, lse)``."""
    T, hq, d = q.shape
    rep = hq // k.shape[1]
    i = torch.arange(T)
    same_chunk = positions[:, None] // chunk == positions[None] // chunk
    mask = (doc[:, None] == doc[None]) & (i[None] <= i[:, None]) & same_chunk  # [T, T]
    s = torch.einsum("thd,shd->hts", q, k.repeat_interleave(rep, 1)) * d ** -0.5  # [Hq, T, T]
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("hts,shd->thd", s.softmax(-1), v.repeat_interleave(rep, 1)), torch.logsumexp(s, -1).T


def test_chunk_layout_cuts_documents_at_their_own_multiples() -> None:
    layout = make_layout([0, 6, 13, 14])
    assert chunk_layout(layout, 4).cu_seqlens.tolist() == [0, 4, 6, 10, 13, 14]
    # a document continuing from position 3: its first bound at position 4 (offset 1)
    assert chunk_layout(layout, 4, np.array([3, 0, 5])).cu_seqlens.tolist() == [0, 1, 5, 6, 10, 13, 14]
    assert chunk_layout(layout, 7) is layout  # no document crosses a bound


@pytest.mark.parametrize("placement", ["contiguous", "zigzag", "balanced", "auto"])
@pytest.mark.parametrize("first", [None, [3, 0, 0, 6]])
def test_chunked_plan_is_exact_with_documents_split_across_two_ranks(placement: str, first) -> None:
    cu, chunk = [0, 37, 40, 71, 72], 8
    plan = hf_hsap.plan_sequence(torch.tensor(cu), 2, placement)
    chunks = chunked_plan(plan, chunk, None if first is None else np.array(first))
    assert chunks is chunked_plan(plan, chunk, None if first is None else np.array(first))  # cached on the plan
    for r in range(2):  # the same tokens on every rank
        assert torch.equal(chunks.local_token_indices(r), plan.local_token_indices(r))
    T = cu[-1]
    g = torch.Generator().manual_seed(0)
    q, dout = (torch.randn(T, 4, 8, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(T, 2, 8, generator=g, dtype=torch.float64) for _ in range(2))
    out, lse, dq, dk, dv, _ = run_plan_loopback(chunks, q, k, v, dout)
    lengths = np.diff(cu)
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.from_numpy(lengths))
    starts = torch.tensor(first if first is not None else [0] * len(lengths))
    positions = torch.cat([torch.arange(n) + s for n, s in zip(lengths.tolist(), starts.tolist())])
    qr, kr, vr = (x.clone().requires_grad_(True) for x in (q, k, v))
    ref, ref_lse = _dense_chunked(qr, kr, vr, positions, doc, chunk)
    ref.backward(dout)
    for got, want in ((out, ref), (lse, ref_lse), (dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        assert rel_err(got, want.detach()) < TOL
    if placement in ("zigzag", "balanced"):  # the long documents are split: chunks move fewer keys
        assert sum(chunks.stats().recv_kv_tokens) < sum(plan.stats().recv_kv_tokens)


def _documents_alone() -> dict:
    """Each document of :data:`W.LENS` alone through the same float64 model (eager)."""
    model = W.model64()
    model.set_attn_implementation("eager")
    batch = W.packed_row()
    ids = batch["input_ids"]
    pieces, ce, start = [], 0.0, 0
    for n in W.LENS:
        logits = model(input_ids=ids[:, start:start + n], use_cache=False).logits[0]  # [n, V]
        ce = ce + F.cross_entropy(logits[:-1], ids[0, start + 1:start + n], reduction="sum")
        pieces.append(logits)
        start += n
    logits = torch.cat(pieces)  # [T, V]
    loss = ce / (ids.numel() - len(W.LENS))
    (loss + (logits * W.loss_weights(ids.numel())).sum()).backward()
    return {"logits": logits.detach(), "loss": loss.item(),
            "grads": {name: p.grad.clone() for name, p in model.named_parameters()}}


def _check(results: list[dict], ref: dict) -> None:
    logits = torch.full_like(ref["logits"], float("nan"))
    for r in results:
        logits[r["index"]] = r["logits"]
    assert rel_err(logits, ref["logits"]) < TOL  # a token no rank produced stays NaN: fails
    for r in results:
        assert abs(r["loss"] - ref["loss"]) <= TOL * abs(ref["loss"])
        for name, g in ref["grads"].items():
            assert rel_err(r["grads"][name], g) < TOL, name


@pytest.mark.parametrize("ulysses,placement", [(1, "zigzag"), (2, "auto")])
def test_llama4_chunked_layer_under_sp2_matches_documents_alone(ulysses: int, placement: str, pools) -> None:
    results = pools(2, TIMEOUT_S).run(W.sp_run, 2, ulysses, placement)
    _check(results, _documents_alone())
    if ulysses == 1:  # the 29-token document spans both ranks, and the chunk plan moves fewer keys
        assert any(r["split"] for r in results)
        assert sum(r["chunk_recv"] for r in results) < sum(r["recv"] for r in results)
    assert {r["chunk_docs"] for r in results} == {1 + 4 + 1 + 3}  # 5 | 8 8 8 5 | 3 | 8 8 3


def test_llama4_chunks_count_from_a_continued_document_s_positions(pools) -> None:
    """A packed row whose first document continues from position 5: its chunks follow its positions, as
    Transformers' packed mask does (the reference: eager on the whole packed row)."""
    results = pools(2, TIMEOUT_S).run(W.sp_run, 2, 1, "zigzag", 5)
    model = W.model64(tuned=False)
    model.set_attn_implementation("eager")
    batch = W.packed_row(first=5)
    with torch.no_grad():
        ref = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
    logits = torch.full_like(ref, float("nan"))
    for r in results:
        logits[r["index"]] = r["logits"]
    assert rel_err(logits, ref) < TOL
    assert {r["chunk_docs"] for r in results} == {2 + 4 + 1 + 3}  # positions 5 6 7 | 8 9, then as above


def test_llama4_temperature_follows_document_positions_on_one_process() -> None:
    """The NoPE layer's temperature on a packed row in one process (a plain call with ``position_ids``, one with
    ``cu_seq_lens_q``, and through ``shard_batch(batch, 1)``) equals each document alone; a chunked NoPE layer
    whose documents only the mask's ids show (chunks and documents alike) is refused, naming shard_batch."""
    model = W.model64().eval()
    batch = W.packed_row()
    ids, pos = batch["input_ids"], batch["position_ids"]
    cu = torch.tensor([0, *np.cumsum(W.LENS).tolist()], dtype=torch.int32)
    ref = _documents_alone()["logits"]
    with torch.no_grad():
        calls = {"position_ids": model(input_ids=ids, position_ids=pos, use_cache=False),
                 "cu_seq_lens": model(input_ids=ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                      max_length_q=max(W.LENS), max_length_k=max(W.LENS), use_cache=False),
                 "shard_batch": model(**hf_hsap.shard_batch({"input_ids": ids, "position_ids": pos}, 1))}
    for name, out in calls.items():
        assert rel_err(out.logits[0], ref) < TOL, name
    model.config.layer_types = ["chunked_attention", "chunked_attention"]  # the NoPE layer chunked too
    with pytest.raises(hf_hsap.integrations.UnsupportedModelError, match="documents cannot be told from its chunks.*"
                       "shard_batch"):
        model(input_ids=ids, position_ids=pos, use_cache=False)
    with torch.no_grad():  # the fix the message names works
        fixed = model(**hf_hsap.shard_batch({"input_ids": ids, "position_ids": pos}, 1)).logits[0]
        model.set_attn_implementation("eager")
        starts = np.cumsum([0] + W.LENS)
        alone = torch.cat([model(input_ids=ids[:, a:b], use_cache=False).logits[0] for a, b in zip(starts, starts[1:])])
    assert rel_err(fixed, alone) < TOL


def test_image_blocks_in_a_chunked_layer_across_chunks_are_refused() -> None:
    """A chunked layer in a batch with bidirectional image blocks and a document longer than a chunk: refused
    (blocks are kept whole per part, not per chunk); a full layer, or documents within a chunk, run the plan."""
    from hf_hsap.integrations.chunked_attention import layer_plan
    from hf_hsap.plan.blocks import Blocks

    model = W.model64()
    chunked, full = (layer.self_attn for layer in model.model.layers)
    blocks = Blocks(starts=(2,), ends=(6,))
    plan = hf_hsap.plan_sequence(torch.tensor([0, 20, 30]), 2, "zigzag")
    with pytest.raises(hf_hsap.integrations.UnsupportedModelError, match="image blocks across chunks"):
        layer_plan(chunked, plan, blocks=blocks)
    assert layer_plan(full, plan, blocks=blocks) is plan
    short = hf_hsap.plan_sequence(torch.tensor([0, 8, 14]), 2, "zigzag")
    assert layer_plan(chunked, short, blocks=blocks) is short
    assert layer_plan(chunked, plan).layout.cu_seqlens.tolist() == [0, 8, 16, 20, 28, 30]


def test_generation_past_a_chunk_stays_refused() -> None:
    """Generation with a KV cache inside the first chunk runs; past it, it is refused (naming sdpa)."""
    model = W.model64(tuned=False).eval()
    prompt = W.packed_row()["input_ids"][:, :5]
    with torch.no_grad():
        assert model.generate(prompt, max_new_tokens=3, do_sample=False).shape[1] == 8  # 8 tokens: one chunk
        with pytest.raises(hf_hsap.integrations.UnsupportedModelError, match="past the chunk of 8.*sdpa"):
            model.generate(prompt, max_new_tokens=6, do_sample=False)
