"""Running the model-zoo harness (``zoo.py``) for one family: reference, one-process modes, and the SP modes on a
pool of spawned gloo ranks that is replaced whenever a task leaves it in doubt (timeout, ranks that failed
unevenly, a rank that died)."""
from __future__ import annotations

import re
import time
from typing import Any

import torch

from hf_hsap.testing import DistPool, DistPools
from workers import zoo
from workers import zoo_configs as ZC

WORLD = 4  # SP 2 runs as DP 2 x SP 2
TASK_TIMEOUT_S = 240.0  # one family's SP jobs of one pool task
JOB_TIMEOUT_S = 120.0  # one job alone (after a task timed out)
FLOAT32_ISLAND = 1e-5  # float64 errors below this come from float32 steps inside the model (see fp64_tolerance)


class PoolManager:
    """The :class:`~hf_hsap.testing.DistPool` of :data:`WORLD` ranks of a :class:`~hf_hsap.testing.DistPools`,
    started on first use and replaced after a failure.

    Args:
        world: its ranks; pools: where the pool comes from, e.g. the tests' session-wide ``pools`` fixture (a
            pool this manager kills is replaced there too); ``None``: pools of its own, stopped by :meth:`close`.
    """

    def __init__(self, world: int = WORLD, pools: DistPools | None = None) -> None:
        self.world = world
        self._own = pools is None
        self.pools = DistPools(pg_timeout_s=60) if pools is None else pools
        self.pool: DistPool | None = None
        self.restarts = 0

    def _get(self, timeout_s: float) -> DistPool:
        self.pool = self.pools.get(self.world, timeout_s)  # a fresh pool when the last one ended
        return self.pool

    def restart(self) -> None:
        """Drop the current pool (killing its ranks); the next task starts a fresh one."""
        if self.pool is not None:
            self.pool.close(force=True)
            self.pool = None
            self.restarts += 1

    def close(self) -> None:
        """Stop the pools' ranks if they are this manager's own (a shared ``pools`` is its owner's to close)."""
        if self._own:
            self.pools.close()
        self.pool = None

    def run_jobs(self, family: str, state_dict: dict[str, torch.Tensor], jobs: list[tuple[str, str]],
                 timeout_s: float = TASK_TIMEOUT_S, worker: Any = None, extra: tuple = ()
                 ) -> dict[tuple[str, str], Any]:
        """Every job's per-rank records (``worker``, default :func:`zoo.worker_sp_modes`), or one error record
        when none came back.

        Args:
            family: the model type; state_dict: the weights; jobs: ``(dtype, mode)`` pairs (or what ``worker``
            takes); timeout_s: of the pool task running all the jobs; worker: ``worker(family, state_dict, *extra,
            jobs)`` on every rank, returning one record per job; extra: its other arguments.

        Returns:
            ``{job: [record of rank 0, ...]}`` or ``{job: {"outcome", "error", ...}}``.
        """
        results: dict[tuple[str, str], Any] = {}
        remaining = list(jobs)
        while remaining:
            try:
                per_rank = self._get(timeout_s).run(worker or zoo.worker_sp_modes, family, state_dict, *extra,
                                                    remaining)
            except TimeoutError:
                self.pool = None  # DistPool closed it
                self.restarts += 1
                if len(remaining) == 1 or timeout_s <= JOB_TIMEOUT_S:
                    error = f"timeout: no result within {timeout_s:.0f} s"
                    results[remaining[0]] = {"outcome": "crash", "error": error}
                    remaining = remaining[1:]
                else:
                    for job in remaining:
                        results.update(self.run_jobs(family, state_dict, [job], JOB_TIMEOUT_S, worker, extra))
                    remaining = []
                continue
            except RuntimeError as e:  # a rank raised outside the per-job records
                first = _rank_tracebacks(str(e))
                res = zoo.classify_traceback(first) if first else {"outcome": "crash", "error": str(e)[:300]}
                results.update({job: res for job in remaining})
                self.restart()
                break
            done = min(len(r) for r in per_rank)
            for i in range(done):
                results[remaining[i]] = [r[i] for r in per_rank]
            if any(r[done - 1].get("dirty") for r in per_rank):
                self.restart()
            remaining = remaining[done:]
        return results


def _rank_tracebacks(text: str) -> str:
    """The first rank's traceback in DistPool's ``--- rank N ---`` report."""
    parts = re.split(r"^--- rank \d+ ---$", text, flags=re.M)
    return parts[1].strip() if len(parts) > 1 else ""


def _safe(fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``fn(*args)``'s outcome dict, or the classified exception."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        return zoo.classify(e)


def fp64_tolerance(sanity: dict[str, dict[str, Any]]) -> float:
    """The float64 tolerance of a family: :data:`zoo.TOL` ``["fp64"]``, or 10x the larger error of Transformers' own
    packed-row runs (eager and SDPA, no hf_hsap) when that is above it but at float32 rounding level (below
    :data:`FLOAT32_ISLAND`): the model computes parts in float32 (e.g. a router, RoPE, or CodeGen's / GPT-J's
    attention inputs on the attention-interface path), whose results depend on the shapes of the matrix products
    (each document alone vs the packed row). SDPA counts too: hf_hsap runs the attention-interface path, whose
    float32 steps the eager path may not take (CodeGen: eager matches each document alone exactly where SDPA and
    hf_hsap differ by the same 1e-9)."""
    floors = [max(r["err"]["logits"], r["err"]["grads"]) for r in sanity.values()
              if r.get("outcome") == "WRONG" and r.get("err")]
    floor = max(floors, default=0.0)
    return 10 * floor if zoo.TOL["fp64"] < floor < FLOAT32_ISLAND else zoo.TOL["fp64"]


def run_family(family: str, pools: PoolManager | None, dtypes: tuple[str, ...] = tuple(zoo.DTYPES),
               modes: tuple[str, ...] = zoo.MODES, sanity: bool = True) -> dict[str, Any]:
    """All outcomes of one family.

    Args:
        family: a model type; pools: where the SP modes run (``None``: one-process modes only);
        dtypes / modes: which to run; sanity: also run eager and SDPA on the packed row (float64).

    Returns:
        ``{"family", "status" ("run" | "not buildable" | "reference failed"), "reason", "layers", "params",
        "results": {dtype: {mode: {"outcome", "error" | "err"}}}, "sanity": {attn: outcome}, "seconds"}`` and
        ``"fp64_tol"`` where :func:`fp64_tolerance` raised it, ``"fp64_skipped"`` (the error) where the model does
        not run in float64 (then the reference and the sanity runs are float32).
    """
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"family": family, "status": "run", "results": {}, "sanity": {}}
    try:
        config = ZC.tiny_config(family)
        # a hybrid's weights and buffers (MiniMax's decay tables) are made in float64: the runs load them
        draw = torch.float64 if zoo.hybrid(config) else torch.float32
        model = ZC.build_model(config, "eager", draw, draw=draw)
    except ZC.NotBuildable as e:
        return {**rec, "status": "not buildable", "reason": str(e), "seconds": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001
        return {**rec, "status": "not buildable", "reason": zoo.classify(e)["error"],
                "seconds": time.perf_counter() - t0}
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rec.update(layers=ZC.num_layers(config), params=sum(p.numel() for p in model.parameters()))
    try:
        ref = zoo.reference(config, state)
    except Exception as e:  # noqa: BLE001 - some models do not run in float64: a float32 reference, fp32 modes
        rec["fp64_skipped"] = zoo.classify(e)["error"]
        dtypes = tuple(d for d in dtypes if d != "fp64")
        try:
            ref = zoo.reference(config, state, torch.float32)
        except Exception as e32:  # noqa: BLE001
            return {**rec, "status": "reference failed", "reason": zoo.classify(e32)["error"],
                    "seconds": time.perf_counter() - t0}

    def one(attn: str, dtype: str, via_shard: bool) -> dict[str, Any]:
        out = zoo.packed_run(config, state, attn, zoo.DTYPES[dtype], via_shard)
        return zoo.compare(ref, out["logits"], out["loss"], out["grads"], zoo.TOL[dtype])

    check = "fp64" if "fp64" in dtypes else "fp32"
    rec["sanity"] = {attn: _safe(one, attn, check, False) for attn in (("eager", "sdpa") if sanity else ("eager",))}
    tol = {**zoo.TOL, "fp64": fp64_tolerance(rec["sanity"])}
    if tol["fp64"] > zoo.TOL["fp64"]:
        rec["fp64_tol"] = tol["fp64"]

    def one_hsap(dtype: str, via_shard: bool) -> dict[str, Any]:
        out = zoo.packed_run(config, state, "hsap", zoo.DTYPES[dtype], via_shard)
        return zoo.compare(ref, out["logits"], out["loss"], out["grads"], tol[dtype])

    for dtype in dtypes:
        rec["results"][dtype] = {m: _safe(one_hsap, dtype, m == "sp1_shard") for m in modes if m in zoo.SP1_MODES}
    jobs = [(d, m) for d in dtypes for m in modes if m in zoo.SP_MODES]
    if jobs and pools is not None:
        for (dtype, mode), got in pools.run_jobs(family, state, jobs).items():
            if isinstance(got, dict):
                res = got
            else:
                res = _safe(zoo.combine_sp, ref, got, zoo.SP_MODES[mode][0], tol[dtype])
            rec["results"][dtype][mode] = res
    for per_mode in rec["results"].values():  # keep the records small (JSON)
        for res in per_mode.values():
            res.pop("traceback", None)
    for res in rec["sanity"].values():
        res.pop("traceback", None)
    rec["seconds"] = time.perf_counter() - t0
    return rec


def sweep(families: list[str], run: Any, status: Any, json_path: str, header: dict[str, Any]) -> list[dict[str, Any]]:
    """Run every family on one pool manager, printing a line each and rewriting the JSON after every family (what
    ``scripts/model_zoo.py`` and ``scripts/vlm_zoo.py`` share).

    Args:
        families: the model types; run: ``run(family, pools) -> record``; status: ``status(record) -> str``;
        json_path: the results file; header: its header (``seconds`` and ``pool_restarts`` are filled in).

    Returns:
        The records, in ``families`` order.
    """
    import json
    import os
    import sys

    t0 = time.perf_counter()
    records: list[dict[str, Any]] = []
    pools = PoolManager()
    try:
        for i, family in enumerate(families):
            rec = run(family, pools)
            records.append(rec)
            print(f"[{i + 1}/{len(families)}] {family}: {status(rec)} ({rec['seconds']:.1f} s)",
                  file=sys.stderr, flush=True)
            header["seconds"] = time.perf_counter() - t0
            os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
            with open(json_path, "w") as f:
                json.dump({"header": {**header, "pool_restarts": pools.restarts}, "families": records}, f, indent=1,
                          default=str)
    finally:
        pools.close()
    return records
