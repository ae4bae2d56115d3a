"""Running the multimodal zoo harness (``vlm_zoo.py``) for one family: its spec, the reference (each document alone,
which is also the refusal's fix: one document per row), the one-process mode and the SP modes on a reused pool of
spawned gloo ranks (``zoo_run.PoolManager``: replaced after a timeout or ranks that failed unevenly)."""
from __future__ import annotations

import time
from typing import Any

import torch

import hf_hsap
from workers import vlm_zoo as VZ
from workers import vlm_zoo_configs as VC
from workers import vlm_zoo_docs as VD
from workers import zoo
from workers.zoo_run import PoolManager

__all__ = ["PoolManager", "run_family", "run_sp_jobs"]

TASK_TIMEOUT_S = 150.0  # one family's SP jobs of one pool task (the per-family cap on the pool)


def run_sp_jobs(pools: PoolManager, family: str, state: dict[str, torch.Tensor], docs: list[dict[str, Any]],
                jobs: list[tuple[str, str]], timeout_s: float = TASK_TIMEOUT_S) -> dict[tuple[str, str], Any]:
    """Every job's per-rank records (:func:`vlm_zoo.worker_jobs`), or one error record when none came back (the text
    zoo's pool logic, :meth:`PoolManager.run_jobs`).

    Args:
        pools: the pool manager; family, state, docs: the model and its documents; jobs: ``(how, mode)`` pairs;
        timeout_s: of the pool task running all the jobs.

    Returns:
        ``{job: [record of rank 0, ...]}`` or ``{job: {"outcome", "error"}}``.
    """
    return pools.run_jobs(family, state, jobs, timeout_s, worker=VZ.worker_jobs, extra=(docs,))


def _safe(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or the classified exception (``{"outcome", "error", "traceback"}``)."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        return zoo.classify(e)


def _modes(config: Any, modes: tuple[str, ...]) -> tuple[str, ...]:
    """The modes whose Ulysses degree divides the text model's query and KV heads."""
    text = config.get_text_config()
    heads = [int(getattr(text, n, 0) or 0) for n in ("num_attention_heads", "num_key_value_heads")]
    return tuple(m for m in modes if all(h % VZ.MODES[m][1] == 0 for h in heads if h))


def _run_modes(family: str, how: str, config: Any, state: dict[str, torch.Tensor], docs: list[dict[str, Any]],
               ref: dict[str, Any], modes: tuple[str, ...], pools: PoolManager | None, tol: float) -> dict[str, Any]:
    """``{mode: outcome}`` of one spec (``how``) in every mode (SP modes only with ``pools``; a probe whose ``sp1``
    failed does not run them: they fail the same way, after its peers' communication timeouts)."""
    out: dict[str, Any] = {}
    if "sp1" in modes:
        got = _safe(VZ.packed_run, family, state, docs, how, "sp1")
        out["sp1"] = VZ.combine(ref, [{"ok": True, **got}], tol) if "index" in got else got
        if how != "library" and out["sp1"]["outcome"] in ("refused", "crash"):
            return out
    jobs = [(how, m) for m in modes if m in VZ.SP_MODES]
    if jobs and pools is not None:
        for (_, mode), got in run_sp_jobs(pools, family, state, docs, jobs).items():
            out[mode] = got if isinstance(got, dict) else _safe(VZ.combine, ref, got, tol)
    for res in out.values():
        res.pop("traceback", None)
    return out


def _fix(rec: dict[str, Any], docs: list[dict[str, Any]] | None, ref: dict[str, Any] | None) -> bool | str:
    """Whether the fix a refusal names works: one document per row (what the reference runs, with SDPA as the
    message says), or "no vision spec" (``PackingCollator(max_length)`` alone on the documents).

    Returns:
        ``True``, or what failed (``"not checked: ..."`` when there are no documents to try it on).
    """
    if docs is None:
        return f"not checked: {rec['documents']}"
    if "PackingCollator(max_length) alone" in rec.get("spec", {}).get("error", ""):
        try:
            hf_hsap.PackingCollator(sum(d["input_ids"].numel() for d in docs))(docs)
            return True
        except Exception as e:  # noqa: BLE001
            return f"PackingCollator(max_length) alone refuses the documents: {VC.first_line(e)}"
    if ref is None:
        return f"not checked: the documents alone failed ({rec['reference']})"
    named = "eager" if "attn_implementation='eager'" in rec.get("spec", {}).get("error", "") else "sdpa"
    if rec["reference"] != named:
        return f"the message names attn_implementation='{named}', but one document per row runs with " \
               f"'{rec['reference']}'"
    return True


def run_family(family: str, pools: PoolManager | None, modes: tuple[str, ...] = tuple(VZ.MODES),
               probe: bool = True) -> dict[str, Any]:
    """All outcomes of one family.

    Args:
        family: a model type; pools: where the SP modes run (``None``: ``sp1`` only); modes: which to run;
        probe: for a family ``vision_spec`` refuses, run the modes with the spec it would get if listed
            (``vlm_zoo.probe_kind``).

    Returns:
        ``{"family", "section" ("image-text" | "audio-text"), "status" ("run" | "not buildable"), "reason", "params", "spec": {"outcome": "accepted" |
        "refused" | "crash", "error"}, "documents" (None or why none were made), "reference" (the attention of
        the documents-alone runs), "fix" (the refusal's fix works: True / why not, :func:`_fix`),
        "native" (Transformers' own packed row), "tol", "results": {mode: outcome} (accepted), "probe": {"spec",
        "results" | "skipped"} (refused, ``probe``), "seconds"}``.
    """
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"family": family, "status": "run", "results": {}, "tol": VZ.tolerance(family),
                           "section": "audio-text" if family in VC.audio_families() else "image-text"}
    try:
        config = VC.tiny_config(family)
        rec["reference"] = VZ.reference_attention(config)
        model = VC.build_model(config, rec["reference"], VZ.DTYPE)
    except Exception as e:  # noqa: BLE001 - any failure means "cannot be built"
        reason = str(e) if isinstance(e, VC.NotBuildable) else zoo.classify(e)["error"]
        return {**rec, "status": "not buildable", "reason": reason, "seconds": time.perf_counter() - t0}
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rec["params"] = sum(p.numel() for p in model.parameters())
    try:
        VZ.make_spec(model, "library")
        rec["spec"] = {"outcome": "accepted"}
    except Exception as e:  # noqa: BLE001
        res = zoo.classify(e)  # a refusal's message whole (classify keeps 300 characters): the table shows its fix
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}" if res["outcome"] == "refused" else res["error"]
        rec["spec"] = {"outcome": res["outcome"] if isinstance(e, ValueError) else "crash", "error": error}
    accepted = rec["spec"]["outcome"] == "accepted"
    try:
        docs = VD.documents(config, model)
        rec["documents"] = None
    except Exception as e:  # noqa: BLE001
        rec["documents"] = str(e) if isinstance(e, VC.NotBuildable) else zoo.classify(e)["error"]
        docs = None
    ref = None
    if docs is not None:
        ref = _safe(VZ.documents_alone, config, state, docs, rec["reference"])
        if "outcome" in ref:  # the documents alone failed
            ref = None
    rec["fix"] = _fix(rec, docs, ref)
    modes = _modes(config, modes)
    how = "library" if accepted else None
    if probe and rec["spec"]["outcome"] == "refused":
        how = VZ.probe_kind(model, docs or [])
        rec["probe"] = {"spec": how}
    if how is not None and ref is not None:
        got = _safe(VZ.native_run, config, state, docs, how, rec["reference"])
        rec["native"] = VZ.compare(ref, [got], VZ.TOL) if "index" in got else got
        rec["native"].pop("traceback", None)
        rec["tol"] = VZ.tolerance(family, rec["native"])
        out = _run_modes(family, how, config, state, docs, ref, modes, pools, rec["tol"])
    elif how is not None:
        out = {m: {"outcome": "crash", "error": f"no reference: {rec['documents'] or 'the documents alone failed'}"}
               for m in modes}
    if how == "library":
        rec["results"] = out
    elif how is not None:
        rec["probe"]["results"] = out if ref is not None else {}
        if ref is None:
            rec["probe"]["skipped"] = f"no reference: {rec['documents'] or 'the documents alone failed'}"
    rec["seconds"] = time.perf_counter() - t0
    return rec
