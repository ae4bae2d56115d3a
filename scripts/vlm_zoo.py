"""Multimodal zoo sweep: every vision-language and audio-language family of Transformers on packed rows.

    .venv/bin/python scripts/vlm_zoo.py [--families qwen2_5_vl,llava] [--json PATH] [--out MODELS.md] [--no-probe]

Runs ``tests/workers/vlm_zoo_run.run_family`` for each family (tiny random model, one packed row of 5 image + text
documents, or of 4 audio + text documents for the audio-text families, float64; one process, and SP 2 / SP 4 with
Ulysses 1 / 2 on 4 spawned gloo ranks), compares with each document run alone, writes the raw results as JSON
(updated after every family, default ``benchmarks/results/vlm_zoo.json``) and replaces the section "Multimodal
models" at the end of MODELS.md (between the markers :data:`START` / :data:`END`; the rest of the file stays
byte-identical). For the families ``vision_spec`` refuses it also prints what listing them would give (the probe, also in the JSON).
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import warnings
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # `workers` (also for the spawned ranks: spawn copies sys.path)
os.environ.setdefault("OMP_NUM_THREADS", "1")

START, END = "<!-- vlm-zoo:start -->", "<!-- vlm-zoo:end -->"
STATUS_ORDER = ("WRONG", "crash", "refused", "exact")
SP_MODES = ("sp2_u1", "sp2_u2", "sp4_u1", "sp4_u2")


AUDIO = "audio-text"  # a record's "section" for the audio-language families (else "image-text")


def _section(rec: dict[str, Any]) -> str:
    """``"image-text"`` or :data:`AUDIO` (the record's ``section``; records without one are image-text)."""
    return rec.get("section", "image-text")


def family_status(rec: dict[str, Any]) -> str:
    """``not buildable``; ``refused`` (by ``vision_spec``, or some modes refused and the rest exact); ``exact``
    (every mode); ``crash`` or ``WRONG`` (any mode, or ``vision_spec`` itself crashed)."""
    if rec["status"] != "run":
        return rec["status"]
    if rec["spec"]["outcome"] != "accepted":
        return "refused" if rec["spec"]["outcome"] == "refused" else "crash"
    seen = {res["outcome"] for res in rec["results"].values()}
    return next((s for s in STATUS_ORDER if s in seen), "exact")


def _short(text: str, limit: int = 110) -> str:
    """One table-safe line (the list of supported families collapsed)."""
    text = re.sub(r"\[[^\]]{40,}\]", "[...]", text).replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _cell(rec: dict[str, Any], modes: tuple[str, ...]) -> str:
    """``✓`` (every mode exact), ``refused`` (all refused), else ``k/n`` exact with ``✗`` for a WRONG or crash."""
    if rec["spec"]["outcome"] != "accepted":
        return "refused"
    got = [rec["results"][m]["outcome"] for m in modes if m in rec["results"]]
    if not got:
        return "–"
    n = sum(o == "exact" for o in got)
    if n == len(got):
        return "✓" if len(got) == 1 else f"✓ ({n}/{n})"
    if set(got) == {"refused"}:
        return "refused"
    return f"{n}/{len(got)}" + (" ✗" if {"WRONG", "crash"} & set(got) else "")


def _gist(text: str, limit: int = 210) -> str:
    """A long message cut in the middle: its first clause (the reason, parentheses dropped) and its last (the
    fix)."""
    text = re.sub(r"^\w+(Error|Exception): ", "", re.sub(r"\[[^\]]{40,}\]", "[...]", text))
    parts = text.split("; ")
    if len(text) <= limit or len(parts) < 2:
        return _short(text, limit)
    head = _short(re.sub(r" \([^)]*\)", "", parts[0]), 80)
    return head + "; …; " + _short(parts[-1], limit - len(head) - 5)


def _fix(rec: dict[str, Any]) -> str:
    """Whether the refusal's fix works (``vlm_zoo_run._fix``): ✓, ✗ with what failed, or not checked."""
    fix = rec.get("fix")
    if fix is True:
        return "fix works ✓"
    if fix.startswith("not checked"):
        return "fix " + _short(fix, 90)
    return "fix ✗: " + _short(fix, 110)


def _refused(rec: dict[str, Any]) -> str:
    """The refusal messages: ``vision_spec``'s, or hf_hsap's per group of modes."""
    if rec["spec"]["outcome"] == "refused":
        return f"`vision_spec`: {_gist(rec['spec']['error'])} ({_fix(rec)})"
    by_msg: dict[str, list[str]] = {}
    for mode, res in rec["results"].items():
        if res["outcome"] == "refused":
            by_msg.setdefault(_gist(res["error"]), []).append(mode)
    return "; ".join(f"{', '.join(m)}: {msg}" for msg, m in by_msg.items()) or "–"


def _bad(rec: dict[str, Any]) -> list[str]:
    """One line per WRONG / crash mode (and a crash of ``vision_spec`` itself)."""
    if rec["spec"]["outcome"] == "crash":
        return [f"vision_spec: {rec['spec']['error']}"]
    out = []
    for mode, res in rec["results"].items():
        if res["outcome"] == "WRONG":
            e = res["err"]
            out.append(f"{mode} WRONG: rel. error logits {e['logits']:.1e}, loss {e['loss']:.1e}, grads "
                       f"{e['grads']:.1e} ({e['worst_grad']})")
        elif res["outcome"] == "crash":
            out.append(f"{mode} crash: {res['error']}")
    return out


def render(records: list[dict[str, Any]], header: dict[str, Any]) -> str:
    """The "Multimodal models" section (markers included) from the sweep's records."""
    from workers import vlm_zoo as VZ

    run = [r for r in records if r["status"] == "run"]
    n_audio = sum(_section(r) == AUDIO for r in records)
    status = [family_status(r) for r in run]
    counts = {s: status.count(s) for s in STATUS_ORDER}
    refused = [r for r in run if r["spec"]["outcome"] == "refused"]
    by_spec = len(refused)
    bad_fix = [r for r in refused if r.get("fix") is not True and not str(r.get("fix")).startswith("not checked")]
    isl = sorted({r["tol"] for r in run if r["tol"] > VZ.TOL and r["spec"]["outcome"] == "accepted"})
    lines = [
        START,
        "## Multimodal models",
        "",
        f"Generated by `{header['command']}` on {header['date']} at {header.get('commit', 'unknown')} (transformers "
        f"{header['transformers']}, torch {header['torch']}; {header['seconds']:.0f} s). Raw results: "
        f"`{header['json']}`.",
        "",
        "Every vision-language family of the installed Transformers (`MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES` and "
        "Mllama) is built from a tiny config (`tests/workers/vlm_zoo_configs.py`). `vision_spec(model)` either "
        "refuses it (`refused`, with the fix its message names: one document per row, which is what the reference "
        "runs) or the family runs one packed row of 5 image + text documents through "
        "`PackingCollator(vision=vision_spec(model))`, `prepare_model`, `shard_batch(batch, sp)` and `model(**local)` "
        "with `attn_implementation=\"hsap\"` in float64: `sp1` in one process, and on 4 gloo ranks SP 2 (as DP 2 x "
        "SP 2) and SP 4, each with Ulysses U = 1 and 2 (an image split across ranks). Compared with the same weights "
        "on each document alone (SDPA, eager where the family has no SDPA): logits of every token, the loss and "
        f"every parameter gradient of `loss + sum(w * logits)`, relative error ≤ {VZ.TOL:g}, or a float32 island's "
        f"tolerance ({', '.join(f'{t:g}' for t in isl) or 'none'}: the family's vision tower or norms compute in "
        "float32, `tests/workers/vlm_zoo.py`). `refused`: hf_hsap raised on purpose; `crash`: any other exception; "
        "`WRONG`: ran, results differ. Cells: ✓ exact, `k/n` k of n modes exact (✗: some WRONG or crash).",
        "",
        "The audio-text families (the section after the table) are the model types of "
        "`MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES`, `MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES`, "
        "`MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES` and `MODEL_FOR_PRETRAINING_MAPPING_NAMES` whose model class "
        "has `get_audio_features` (a causal LM over an audio encoder's rows at placeholders) and that are not "
        "vision families (`vlm_zoo_configs.audio_families`): the same harness on one packed row of 4 documents with "
        "one audio clip each (different lengths, the long one split across ranks under SP; "
        "`tests/workers/vlm_zoo_audio.py`). Speech encoder-decoders (Whisper, Speech2Text, SpeechT5, ...) have no "
        "`get_audio_features`: their text comes from a decoder cross-attending to the whole encoded audio, outside "
        "this set; so do models that encode audio inside their forward without that hook (Qwen2-Audio, "
        "Phi-4-multimodal) or read audio codes as their text stream (Kyutai speech-to-text).",
        "",
        f"**Summary** ({len(records)} families: {len(records) - n_audio} image-text, {n_audio} audio-text; "
        f"{len(records) - len(run)} not buildable): {counts['exact']} exact "
        f"in every mode, {counts['refused']} refused ({by_spec} by `vision_spec`, {counts['refused'] - by_spec} "
        f"in some modes), {counts['crash']} with a crash, {counts['WRONG']} WRONG. Refusals by `vision_spec` whose "
        f"fix was tried: {sum(r.get('fix') is True for r in refused)} work, {len(bad_fix)} fail (✗: "
        f"{', '.join(r['family'] for r in bad_fix) or 'none'}).",
        "",
        "| family | exact at sp1 | exact under SP | refused (message, shortened) | WRONG / crash |",
        "| --- | --- | --- | --- | --- |",
    ]
    audio = [r for r in run if _section(r) == AUDIO]
    for r in [r for r in run if _section(r) != AUDIO] + (["audio"] if audio else []) + audio:
        if r == "audio":  # the audio-text families: their own table, the same columns
            lines += ["", "### Audio-text models", "", "| family | exact at sp1 | exact under SP | refused (message, "
                      "shortened) | WRONG / crash |", "| --- | --- | --- | --- | --- |"]
            continue
        name = r["family"] + (f" (tol {r['tol']:.0e})" if r["tol"] > VZ.TOL and r["spec"]["outcome"] == "accepted"
                              else "")
        bad = _bad(r)
        lines.append(f"| {name} | {_cell(r, ('sp1',))} | {_cell(r, SP_MODES)} | {_refused(r)} | "
                     f"{_short('; '.join(bad), 160) if bad else '–'} |")
    lines += ["", "### Not buildable", "", "| family | reason |", "| --- | --- |"]
    lines += [f"| {r['family']}{' (audio-text)' if _section(r) == AUDIO else ''} | {_short(r.get('reason', ''), 160)} |"
              for r in records if r["status"] != "run"]
    return "\n".join(lines + [END]) + "\n"


def write_section(path: str, section: str) -> None:
    """Replace the section between :data:`START` and :data:`END` of ``path`` (or append it at the end); every
    other byte of the file stays as it was."""
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + section.rstrip("\n") + rest.split(END, 1)[1]
    else:
        text = text + ("" if text.endswith("\n") or not text else "\n") + ("\n" if text else "") + section
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def section_of(path: str) -> str:
    """The current section of ``path`` (markers included, with its newline), or ``""``."""
    text = open(path, encoding="utf-8").read()
    if START not in text:
        return ""
    return START + text.split(START, 1)[1].split(END, 1)[0] + END + "\n"


def probe_report(records: list[dict[str, Any]]) -> str:
    """What listing each refused family would give (one line each): exact in every mode, or the first failure."""
    lines = []
    for r in records:
        probe = r.get("probe")
        if not probe:
            continue
        res = probe.get("results") or {}
        bad = [(m, x) for m, x in res.items() if x["outcome"] != "exact"]
        if probe.get("skipped"):
            verdict = f"not run: {_short(probe['skipped'], 140)}"
        elif not bad:
            verdict = f"exact in {len(res)} modes (tol {r['tol']:g})"
        else:
            m, x = bad[0]
            detail = x.get("error") or f"errors {x['err']}"
            verdict = f"{x['outcome']} in {', '.join(m for m, _ in bad)}: {_short(str(detail), 160)}"
        lines.append(f"{r['family']:24s} as {probe['spec']:15s} {verdict}")
    return "\n".join(lines)


def _commit() -> str:
    """The repository's short commit (``git rev-parse``), with ``+`` when hf_hsap/ has changes not committed."""
    import subprocess

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+" if git("status", "--porcelain", "--", "hf_hsap") else "")


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; write the JSON and the MODELS.md section."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="", help="comma-separated model types (default: all)")
    parser.add_argument("--out", default=os.path.join(ROOT, "MODELS.md"), help="the Markdown file to update")
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "vlm_zoo.json"),
                        help="raw results")
    parser.add_argument("--no-probe", action="store_true", help="do not run refused families as if listed")
    parser.add_argument("--vision-encoding", choices=("auto", "holders", "once"), default="auto",
                        help="HSAPConfig.vision_encoding of the SP modes (an item split across ranks encoded by "
                             "every holder, or once with its rows sent)")
    args = parser.parse_args(argv)
    from workers.vlm_zoo import ENCODING_ENV

    os.environ[ENCODING_ENV] = args.vision_encoding  # read by the spawned ranks
    warnings.filterwarnings("ignore")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    from workers import vlm_zoo_configs as VC
    from workers import vlm_zoo_run, zoo_run

    families = [f for f in args.families.split(",") if f] or VC.families()
    header = {"command": "python scripts/vlm_zoo.py" + (f" --families {args.families}" if args.families else "")
              + (f" --vision-encoding {args.vision_encoding}" if args.vision_encoding != "auto" else ""),
              "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "transformers": transformers.__version__,
              "torch": torch.__version__, "json": os.path.relpath(args.json, ROOT), "seconds": 0.0,
              "commit": _commit()}
    def run(family: str, pools: Any) -> dict[str, Any]:
        return vlm_zoo_run.run_family(family, pools, probe=not args.no_probe)

    records = zoo_run.sweep(families, run, family_status, args.json, header)
    write_section(args.out, render(records, header))
    print(probe_report(records), file=sys.stderr)
    print(f"wrote {args.out} and {args.json} ({header['seconds']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
