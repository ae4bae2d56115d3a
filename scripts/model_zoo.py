"""Model-zoo sweep: every causal-LM family of Transformers under attn_implementation="hsap", in every mode.

    .venv/bin/python scripts/model_zoo.py [--families llama,qwen2] [--out MODELS.md] [--json PATH]

Runs ``tests/workers/zoo_run.run_family`` for each family (tiny random model, one packed row of 5 documents,
float32 and float64; one process, and SP 2 / SP 4 with Ulysses 1 / 2 on 4 spawned gloo ranks), compares with
each document run alone in float64 eager mode, and writes the raw results as JSON (updated after every
family, default ``benchmarks/results/model_zoo.json``) and the table (default ``MODELS.md``).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import warnings
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # `workers` (also for the spawned ranks: spawn copies sys.path)
os.environ.setdefault("OMP_NUM_THREADS", "1")

STATUS_ORDER = ("WRONG", "crash", "refused", "exact")
VLM_SECTION = "<!-- vlm-zoo:start -->"  # where scripts/vlm_zoo.py's section begins (kept on a rerun)


def family_status(rec: dict[str, Any]) -> str:
    """``exact`` (every mode), ``refused`` (some refused, the rest exact), ``crash`` or ``WRONG`` (any), or the
    record's status when it did not run."""
    if rec["status"] != "run":
        return rec["status"]
    seen = {res["outcome"] for per_mode in rec["results"].values() for res in per_mode.values()}
    return next((s for s in STATUS_ORDER if s in seen), "exact")


def _dtype_cell(rec: dict[str, Any], modes: tuple[str, ...]) -> str:
    """Per dtype: ``✓`` (every mode of ``modes`` exact), ``refused`` (all refused), else ``k/n`` exact, with ``✗``
    when some mode is WRONG or crashed."""
    parts = []
    for dtype, per_mode in rec["results"].items():
        got = [per_mode[m]["outcome"] for m in modes if m in per_mode]
        if not got:
            continue
        n = sum(o == "exact" for o in got)
        if n == len(got):
            parts.append(f"{dtype} ✓")
        elif set(got) == {"refused"}:
            parts.append(f"{dtype} refused")
        else:
            bad = " ✗" if {"WRONG", "crash"} & set(got) else ""
            parts.append(f"{dtype} {n}/{len(got)}{bad}")
    return " ".join(parts) or "–"


def _grouped(rec: dict[str, Any], outcome: str) -> list[tuple[str, str]]:
    """``(modes, message)`` for each distinct message of ``outcome`` (modes as ``dtype:mode`` lists)."""
    by_msg: dict[str, list[str]] = {}
    wrong_text: dict[str, str] = {}
    for dtype, per_mode in rec["results"].items():
        for mode, res in per_mode.items():
            if res["outcome"] != outcome:
                continue
            if outcome == "WRONG":  # one entry per error size (to a factor of ~3), the worst tensor named
                e = res["err"]
                key = f"{e['logits']:.0e}/{e['grads']:.0e}"
                msg = (f"max rel. error logits {e['logits']:.1e}, loss {e['loss']:.1e}, grads {e['grads']:.1e} "
                       f"({e['worst_grad']})")
                by_msg.setdefault(key, []).append(f"{dtype}:{mode}")
                wrong_text.setdefault(key, msg)
            else:  # messages that differ only past what the table shows are one group
                by_msg.setdefault(_short(res.get("error", ""), 100), []).append(f"{dtype}:{mode}")
    return [(", ".join(v), wrong_text.get(k, k)) for k, v in by_msg.items()]


def _sanity_mark(res: dict[str, Any] | None) -> str:
    """✓ exact, ≈ off by float32 rounding only, ✗ WRONG, `crash`, – not run."""
    from workers import zoo_run

    if not res:
        return "–"
    if res["outcome"] == "WRONG":
        return "≈" if max(res["err"]["logits"], res["err"]["grads"]) < zoo_run.FLOAT32_ISLAND else "✗"
    return {"exact": "✓"}.get(res["outcome"], res["outcome"])


def _short(text: str, limit: int = 110) -> str:
    """One table-safe line."""
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _vlm_pointer(rec: dict[str, Any]) -> str:
    """For a family the text zoo cannot build because it is a vision-language model: where its results are."""
    return " (see [Multimodal models](#multimodal-models))" if rec.get("reason", "").startswith("multimodal") else ""


def render(records: list[dict[str, Any]], header: dict[str, Any]) -> str:
    """MODELS.md from the sweep's records."""
    from workers import zoo

    sp_modes, sp1_modes = tuple(zoo.SP_MODES), zoo.SP1_MODES
    run = [r for r in records if r["status"] == "run"]
    counts = {s: sum(family_status(r) == s for r in run) for s in STATUS_ORDER}
    outcomes = [{res["outcome"] for per in r["results"].values() for res in per.values()} for r in run]
    all_refused = sum(o == {"refused"} for o in outcomes)
    lines = [
        "# Model zoo: Transformers causal-LM families under `attn_implementation=\"hsap\"`",
        "",
        f"Generated by `{header['command']}` on {header['date']} (transformers {header['transformers']}, torch "
        f"{header['torch']}, hf_hsap checks: {header['checks']}; {header['seconds']:.0f} s). Raw results: "
        f"`{header['json']}`.",
        "",
        "Each family's tiny random model (from its config defaults, shrunk: `tests/workers/zoo_configs.py`) runs one "
        f"packed row of documents of lengths {zoo.DOC_LENS} in float32 and float64, and is compared with the same "
        "weights in float64, eager attention, each document run alone: logits, loss and every parameter gradient of "
        "`loss + sum(w * logits)`, relative error ≤ "
        f"{zoo.TOL['fp32']:g} (fp32) / {zoo.TOL['fp64']:g} (fp64). Modes: `sp1` (the packed row, no SP), "
        "`sp1_shard` (through `shard_batch(batch, 1)`), and on 4 gloo ranks SP 2 (as DP 2 x SP 2) and SP 4, "
        "each with Ulysses U = 1 and 2. `refused`: hf_hsap raised on purpose; `crash`: any other exception; "
        "`WRONG`: ran, results differ. Cells: ✓ every mode exact, `k/n` k of n modes exact (✗: some WRONG or "
        "crash). `eager/sdpa`: Transformers' own packed-row path (no hf_hsap), fp64 "
        "(≈: off by float32 rounding only). "
        "`fp64 tol`: the model computes parts in float32 (its own eager packed run deviates at float32 rounding "
        "level), so its float64 tolerance is 10x that deviation. Hybrid models (linear attention, Mamba, short "
        "convolutions: their eager packed run mixes documents, ✗) are drawn in float64, and their float64 runs "
        "keep the recurrent kernels' float32 casts in float64, so they are held to the float64 tolerance.",
        "",
        f"**Summary** ({len(run)} families run, {len(records) - len(run)} not run): "
        f"{counts['exact']} exact everywhere, {counts['refused']} refused ({all_refused} in every mode, "
        f"{counts['refused'] - all_refused} exact in the others, e.g. at sp1), "
        f"{counts['crash']} with a crash, {counts['WRONG']} WRONG.",
        "",
        "| family | exact at sp1 | exact under SP | eager/sdpa packed | refused (message) | WRONG / crash |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in run:
        sanity = " ".join(_sanity_mark(r["sanity"].get(a)) for a in ("eager", "sdpa"))
        refused = "; ".join(f"{m} ({len(modes.split(', '))} modes)" for modes, m in _grouped(r, "refused"))
        bad = [f"{o} {sum(len(m.split(', ')) for m, _ in _grouped(r, o))}" for o in ("WRONG", "crash")
               if _grouped(r, o)]
        name = r["family"] + (f" (fp64 tol {r['fp64_tol']:.0e})" if "fp64_tol" in r else "")
        name += " (fp32 only²)" if "fp64_skipped" in r else ""
        lines.append(f"| {name} | {_dtype_cell(r, sp1_modes)} | {_dtype_cell(r, sp_modes)} | {sanity} | "
                     f"{refused or '–'} | {', '.join(bad) or '–'} |")
    only32 = [r for r in run if "fp64_skipped" in r]
    if only32:
        lines += ["", "² does not run in float64 (float32 reference and runs only): " + "; ".join(
            f"{r['family']}: {_short(r['fp64_skipped'], 120)}" for r in only32)]
    lines += ["", "## WRONG and crash cases", ""]
    for r in run:
        for outcome in ("WRONG", "crash"):
            for modes, msg in _grouped(r, outcome):
                text = msg
                lines.append(f"- **{r['family']}** {outcome} in {modes}: {_short(text, 300)}")
    if not any(family_status(r) in ("WRONG", "crash") for r in run):
        lines.append("none")
    lines += ["", "## Not run", "", "| family | reason |", "| --- | --- |"]
    lines += [f"| {r['family']} | {r['status']}: {_short(r.get('reason', ''), 160)}{_vlm_pointer(r)} |"
              for r in records if r["status"] != "run"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; write the JSON and MODELS.md."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="", help="comma-separated model types (default: all)")
    parser.add_argument("--out", default=os.path.join(ROOT, "MODELS.md"), help="the table (Markdown)")
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "model_zoo.json"),
                        help="raw results")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    import hf_hsap
    from workers import zoo_configs as ZC
    from workers import zoo_run

    families = [f for f in args.families.split(",") if f] or ZC.families()
    checks = ", ".join(n for n in ("prepare_model", "check_plan_used") if hasattr(hf_hsap, n)) or "absent"
    header = {"command": "python scripts/model_zoo.py" + (f" --families {args.families}" if args.families else ""),
              "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "transformers": transformers.__version__,
              "torch": torch.__version__, "checks": checks, "json": os.path.relpath(args.json, ROOT), "seconds": 0.0}
    records = zoo_run.sweep(families, zoo_run.run_family, family_status, args.json, header)
    keep = ""  # the multimodal section (scripts/vlm_zoo.py) closes the file: kept as it is
    if os.path.exists(args.out):
        with open(args.out, encoding="utf-8") as f:
            old = f.read()
        if VLM_SECTION in old:
            keep = "\n" + old[old.index(VLM_SECTION):]
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(render(records, header) + keep)
    print(f"wrote {args.out} and {args.json} ({header['seconds']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
