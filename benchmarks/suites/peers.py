"""hf_hsap beside DeepSpeed's own sequence parallelism on CPU.

World ``world`` on gloo (spawned processes, one thread each), one packed row of ``T`` tokens, float32,
forward + backward of one attention layer, every scheme over hf_hsap's CPU kernel (so a ratio shows the
schedule, not the kernel): ``hsap`` (:func:`hf_hsap.hsap_attn_func`, placement auto), ``hsap_ulysses``
(hf_hsap's own Ulysses baseline, :class:`benchmarks.suites.cpu_baselines.UlyssesAttention`), ``deepspeed_ulysses``
(DeepSpeed's ``DistributedAttention``) and ``alst`` (DeepSpeed's ``UlyssesSPAttentionHF``); the schemes are
described in :mod:`benchmarks.suites.peer_workers`. Every scheme is checked against a float64 reference of the
whole row (out, dq, dk, dv) before it is timed; then interleaved rounds; then the peak resident memory of
a step per scheme (after a warm-up step, the median of three interleaved rounds).

DeepSpeed is not an hf_hsap dependency: run this in the environment of ``scripts/bench_peers.sh``
(``.venv-ds``). Without DeepSpeed only the hf_hsap schemes run.

Usage: ``python -m benchmarks peers [--quick] [--out benchmarks/results/peers.json] [--T N] [--reps N]
[--no-write-md]``. Writes the results JSON; the entry point then (unless ``--quick`` or ``--no-write-md``) renders it
(:func:`benchmarks.report.peers.peers_section`) into the detail file ``benchmarks/results/peers.md`` and
``BENCHMARKS.md``'s headline.

The single document dominates the time (quadratic in ``T``); ``--quick`` (``T = 1024``, 3 rounds) checks that
everything runs and is mostly process start-up.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from hf_hsap.testing import DistPool

from ..analytic.distributions import cu_seqlens, doc_lengths, useful_pairs
from ..analytic.peers import summarize
from . import peer_workers as pw
from .output import RESULTS, ROOT, Outcome, command_line, renders_pages, stamp

DEFAULT_OUT = RESULTS / "peers.json"
ROW_LABELS = {"longtail": "long-tail", "single": "one long document", "sft": "SFT (many short documents)",
              "mixed": "one long document among short"}


@dataclass(frozen=True)
class PeersConfig:
    """What :func:`run_peers` measures.

    Attributes:
        world: ranks; T: row length (divisible by ``world``); hq, kv_heads, d: query heads, the key/value head
            counts measured, head dim; rows: distributions of :mod:`benchmarks.analytic.distributions`; seed: of the rows
            and the inputs; reps: timed interleaved rounds; tol: largest relative error (float32 against the
            float64 reference); memory: also measure peak memory; schemes: the schemes wanted (the DeepSpeed
            ones are dropped where DeepSpeed cannot run them, with the reason in the results).
    """

    world: int = 4
    T: int = 8192  # the 16384 is about 3.4 times the work: --T 16384 runs it
    hq: int = 8
    kv_heads: tuple[int, ...] = (8, 2)
    d: int = 64
    rows: tuple[str, ...] = ("longtail", "single", "sft")
    seed: int = 0
    reps: int = 15  # the fewest whose median interval (CONFIDENCE) leaves out the 3 extreme rounds each side
    tol: float = 1e-4
    memory: bool = True
    schemes: tuple[str, ...] = pw.SCHEMES


QUICK = PeersConfig(T=1024, reps=3)  # a check that everything runs, not a measurement


def _machine() -> dict:
    import torch

    return {"cores": os.cpu_count(), "load": list(os.getloadavg()), "torch": torch.__version__,
            "numpy": np.__version__, "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine()}


def run_peers(quick: bool = False, cfg: PeersConfig | None = None, progress: bool = False,
              pool: DistPool | None = None) -> dict:
    """Measure every scheme on every (row, key/value heads) of the configuration.

    Args:
        quick: the small configuration (:data:`QUICK`, T = 1024) when ``cfg`` is not given.
        cfg: the configuration (default: :class:`PeersConfig` or :data:`QUICK`); progress: print a line per run.
        pool: ranks to run on (``cfg.world`` of them, left open, their glibc settings put back after the memory
            runs); default: a fresh :class:`~hf_hsap.testing.DistPool`, closed at the end.

    Returns:
        ``{"config", "probe", "deepspeed", "schemes", "configs": [{"dist", "label", "T", "hq", "hkv", "d",
        "n_docs", "pairs", "check_s", "seconds", "results": summarize(...)}], "all_exact", "machine",
        "machine_end", "seconds", "command"}``.
    """
    cfg = cfg or (QUICK if quick else PeersConfig())
    t0 = time.perf_counter()
    machine = _machine()
    configs = []
    rows = {name: cu_seqlens(doc_lengths(name, cfg.T, cfg.seed)) for name in cfg.rows}
    own = pool is None
    if own:
        pool = DistPool(cfg.world, timeout_s=1800.0, pg_timeout_s=1800.0)
    elif pool.world != cfg.world:
        raise ValueError(f"the pool has {pool.world} ranks, the configuration {cfg.world}")
    try:
        wants_ds = any(n in pw.DEEPSPEED_SCHEMES for n in cfg.schemes)
        probe = pool.run(pw.probe_peers)[0] if wants_ds else {"deepspeed": None}
        names = tuple(n for n in cfg.schemes if n not in pw.DEEPSPEED_SCHEMES or probe.get(n) == "ok")
        if names[0] != "hsap":
            raise ValueError("the schemes must start with 'hsap' (the base of every ratio)")
        if progress:
            print(f"  peers: deepspeed {probe.get('deepspeed')}; schemes {', '.join(names)} "
                  f"(ranks up in {time.perf_counter() - t0:.0f}s)", flush=True)
        calibration = {hkv: pool.run(pw.calibration_task, cfg.hq, hkv, cfg.d)[0] for hkv in cfg.kv_heads}
        if progress:
            print("  peers: CPU cost figures " + "; ".join(f"hkv={h}: " + ", ".join(f"{k} {v:.3g}" for k, v in f.items())
                                                          for h, f in calibration.items()), flush=True)
        for dist_name, cu in rows.items():
            for hkv in cfg.kv_heads:
                t1 = time.perf_counter()
                res = pool.run(pw.peers_task, cu.tolist(), cfg.hq, hkv, cfg.d, cfg.seed, cfg.reps, names, cfg.tol,
                               calibration[hkv])
                lengths = np.diff(cu)
                configs.append({"dist": dist_name, "label": ROW_LABELS.get(dist_name, dist_name), "T": cfg.T,
                                "hq": cfg.hq, "hkv": hkv, "d": cfg.d, "n_docs": int(len(lengths)),
                                "pairs": useful_pairs(lengths), "check_s": max(r["check_s"] for r in res),
                                "seconds": time.perf_counter() - t1, "per_rank": res})
                if progress:
                    s = summarize(res)
                    line = " ".join(f"{n}={v['ms']:.0f}ms" if "ms" in v else f"{n}=NOT-EXACT" for n, v in s.items())
                    print(f"  peers {dist_name:8s} hkv={hkv}: {line} ({configs[-1]['seconds']:.0f}s)", flush=True)
        mem: list[list[dict] | None] = [None] * len(configs)
        if cfg.memory:
            tracked = all(pool.run(pw.track_malloc))
            for i, c in enumerate(configs):
                mem[i] = pool.run(pw.peers_memory_task, rows[c["dist"]].tolist(), cfg.hq, c["hkv"], cfg.d, cfg.seed,
                                  names, calibration[c["hkv"]])
            if not own:
                pool.run(pw.track_malloc, False)
            if progress:
                print(f"  peers memory: {len(configs)} configurations (malloc tracking {tracked}; "
                      f"{time.perf_counter() - t0:.0f}s so far)", flush=True)
    finally:
        if own:
            pool.close()
    for c, m in zip(configs, mem):
        c["results"] = summarize(c.pop("per_rank"), m)
        c["peak_reset"] = None if m is None else all(r["peak_reset"] for r in m)
    return {"config": dataclasses.asdict(cfg), "quick": cfg == QUICK, "probe": probe, "deepspeed": probe.get("deepspeed"),
            "calibration": {str(h): f for h, f in calibration.items()},
            "schemes": list(names), "configs": configs,
            "all_exact": all(v["exact"] for c in configs for v in c["results"].values()),
            "machine": machine, "machine_end": _machine(), "seconds": time.perf_counter() - t0,
            "command": command_line("peers", ["--quick"] if quick else [])}


# ----------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    """The command-line options of ``python -m benchmarks peers``.

    Returns:
        The parser.
    """
    p = argparse.ArgumentParser(prog="python -m benchmarks peers", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"T = {QUICK.T}, {QUICK.reps} rounds (a check that "
                   "everything runs, not a measurement)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results JSON (default benchmarks/results/peers.json)")
    p.add_argument("--T", type=int, default=None, help=f"row length (default {PeersConfig.T}, --quick {QUICK.T})")
    p.add_argument("--reps", type=int, default=None, help=f"timed interleaved rounds (default {PeersConfig.reps}, "
                   f"--quick {QUICK.reps})")
    p.add_argument("--rows", default=None, help="comma-separated distributions (default longtail,single,sft)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    p.add_argument("--no-write-md", action="store_true", help="leave BENCHMARKS.md and the detail files alone "
                   "(--quick leaves them alone too)")
    return p


def main(argv: Sequence[str]) -> Outcome:
    """Run on the command line ``argv`` and write the JSON; the outcome's status is 1 if a scheme was not exact."""
    args = build_parser().parse_args(argv)
    cfg = QUICK if args.quick else PeersConfig()
    over = {k: v for k, v in (("T", args.T), ("reps", args.reps)) if v is not None}
    if args.rows:
        over["rows"] = tuple(args.rows.split(","))
    if args.no_memory:
        over["memory"] = False
    cfg = dataclasses.replace(cfg, **over)
    res = run_peers(args.quick, cfg, progress=True)
    res.update(stamp())
    res["command"] = command_line("peers", argv)
    out = Path(args.out).resolve()
    res["out"] = str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else str(out)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=float) + "\n")
    print(f"wrote {args.out} in {res['seconds']:.0f} s")
    return Outcome(0 if res["all_exact"] else 1, res,
                   renders_pages(args.out, DEFAULT_OUT, args.no_write_md or args.quick))
