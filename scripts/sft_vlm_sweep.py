"""The eight VLMs of TRL's SFT examples and docs through ``HSAPSFTTrainer`` with ``packing=True``: each family's
logged losses on one process and at SP 4 (4 gloo ranks on CPU) with Ulysses 1 and 2, side by side.

    OMP_NUM_THREADS=1 python scripts/sft_vlm_sweep.py                          # all eight, a Markdown table
    python scripts/sft_vlm_sweep.py --families smolvlm,mllama --steps 3 --json /tmp/sweep.json

The tiny random models and their processors are :func:`hf_hsap.examples.tiny_trl_vlm`'s, the data the generated
image + text chat set; the runs are ``tests/workers/vlm_sft.py``'s (what ``pytest -m slow
tests/model/test_vlm_sft.py`` asserts). Exit status 1 when a family fails or its losses differ by more than
``--rel_tol``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # `workers` (also for the spawned ranks: spawn copies sys.path)
sys.path.insert(0, ROOT)


def sweep(families: list[str], steps: int, out: str) -> list[dict[str, Any]]:
    """Every family at SP 1 (this process) and at SP 4, Ulysses 1 and 2 (one pool of 4 ranks).

    Returns:
        One record per family: ``sp1`` losses, ``sp4_u1`` / ``sp4_u2`` rank 0's losses (``None`` and ``error`` on
        a failure), ``ranks_agree`` and ``max_rel`` (the largest relative difference to ``sp1``).
    """
    from hf_hsap.testing import DistPool
    from workers import vlm_sft as W

    records = []
    with DistPool(4, timeout_s=600) as pool:
        for family in families:
            rec: dict[str, Any] = {"family": family, "ranks_agree": True, "max_rel": 0.0}
            try:
                rec["sp1"] = W.vlm_sft_losses(1, os.path.join(out, family, "sp1"), steps=steps, family=family)["losses"]
                for u in ("1", "2"):
                    ranks = pool.run(W.sp_losses, family, os.path.join(out, family, f"sp4_u{u}"), u, steps)
                    got = [r["losses"] for r in ranks]
                    rec[f"sp4_u{u}"] = got[0]
                    rec["ranks_agree"] &= all(g == got[0] for g in got)
                    rec["max_rel"] = max([rec["max_rel"]] + [abs(a - b) / abs(b) for a, b in zip(got[0], rec["sp1"])])
            except Exception as e:  # noqa: BLE001 - a family's failure is reported, the sweep goes on
                rec["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"
            records.append(rec)
            print(json.dumps(rec), flush=True)
    return records


def table(records: list[dict[str, Any]]) -> str:
    """The Markdown table of :func:`sweep`'s records."""
    from hf_hsap.examples import TRL_VLMS

    lines = ["| family | SP 1 losses | SP 4, U 1 | SP 4, U 2 | max rel. diff |", "|---|---|---|---|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {TRL_VLMS[r['family']]} (`{r['family']}`) | {r['error']} | | | |")
            continue
        fmt = ", ".join
        lines.append(f"| {TRL_VLMS[r['family']]} (`{r['family']}`) | {fmt(f'{x:.6f}' for x in r['sp1'])} | "
                     f"{fmt(f'{x:.6f}' for x in r['sp4_u1'])} | {fmt(f'{x:.6f}' for x in r['sp4_u2'])} | "
                     f"{r['max_rel']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run :func:`sweep`, print :func:`table`; 1 when a family fails or differs."""
    from hf_hsap.examples import TRL_VLMS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", default=",".join(TRL_VLMS), help="comma-separated (default: all eight)")
    p.add_argument("--steps", type=int, default=2, choices=range(1, 5),
                   help="optimizer steps per run (1-4: the set's 24 examples hold 6 batches of 4)")
    p.add_argument("--rel_tol", type=float, default=1e-5, help="largest relative loss difference accepted")
    p.add_argument("--json", default=None, help="write the records here")
    args = p.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in TRL_VLMS]
    if unknown:
        p.error(f"unknown families {unknown}; choose from {list(TRL_VLMS)}")
    with tempfile.TemporaryDirectory(prefix="sft-vlm-sweep-") as out:
        records = sweep(families, args.steps, out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    print(table(records))
    bad = [r["family"] for r in records if "error" in r or not r["ranks_agree"] or r["max_rel"] > args.rel_tol]
    if bad:
        print(f"failed or beyond rel_tol {args.rel_tol}: {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
