"""Functions run on every spawned gloo rank by :mod:`benchmarks.peers` (importable by the child processes).

The schemes put beside hf_hsap, every one over hf_hsap's CPU kernel (:class:`~hf_hsap.kernels.TorchCPUFlashKernel`
varlen calls with a :class:`~hf_hsap.kernels.VarlenSpec`, through the differentiable
:func:`hf_hsap.varlen_attention`), so a ratio shows the schedule, not the kernel:

* ``hsap``: :func:`hf_hsap.hsap_attn_func` with ``ulysses_size="per_batch"`` (the row runs at the Ulysses degree,
  1 to ``P``, that the cost model prices fastest), placement auto, the cost model measured on these ranks
  (:func:`benchmarks.suites.cpu_calibration.cpu_cost_model`; :func:`benchmarks.suites.cpu_workers._hsap_runner`).
* ``hsap_flat``: the same at ``U = 1`` (flat SAP, what ``hsap`` ran before the per-batch degree).
* ``hsap_ulysses``: hf_hsap's own Ulysses baseline (:class:`benchmarks.suites.cpu_baselines.UlyssesAttention`,
  explicit forward / backward calls).
* ``deepspeed_ulysses``: DeepSpeed's ``deepspeed.sequence.layer.DistributedAttention`` (its all-to-alls,
  its autograd), seq-first ``[s/P, 1, H, D]`` inputs, around a local attention module that runs the kernel
  over the whole row with the document mask (varlen over ``cu_seqlens``). It asserts key/value heads
  ``>= P``, so with fewer key/value heads they are repeated (``repeat_interleave``, gradients summed back
  by autograd) to ``lcm(Hkv, P)`` before the call, as hf_hsap's Ulysses baseline does.
* ``alst``: DeepSpeed's Arctic Long Sequence Training attention,
  ``deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF``, called as Transformers calls an
  attention function (``[1, H, s/P, D]``, ``position_ids``); it gathers the position ids, replicates key/value
  heads itself when ``Hkv < P``, and the wrapped attention function reads the documents from the gathered
  position ids (as Transformers' flash-attention path does) and runs the kernel varlen over them.

Every scheme is first checked against a float64 reference of the whole row computed without sequence
parallelism (:func:`reference_row`); nothing is kept between tasks.
"""
from __future__ import annotations

import ctypes
import gc
import math
import time
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

import hf_hsap
from hf_hsap.kernels import TorchCPUFlashKernel
from hf_hsap.testing import rel_err

from ..analytic.peers import DEEPSPEED_SCHEMES
from .cpu_calibration import cpu_cost_model, measure_cpu_figures
from .cpu_workers import _baseline_runner, _hsap_runner, _reset_peak, _Runner, _status_kb
from ..tensor_memory import TensorPeak

SCHEMES = ("hsap", "hsap_flat", "hsap_ulysses") + DEEPSPEED_SCHEMES
TENSORS = ("out", "dq", "dk", "dv")


# ----------------------------------------------------------------------------- DeepSpeed
def _ds_comm() -> None:
    """DeepSpeed's communication layer over the default (gloo) group the pool already initialised."""
    import deepspeed
    import deepspeed.comm as ds_dist

    if not ds_dist.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo", verbose=False)


def probe_peers() -> dict:
    """What this rank can run: the DeepSpeed version, and per DeepSpeed scheme ``"ok"`` or why not.

    Returns:
        ``{"deepspeed": version or None, "deepspeed_ulysses": str, "alst": str, "init_s": float}``.
    """
    out = {"deepspeed": None, "deepspeed_ulysses": "DeepSpeed is not installed", "alst": "DeepSpeed is not installed",
           "init_s": 0.0}
    try:
        import deepspeed
    except Exception as e:  # noqa: BLE001 - reported, not raised
        out["deepspeed_ulysses"] = out["alst"] = f"import deepspeed: {type(e).__name__}: {e}"[:300]
        return out
    out["deepspeed"] = deepspeed.__version__
    t0 = time.perf_counter()
    try:
        _ds_comm()
    except Exception as e:  # noqa: BLE001
        out["deepspeed_ulysses"] = out["alst"] = f"deepspeed.init_distributed: {type(e).__name__}: {e}"[:300]
        return out
    out["init_s"] = time.perf_counter() - t0
    for name, mod, cls in (("deepspeed_ulysses", "deepspeed.sequence.layer", "DistributedAttention"),
                           ("alst", "deepspeed.runtime.sequence_parallel.ulysses_sp", "UlyssesSPAttentionHF")):
        try:
            getattr(__import__(mod, fromlist=[cls]), cls)
            out[name] = "ok"
        except Exception as e:  # noqa: BLE001
            out[name] = f"{mod}.{cls}: {type(e).__name__}: {e}"[:300]
    return out


def _contiguous(T: int) -> tuple[int, int]:
    """This rank's contiguous shard ``[lo, hi)`` of a row of ``T`` tokens (DeepSpeed needs equal shards)."""
    P, r = dist.get_world_size(), dist.get_rank()
    if T % P:
        raise ValueError(f"DeepSpeed's sequence parallelism needs T divisible by the world size ({T} % {P})")
    return r * T // P, (r + 1) * T // P


def _ds_ulysses_runner(cu: list[int], q, k, v, dout, kernel, scale: float) -> _Runner:
    from deepspeed.sequence.layer import DistributedAttention

    P = dist.get_world_size()
    lo, hi = _contiguous(cu[-1])
    cut = tuple(int(x) for x in cu)
    hkv = k.shape[1]
    rep = math.lcm(hkv, P) // hkv if hkv % P else 1  # DistributedAttention asserts kv heads >= P

    class _Local(torch.nn.Module):
        """The local attention: the whole row, ``H / P`` heads, document mask. ``[T, 1, h, D]`` in and out."""

        def forward(self, ql, kl, vl, cu_row):
            o = hf_hsap.varlen_attention(ql[:, 0], kl[:, 0], vl[:, 0], cu_row, cu_row, True, softmax_scale=scale,
                                         kernel=kernel)
            return o.unsqueeze(1)

    attn = DistributedAttention(_Local(), dist.group.WORLD, scatter_idx=2, gather_idx=0)
    idx = torch.arange(lo, hi, dtype=torch.int64)
    ql, kl, vl, dl = (x[lo:hi].clone() for x in (q, k, v, dout))

    def fn():
        a, b, c = (x.detach().requires_grad_(True) for x in (ql, kl, vl))
        kk, vv = (b.repeat_interleave(rep, 1), c.repeat_interleave(rep, 1)) if rep > 1 else (b, c)
        out = attn(a.unsqueeze(1), kk.unsqueeze(1), vv.unsqueeze(1), 1, None, cut).squeeze(1)  # batch dim 1
        out.backward(dl)
        return out.detach(), a.grad, b.grad, c.grad

    return _Runner(idx, fn, lambda: 0, {"kv_repeat": rep})


def _alst_runner(cu: list[int], q, k, v, dout, kernel, scale: float) -> _Runner:
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    T = int(cu[-1])
    lo, hi = _contiguous(T)
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]

    def core_attn(module, qh, kh, vh, attention_mask, *args, position_ids=None, **kwargs):
        """A Transformers attention function: ``[1, h, T, D]`` in, ``([1, T, h, D], None)`` out; the documents
        come from the gathered position ids."""
        cu_row = hf_hsap.cu_seqlens_from_position_ids(position_ids)
        o = hf_hsap.varlen_attention(qh[0].transpose(0, 1), kh[0].transpose(0, 1), vh[0].transpose(0, 1),
                                     cu_row, cu_row, True, softmax_scale=scale, kernel=kernel)
        return o.unsqueeze(0), None

    attn = UlyssesSPAttentionHF(core_attn, batch_size=1, attn_head_count=hq, attn_head_size=d, kv_head_count=hkv,
                                num_hidden_layers=1, process_group=dist.group.WORLD, local_seq_length=hi - lo,
                                global_seq_length=T)
    module = torch.nn.Module()  # the attention layer Transformers passes (ALST reads .training, sets a field)
    starts = np.repeat(np.asarray(cu[:-1]), np.diff(cu))  # [T] start of each token's document
    pos = torch.from_numpy(np.arange(T) - starts)[lo:hi].unsqueeze(0)  # [1, s/P] packed position ids
    idx = torch.arange(lo, hi, dtype=torch.int64)
    ql, kl, vl, dl = (x[lo:hi].clone() for x in (q, k, v, dout))

    def fn():
        a, b, c = (x.detach().requires_grad_(True) for x in (ql, kl, vl))
        o, _ = attn(module, *(x.transpose(0, 1).unsqueeze(0) for x in (a, b, c)), None, position_ids=pos)
        out = o.reshape(hi - lo, hq, d)  # [1, s/P, Hq * D] -> [s/P, Hq, D]
        out.backward(dl)
        return out.detach(), a.grad, b.grad, c.grad

    return _Runner(idx, fn, lambda: 0, {"kv_replication": attn.kv_replication_factor})


# ----------------------------------------------------------------------------- reference and check
def reference_row(cu: list[int], q, k, v, dout) -> tuple[torch.Tensor, ...]:
    """Out, dq, dk, dv of the whole row in float64, without sequence parallelism.

    Heads are independent, so the ranks share the work by query heads (rank ``r`` computes heads ``r, r + P,
    ...`` against their key/value heads, one whole-row varlen call in float64 with PyTorch's CPU flash op, no
    halving); the results are summed over the group. A collective: every rank calls it.

    Returns:
        ``(out [T, Hq, D], dq [T, Hq, D], dk [T, Hkv, D], dv [T, Hkv, D])`` float64, on every rank.
    """
    T, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    heads = list(range(dist.get_rank(), hq, dist.get_world_size()))
    full = [torch.zeros(T, hq, d, dtype=torch.float64) for _ in range(4)]  # out, dq, dk per q head, dv per q head
    if heads:
        h = torch.tensor(heads)
        kv = h // g  # the key/value head of each query head
        a = q.index_select(1, h).double().requires_grad_(True)
        b = k.index_select(1, kv).double().requires_grad_(True)
        c = v.index_select(1, kv).double().requires_grad_(True)
        kernel = TorchCPUFlashKernel(block=0, few_heads_block=0)  # one op call per document
        out = hf_hsap.varlen_attention(a, b, c, cu, cu, True, softmax_scale=d ** -0.5, kernel=kernel)
        out.backward(dout.index_select(1, h).double())
        for f, x in zip(full, (out.detach(), a.grad, b.grad, c.grad)):
            f[:, h] = x
    for f in full:
        dist.all_reduce(f)
    out, dq, dk_q, dv_q = full
    return out, dq, dk_q.view(T, hkv, g, d).sum(2), dv_q.view(T, hkv, g, d).sum(2)


def scheme_errors(res, ref, idx: torch.Tensor) -> dict[str, float]:
    """Relative errors of this rank's rows of ``res`` (out, dq, dk, dv) against the global reference: max
    abs difference over the max magnitude of the whole reference tensor (:func:`hf_hsap.testing.rel_err`)."""
    return {n: rel_err(x, r.index_select(0, idx), scale=r) for n, x, r in zip(TENSORS, res, ref)}


def _group_max(errs: dict[str, float]) -> dict[str, float]:
    t = torch.tensor([errs[n] for n in TENSORS], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {n: float(x) for n, x in zip(TENSORS, t)}


def _runners(cu: list[int], names: tuple[str, ...], q, k, v, dout, figures: dict[str, float]) -> dict[str, _Runner]:
    kernel, scale = TorchCPUFlashKernel(), q.shape[2] ** -0.5
    cost = cpu_cost_model(q.shape[1], k.shape[1], q.shape[2], figures)
    makers: dict[str, Callable[[], _Runner]] = {
        "hsap": lambda: _hsap_runner(cu, "per_batch", q, k, v, dout, cost)[0],
        "hsap_flat": lambda: _hsap_runner(cu, 1, q, k, v, dout, cost)[0],
        "hsap_ulysses": lambda: _baseline_runner("ulysses", np.asarray(cu), q, k, v, dout, kernel, scale),
        "deepspeed_ulysses": lambda: _ds_ulysses_runner(cu, q, k, v, dout, kernel, scale),
        "alst": lambda: _alst_runner(cu, q, k, v, dout, kernel, scale),
    }
    if any(n in DEEPSPEED_SCHEMES for n in names):
        _ds_comm()
    return {n: makers[n]() for n in names}


def _inputs(cu: list[int], hq: int, hkv: int, d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(cu[-1], h, d, generator=g) for h in (hq, hkv, hkv, hq))  # q, k, v, dout (float32)


# ----------------------------------------------------------------------------- tasks
def calibration_task(hq: int, hkv: int, d: int) -> dict[str, float]:
    """The CPU figures of the cost model hf_hsap plans with (:func:`benchmarks.suites.cpu_calibration.measure_cpu_figures`;
    the same on every rank)."""
    torch.set_num_threads(1)
    return measure_cpu_figures(hq, hkv, d)


def peers_task(cu: list[int], hq: int, hkv: int, d: int, seed: int, reps: int, names: tuple[str, ...],
               tol: float, figures: dict[str, float]) -> dict:
    """Check every scheme against the float64 reference, then time ``reps`` interleaved rounds.

    The check run is the warm-up. A scheme whose group-wide largest error (any of out, dq, dk, dv) is not
    below ``tol`` is not timed. Each round times every checked scheme once, ``dist.barrier()`` before and
    after, ``time.perf_counter`` (and ``time.process_time``, this process's CPU time); round ``i`` starts at
    scheme ``i mod n`` (rotated order, so no scheme always runs first or after the same one).

    Args:
        cu: ``[n_docs + 1]`` document boundaries; hq, hkv, d: heads, head dim; seed: of the float32 inputs
        (identical on every rank); reps: timed rounds; names: schemes (:data:`SCHEMES`); tol: largest error;
        figures: :func:`calibration_task`'s (hf_hsap's cost model).

    Returns:
        ``{"rank", "times": {name: [s, ...]}, "cpu": {name: [s, ...]}, "errors": {name: {tensor: err}},
        "exact": {name: bool}, "info": {name: dict}, "check_s": float}``.
    """
    torch.set_num_threads(1)
    q, k, v, dout = _inputs(cu, hq, hkv, d, seed)
    runners = _runners(cu, names, q, k, v, dout, figures)
    t0 = time.perf_counter()
    ref = reference_row(cu, q, k, v, dout)
    errors, exact = {}, {}
    for name, r in runners.items():
        res = r.run()
        errors[name] = _group_max(scheme_errors(res, ref, r.indices))
        exact[name] = max(errors[name].values()) < tol
        del res
    check_s = time.perf_counter() - t0
    del ref
    gc.collect()
    timed = [n for n in runners if exact[n]]
    times: dict[str, list[float]] = {n: [] for n in timed}
    cpu: dict[str, list[float]] = {n: [] for n in timed}
    for i in range(reps):
        order = timed[i % len(timed):] + timed[:i % len(timed)] if timed else []
        for name in order:
            dist.barrier()
            t1, c1 = time.perf_counter(), time.process_time()
            runners[name].run()
            c2 = time.process_time()
            dist.barrier()
            times[name].append(time.perf_counter() - t1)
            cpu[name].append(c2 - c1)
    return {"rank": dist.get_rank(), "times": times, "cpu": cpu, "errors": errors, "exact": exact,
            "info": {n: r.info for n, r in runners.items()}, "check_s": check_s}


def track_malloc(on: bool = True) -> bool:
    """Make this process's resident set follow its live memory: glibc serves every block of 64 KiB or more by
    ``mmap`` (returned at ``free``) and trims the heap top at once (``mallopt``; the memory runs of
    :func:`benchmarks.suites.measured.run_memory` set the same through the environment). Run after the timed rounds:
    it lasts until ``track_malloc(False)``, which puts back glibc's initial thresholds (128 KiB both; glibc's
    dynamic raising of them stays off). Returns whether both settings took."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    mmap_at, trim_at = (65536, 0) if on else (128 * 1024, 128 * 1024)
    ok = libc.mallopt(M_MMAP_THRESHOLD, mmap_at) == 1 and libc.mallopt(M_TRIM_THRESHOLD, trim_at) == 1
    libc.malloc_trim(0)
    return ok


MEMORY_ROUNDS = 3  # measured steps per scheme (the median is reported; one step alone varies by a few MiB)


def _step_peak(r: _Runner, libc) -> tuple[int, bool]:
    """Resident-set growth (bytes) of one step of ``r`` over the RSS just before it (``VmHWM`` reset after a
    collection and a trim, the ranks in step), and whether the reset took."""
    gc.collect()
    libc.malloc_trim(0)
    dist.barrier()
    rss0 = _status_kb("VmRSS")
    reset = _reset_peak()
    res = r.run()
    peak = (_status_kb("VmHWM") - rss0) * 1024
    del res
    dist.barrier()
    return peak, reset


def peers_memory_task(cu: list[int], hq: int, hkv: int, d: int, seed: int, names: tuple[str, ...],
                      figures: dict[str, float], rounds: int = MEMORY_ROUNDS) -> dict:
    """Peak resident memory of one forward + backward of every scheme on this rank (run after
    :func:`track_malloc`). Inputs and each scheme's own shards exist before. Every scheme first runs one
    unmeasured step (what a first call does once, a plan's schedule or a library's lazy set-up, is no step's
    memory), then ``rounds`` measured steps in interleaved rounds (rotated order, as :func:`peers_task` times);
    a step's figure is its peak minus the RSS just before (``VmHWM`` reset), the result the median over rounds.
    One step alone moves by a few MiB with the heap's state (the order of the schemes, what the process ran
    before), about the gap between two schemes that hold the same tensors. Then one more step per scheme under
    :class:`~benchmarks.tensor_memory.TensorPeak`: the exact peak of the tensors the step allocates (inputs and
    shards excluded), free of the heap's noise.

    Returns:
        ``{"rank", "peak_delta_bytes": {name: int} (median over rounds), "peak_rounds_bytes": {name: [int]},
        "peak_reset": bool, "tensor_peak_bytes": {name: int}}``.
    """
    torch.set_num_threads(1)
    q, k, v, dout = _inputs(cu, hq, hkv, d, seed)
    runners = _runners(cu, names, q, k, v, dout, figures)
    libc = ctypes.CDLL("libc.so.6")
    for r in runners.values():
        r.run()  # the warm-up step (its result is dropped at once)
    order = list(runners)
    peaks: dict[str, list[int]] = {n: [] for n in order}
    reset = True
    for i in range(rounds):
        for name in order[i % len(order):] + order[:i % len(order)]:
            peak, ok = _step_peak(runners[name], libc)
            peaks[name].append(peak)
            reset = reset and ok
    tensors = {}
    for name in order:  # exact and deterministic: one step each, after the resident-set rounds (it is slow)
        dist.barrier()
        with TensorPeak() as m:
            res = runners[name].run()
        del res
        tensors[name] = m.peak_bytes
    return {"rank": dist.get_rank(), "peak_delta_bytes": {n: int(np.median(p)) for n, p in peaks.items()},
            "peak_rounds_bytes": peaks, "peak_reset": reset, "tensor_peak_bytes": tensors}
