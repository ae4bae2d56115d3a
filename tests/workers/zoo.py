"""Model-zoo conformance harness: every causal-LM family of Transformers under ``attn_implementation="hsap"``.

One packed row of :data:`DOC_LENS` documents is run by a family's tiny model (``zoo_configs.py``) in each
mode of :data:`SP1_MODES` (one process) and :data:`SP_MODES` (spawned gloo ranks, ``zoo_run.py``), in
float32 and float64, and compared with the same weights in float64 with eager attention, each document run
alone (:func:`reference`). Outcome of each (family, dtype, mode): ``exact`` (logits, loss and every gradient
within :data:`TOL`), ``refused`` (hf_hsap raised on purpose), ``crash`` (any other exception) or ``WRONG``.
"""
from __future__ import annotations

import contextlib
import os
import re
import traceback
from typing import Any, Iterator

import torch
import torch.nn.functional as F

import hf_hsap
from hf_hsap.testing import rel_err
from workers import zoo_configs as ZC

DOC_LENS = [7, 30, 1, 19, 15]  # 72 tokens: 30 > 72 / 4 (one document longer than a shard at SP 4)
SP1_MODES = ("sp1", "sp1_shard")  # model(input_ids, position_ids, labels) / through shard_batch(batch, 1)
SP_MODES = {"sp2_u1": (2, 1), "sp2_u2": (2, 2), "sp4_u1": (4, 1), "sp4_u2": (4, 2)}  # (SP size, Ulysses size)
MODES = SP1_MODES + tuple(SP_MODES)
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
TOL = {"fp32": 1e-4, "fp64": 1e-9}  # relative to the reference's largest magnitude
# Transformers' causal-LM loss is a float32 cross-entropy (ForCausalLMLoss upcasts with .float(), which rounds
# float64 logits): the reference does the same, so gradients agree to float64 precision, but the loss value only
# to float32 rounding of its sum (taken in another order)
LOSS_TOL = 1e-6
GRAD_FLOOR = 1e-3  # a gradient is compared relative to at least GRAD_FLOOR x the model's largest gradient
SP_TIMEOUT_S = 30.0  # hf_hsap's communication timeout in the worker ranks (a stalled peer raises)
HSAP_DIR = os.path.dirname(os.path.abspath(hf_hsap.__file__))
_GROUPS: dict = {}  # per-process SP groups of the worker ranks


def global_batch(vocab: int = ZC.VOCAB, lens: list[int] = DOC_LENS, seed: int = 1) -> dict[str, torch.Tensor]:
    """The packed row: ``input_ids``, ``position_ids`` (restarting at 0) and ``labels`` (-100 at starts), ``[1, T]``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (1, sum(lens)), generator=g)
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)
    labels = ids.clone()
    labels[pos == 0] = -100  # the shifted target of a document's last token is the next start: none
    return {"input_ids": ids, "position_ids": pos, "labels": labels}


def loss_weights(total: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Fixed ``[T, V]`` weights of the per-token term ``sum(w * logits)`` added to the loss."""
    return torch.randn(total, vocab, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(dtype)


@contextlib.contextmanager
def full_precision_softmax() -> Iterator[None]:
    """Inside: a float64 softmax asked for in a lower precision (eager attention's and MoE routers'
    ``dtype=torch.float32``) stays float64, so float64 runs are float64 throughout. Every run (reference, eager /
    SDPA, hsap) is made inside it; float32 runs are unaffected (hf_hsap's kernels ask no softmax dtype)."""
    saved = F.softmax, torch.softmax, torch.Tensor.softmax

    def wrap(fn: Any) -> Any:
        def softmax(x: torch.Tensor, *args: Any, dtype: torch.dtype | None = None, **kw: Any) -> torch.Tensor:
            if dtype is not None and x.dtype == torch.float64 and dtype != torch.float64:
                dtype = None
            return fn(x, *args, dtype=dtype, **kw)
        return softmax

    F.softmax, torch.softmax, torch.Tensor.softmax = (wrap(f) for f in saved)  # type: ignore[assignment]
    try:
        yield
    finally:
        F.softmax, torch.softmax, torch.Tensor.softmax = saved  # type: ignore[assignment]


@contextlib.contextmanager
def float64_casts_kept(on: bool = True) -> Iterator[None]:
    """Inside (``on``): a float64 tensor cast to float32 (``.float()``, ``.to`` / ``.type(torch.float32)``, a
    ``torch.zeros_like(x, dtype=torch.float32)`` accumulator) stays float64, and a float32 tensor ``@`` such a kept
    one is computed in float64.

    The recurrent kernels of hybrid models (the gated delta rule, Mamba's scans) compute in float32 on purpose;
    inside this a float64 run of them is float64 throughout, so the reference and hf_hsap's run, which cuts the same
    kernels at other places, agree to float64 precision rather than to float32 rounding. Float32 runs are
    unaffected."""
    if not on:
        yield
        return
    saved_to, saved_float, saved_type = torch.Tensor.to, torch.Tensor.float, torch.Tensor.type

    def to(self: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        if self.dtype == torch.float64:
            args = tuple(torch.float64 if a is torch.float32 else a for a in args)
            if kw.get("dtype") is torch.float32:
                kw["dtype"] = torch.float64
        return saved_to(self, *args, **kw)

    def flt(self: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        return self if self.dtype == torch.float64 else saved_float(self, *args, **kw)

    def typ(self: torch.Tensor, *args: Any, **kw: Any) -> Any:
        if self.dtype == torch.float64 and (args[:1] == (torch.float32,) or kw.get("dtype") is torch.float32):
            return self
        return saved_type(self, *args, **kw)

    saved_zeros_like = torch.zeros_like

    def zeros_like(x: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:  # a float32 accumulator (Inkling 2's MoE)
        if x.dtype == torch.float64 and kw.get("dtype") is torch.float32:
            kw["dtype"] = torch.float64
        return saved_zeros_like(x, *args, **kw)

    saved_matmul = torch.Tensor.__matmul__

    def matmul(self: torch.Tensor, other: Any) -> torch.Tensor:  # float32 weights @ a kept float64 (SigLIP 2's resize)
        if torch.is_tensor(other) and {self.dtype, other.dtype} == {torch.float32, torch.float64}:
            self, other = self.double(), other.double()
        return saved_matmul(self, other)

    torch.Tensor.to, torch.Tensor.float, torch.Tensor.type = to, flt, typ  # type: ignore[method-assign]
    torch.zeros_like = zeros_like  # type: ignore[assignment]
    torch.Tensor.__matmul__ = matmul  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.float, torch.Tensor.type = saved_to, saved_float, saved_type  # type: ignore
        torch.zeros_like = saved_zeros_like  # type: ignore[assignment]
        torch.Tensor.__matmul__ = saved_matmul  # type: ignore[method-assign]



def hybrid(config: Any) -> bool:
    """Whether the family has recurrent token mixers (linear attention, SSM, short convolutions)."""
    return hf_hsap.integrations.model_check.has_mixer_layers(config)


DEFAULT_DTYPE_FAMILIES = frozenset({"kosmos-2"})  # float64 runs need float64 as the default dtype (full_precision)


@contextlib.contextmanager
def full_precision(config: Any, dtype: torch.dtype = torch.float64) -> Iterator[None]:
    """:func:`full_precision_softmax`, and for hybrid models in float64 :func:`float64_casts_kept` with float64 as the
    default dtype (the decay tables MiniMax computes at construction: float32 ones make its block and recurrent paths
    agree to float32 rounding only); the same for indexed-attention models (DeepSeek-sparse: their MoE router and
    indexer score in float32, whose rounding differs between the packed row's and a document's matrix shapes)."""
    hybrid_fp64 = (hybrid(config) or hf_hsap.integrations.indexed.has_indexed_layers(config)) and dtype == torch.float64
    saved = torch.get_default_dtype()
    # Kosmos-2's text transformer fills its own causal mask with finfo(dtype).min in the default dtype: a float64 run
    # of it needs float64 as the default (its reference, one document per row, fails otherwise)
    if hybrid_fp64 or dtype == torch.float64 and getattr(config, "model_type", None) in DEFAULT_DTYPE_FAMILIES:
        torch.set_default_dtype(torch.float64)
    try:
        with full_precision_softmax(), float64_casts_kept(hybrid_fp64):
            yield
    finally:
        torch.set_default_dtype(saved)


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient (zeros where autograd left none), detached."""
    return {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in
            model.named_parameters()}


def reference(config: Any, state_dict: dict[str, torch.Tensor], dtype: torch.dtype = torch.float64, *,
              lens: list[int] = DOC_LENS) -> dict[str, Any]:
    """Float64 eager model, each document alone (with the packed row's position_ids, 0.. per document): logits
    ``[T, V]``, loss ``sum(CE) / targets`` and gradients of
    ``loss + sum(w * logits)`` (the cross-entropy in float32, as Transformers computes it: :data:`LOSS_TOL`).

    Args:
        config: the family's tiny config; state_dict: its weights; dtype: float32 for the models that do not run
            in float64. lens: the row's documents.

    Returns:
        ``{"logits", "loss", "grads", "n_items"}``.
    """
    with full_precision(config, dtype):
        model = ZC.build_model(config, "eager", dtype, state_dict=state_dict)
        batch = global_batch(config.get_text_config().vocab_size, lens)
        ids = batch["input_ids"]
        pieces, ce, start = [], 0.0, 0
        for n in lens:
            doc = ids[:, start:start + n]
            pos = torch.arange(n).unsqueeze(0)  # what the packed row gives (RoBERTa's own default starts elsewhere)
            logits = model(input_ids=doc, position_ids=pos, use_cache=False).logits[0]  # [n, V]
            ce = ce + F.cross_entropy(logits[:-1].float(), doc[0, 1:], reduction="sum")  # as ForCausalLMLoss
            pieces.append(logits)
            start += n
        logits = torch.cat(pieces)  # [T, V]
        n_items = ids.numel() - len(lens)
        loss = ce / n_items
        (loss + (logits * loss_weights(ids.numel(), logits.shape[-1], logits.dtype)).sum()).backward()
    return {"logits": logits.detach(), "loss": float(loss.detach()), "grads": _grads(model), "n_items": n_items}


def packed_run(config: Any, state_dict: dict[str, torch.Tensor], attn: str, dtype: torch.dtype,
               via_shard: bool = False) -> dict[str, Any]:
    """One process, the whole packed row: ``model(input_ids, position_ids, labels)`` (or the inputs of
    ``shard_batch(batch, 1)``); logits, the model's loss and gradients of ``loss + sum(w * logits)``.

    Args:
        config, state_dict: the model; attn: ``attn_implementation``; dtype: parameter dtype;
        via_shard: feed ``hf_hsap.shard_batch(batch, 1)`` instead of the plain row (``attn="hsap"`` only).

    Returns:
        ``{"logits" [T, V], "loss", "grads"}``.
    """
    with full_precision(config, dtype):
        return _packed_run(config, state_dict, attn, dtype, via_shard)


def _packed_run(config: Any, state_dict: dict[str, torch.Tensor], attn: str, dtype: torch.dtype,
                via_shard: bool) -> dict[str, Any]:
    if attn == "hsap":  # the user's order: the config before construction, the model after it
        hf_hsap.check_config(config, sp_size=1)
    model = ZC.build_model(config, attn, dtype, state_dict=state_dict)
    if attn == "hsap":
        hf_hsap.prepare_model(model, sp_size=1)
    batch = global_batch(config.get_text_config().vocab_size)
    inputs = hf_hsap.shard_batch(batch, 1) if via_shard else {**batch, "use_cache": False}
    out = model(**inputs)
    if via_shard:
        hf_hsap.check_plan_used(inputs, model)
    logits = out.logits[0]  # [T, V]
    w = loss_weights(logits.shape[0], logits.shape[-1], logits.dtype)
    (out.loss + (logits * w).sum()).backward()
    return {"logits": logits.detach(), "loss": float(out.loss.detach()), "grads": _grads(model)}


def get_sp(sp_size: int, ulysses: int, recurrent_mode: str = "auto") -> Any:
    """This worker process's SP groups for ``(sp_size, ulysses, recurrent_mode)`` (created once; DP over the rest of
    the world)."""
    key = (sp_size, ulysses) if recurrent_mode == "auto" else (sp_size, ulysses, recurrent_mode)
    if key not in _GROUPS:
        _GROUPS[key] = hf_hsap.init_sequence_parallel(hf_hsap.HSAPConfig(
            sp_size=sp_size, ulysses_size=ulysses, timeout_s=SP_TIMEOUT_S, recurrent_mode=recurrent_mode))
    return _GROUPS[key]


def sp_rank_run(config: Any, state_dict: dict[str, torch.Tensor], dtype: torch.dtype, sp_size: int,
                ulysses: int, *, lens: list[int] = DOC_LENS, checkpointing: bool = False,
                placement: str | None = None, recurrent_mode: str = "auto") -> dict[str, Any]:
    """One rank of an SP run: shard the packed row, forward, ``loss + sum(w * logits)`` backward, gradients summed
    over the SP group.

    Args:
        lens: the row's documents. checkpointing: prepare with gradient checkpointing (every layer recomputed in
            the backward, its exchanges too). placement: the plan's placement (default: the group's).
            recurrent_mode: the group's ``HSAPConfig.recurrent_mode``.

    Returns:
        ``{"group", "index" [T_local], "logits" [T_local, V], "loss"}`` and, on SP rank 0, ``"grads"``.
    """
    import torch.distributed as dist

    sp = get_sp(sp_size, ulysses, recurrent_mode)
    a2a_before = sp.comm_stats.a2a_bytes_sent
    hf_hsap.check_config(config, sp_size=sp_size)
    model = ZC.build_model(config, "hsap", dtype, state_dict=state_dict)
    levers = hf_hsap.MemoryLevers(chunked_loss=False, gradient_checkpointing=True) if checkpointing else None
    hf_hsap.prepare_model(model, sp_size=sp_size, levers=levers)
    batch = global_batch(config.get_text_config().vocab_size, lens)
    local = hf_hsap.shard_batch(batch, sp, placement)
    out = model(**local)
    hf_hsap.check_plan_used(local, model)
    idx = local["hsap_plan"].local_token_indices()
    logits = out.logits[0]  # [T_local, V]
    w = loss_weights(batch["input_ids"].numel(), logits.shape[-1], logits.dtype)[idx]
    (out.loss + (logits * w).sum()).backward()
    grads = _grads(model)
    for g in grads.values():
        dist.all_reduce(g, group=sp.group)
    loss = out.loss.detach().clone()
    dist.all_reduce(loss, group=sp.group)
    res = {"group": dist.get_rank() // sp_size, "index": idx, "logits": logits.detach(), "loss": float(loss),
           "a2a_bytes": sp.comm_stats.a2a_bytes_sent - a2a_before}
    if sp.rank == 0:
        res["grads"] = grads
    return res


def worker_sp_modes(family: str, state_dict: dict[str, torch.Tensor], jobs: list[tuple[str, str]]) -> list[dict]:
    """DistPool task: run ``jobs`` (``(dtype, mode)`` of :data:`SP_MODES`) on this rank, one after the other.

    An exception is recorded (:func:`classify`) instead of raised. After each job the ranks compare whether
    they failed; if only some did (their peers may have been left mid-collective), the remaining jobs are not run
    and the last record says ``"dirty": True`` (the caller starts a fresh pool).

    Returns:
        one record per job run: ``{"job", "ok", ...}`` with :func:`sp_rank_run`'s result or the error.
    """
    import torch.distributed as dist

    import transformers

    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()  # config warnings of tiny models, once per rank and job
    config = ZC.tiny_config(family)
    out = []
    for dtype, mode in jobs:
        try:
            with full_precision(config, DTYPES[dtype]):
                res = sp_rank_run(config, state_dict, DTYPES[dtype], *SP_MODES[mode])
            rec = {"job": (dtype, mode), "ok": True, **res}
        except Exception as e:  # noqa: BLE001 - every failure is a result
            rec = {"job": (dtype, mode), "ok": False, **classify(e)}
            sp = _GROUPS.get(SP_MODES[mode])
            if getattr(sp, "pending_plan_use", None) is not None:  # jobs are independent: a failed forward's
                sp.pending_plan_use = None  # unchecked plan record must not fail the group's next shard_batch
        flags: list = [None] * dist.get_world_size()
        dist.all_gather_object(flags, rec["ok"])
        out.append(rec)
        if len(set(flags)) > 1:
            rec["dirty"] = True
            break
    return out


def _hsap_exception(name: str) -> bool:
    """Whether ``name`` is an exception class of hf_hsap's own (``UnsupportedModelError``, ``PlanNotUsedError``)."""
    cls = getattr(hf_hsap.integrations, name, None) or getattr(hf_hsap, name, None)
    return isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__.startswith("hf_hsap")


def _innermost(frames: list[tuple[str, str]], exc_type: str) -> tuple[bool, bool]:
    """Whether the innermost frame (file, source line) is in hf_hsap, and whether it raised on purpose: the line is
    a ``raise`` (as the source reads now) or the exception is one of hf_hsap's own classes."""
    if not frames:
        return False, False
    filename, line = frames[-1]
    inside = os.path.abspath(filename).startswith(HSAP_DIR + os.sep)
    return inside, inside and (line.strip().startswith("raise") or _hsap_exception(exc_type))


def _outcome(exc_type: str, message: str, inside: bool, raised: bool) -> dict[str, str]:
    """``refused`` for a deliberate raise in hf_hsap (not a communication timeout), else ``crash``."""
    first = next((x.strip() for x in message.strip().splitlines() if x.strip()), "")[:300]
    if raised and exc_type != "HSAPCommError":
        return {"outcome": "refused", "error": f"{exc_type}: {first}"}
    where = " (inside hf_hsap)" if inside else ""
    return {"outcome": "crash", "error": f"{exc_type}{where}: {first}"}


def classify(exc: BaseException) -> dict[str, str]:
    """An exception as an outcome: ``refused`` when its innermost frame is a ``raise`` in the hf_hsap package
    (hf_hsap refused on purpose), else ``crash``.

    Returns:
        ``{"outcome", "error"}`` (``"Type: first line of the message"``) plus ``"traceback"`` (last lines).
    """
    frames = [(f.filename, f.line or "") for f in traceback.extract_tb(exc.__traceback__)]
    res = _outcome(type(exc).__name__, str(exc), *_innermost(frames, type(exc).__name__))
    res["traceback"] = "".join(traceback.format_exception(exc)[-4:])[-1500:]
    return res


_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in .*\n(.*)$', re.M)


def classify_traceback(text: str) -> dict[str, str]:
    """:func:`classify` for the text of one rank's traceback (as DistPool's RuntimeError reports it)."""
    frames = [(m.group(1), m.group(2)) for m in _FRAME.finditer(text)]
    last = [x for x in text.strip().splitlines() if x.strip() and not x.startswith(" ")]
    head = last[-1] if last else "Error: ?"
    exc_type, _, message = head.partition(": ")
    exc_type = exc_type.split(".")[-1]
    return {**_outcome(exc_type, message, *_innermost(frames, exc_type)), "traceback": text[-1500:]}


def compare(ref: dict[str, Any], logits: torch.Tensor, loss: float, grads: dict[str, torch.Tensor],
            tol: float) -> dict[str, Any]:
    """``exact`` or ``WRONG`` of one run against the reference.

    Returns:
        ``{"outcome", "err": {"logits", "loss", "grads", "worst_grad"}}`` (relative errors).
    """
    floor = GRAD_FLOOR * max(float(g.abs().max()) for g in ref["grads"].values())
    g_err = {n: rel_err(grads[n], g, floor=floor) if n in grads else float("inf") for n, g in ref["grads"].items()}
    worst = max(g_err, key=g_err.get) if g_err else ""
    err = {"logits": rel_err(logits, ref["logits"]), "loss": abs(loss - ref["loss"]) / max(abs(ref["loss"]), 1e-300),
           "grads": g_err.get(worst, 0.0), "worst_grad": worst}
    ok = max(err["logits"], err["grads"]) <= tol and err["loss"] <= max(tol, LOSS_TOL)
    return {"outcome": "exact" if ok else "WRONG", "err": err}


def combine_sp(ref: dict[str, Any], records: list[dict], sp_size: int, tol: float) -> dict[str, Any]:
    """The outcome of one SP job from every rank's record: the first refusal or crash (a root cause, not a
    communication timeout of its peers), else each SP group's logits (in global order), loss and gradients
    compared with the reference (the worst group)."""
    failed = [r for r in records if not r["ok"]]
    if failed:
        root = [r for r in failed if "HSAPCommError" not in r["error"]] or failed
        pick = next((r for r in root if r["outcome"] == "refused"), root[0])
        res = {k: pick[k] for k in ("outcome", "error", "traceback")}
        if len(failed) < len(records):
            res["error"] += f" (on {len(failed)} of {len(records)} ranks)"
        return res
    worst: dict[str, Any] = {"outcome": "exact"}
    for g in sorted({r["group"] for r in records}):
        group = [r for r in records if r["group"] == g]
        logits = torch.full(ref["logits"].shape, float("nan"), dtype=torch.float64)
        for r in group:
            logits[r["index"]] = r["logits"].double()
        grads = next(r["grads"] for r in group if "grads" in r)
        res = compare(ref, logits, group[0]["loss"], grads, tol)
        if worst["outcome"] == "exact":
            worst = res
    return worst
