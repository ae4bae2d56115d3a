"""The memory goals (million-token rows) in one table, and the memory sections (the detail file
``benchmarks/results/memory.md``), from the results of ``bash scripts/bench_memory.sh``
(``benchmarks/results/memory_levers.json`` of :mod:`benchmarks.suites.memory_levers`, ``memory_model.json`` of
:mod:`benchmarks.suites.memory_model`, ``sft_memory.json`` of :mod:`benchmarks.suites.sft_memory`). A goal whose
figures are missing gets no row."""
from __future__ import annotations

from typing import Any

from ..analytic.memory import RECIPE_LENGTHS, ROW_GOALS
from .format import table
from .sft_memory import sft_goal_row, sft_memory_section

__all__ = ["LONGEST_HEADER", "MEMORY_GOALS", "best_row_table", "host_memory_section", "levers_section",
           "longest_rows_caption", "memory_goal_rows", "memory_model_section", "memory_sections"]

MEMORY_GOALS = "memory for million-token rows"  # the topic of these goals (their heading)
EXACT_TOL = 1e-4  # float32, against the path without the lever (the tests' tolerance)
MODEL_TOL = 0.10  # the memory model against the exact tensor peaks
GOAL_GROWTH_KB = 96.0  # the recipe with checkpointing grows by at most this per token per rank
GOAL_TIME = 1.35  # the levers cost at most this x the step time of the path without them


def _status(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def _best_rows(model: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """The best configuration per model and GPU count of ``model``'s table."""
    return {(r["model"], r["gpus"]): r for r in model.get("best_rows", [])}


UNBOUNDED = 1 << 40  # longest_row's search end: a limit this long is none (no per-token term on that side)


def _mtok(n: int | None) -> str:
    return "" if n is None else "no limit" if n >= UNBOUNDED else f"{n / 1e6:.2f}M"


def _tok(n: int) -> str:
    return "no limit" if n >= UNBOUNDED else f"{n:,}"


def memory_goal_rows(levers: dict[str, Any] | None, model: dict[str, Any] | None,
                     sft: dict[str, Any] | None = None, host: dict[str, Any] | None = None) -> list[list[str]]:
    """``[goal, value, status]`` rows.

    Args:
        levers / model / sft / host: the results of ``memory_levers``, ``memory_model``, ``sft_memory`` and
            ``host_memory`` (``None``: missing, no rows of it).

    Returns:
        The rows.
    """
    rows: list[list[str]] = []
    if levers:
        lrows = levers["levers"]["rows"]
        worst = max(r["grad_err"] for r in lrows)
        rows.append(["every lever exact: loss and every gradient against the path without it (float32; the float64 "
                     "and SP 2 / 4 checks are tests/model/test_memory_levers.py)",
                     f"worst relative error {worst:.1e} over {len(lrows)} runs", _status(worst <= EXACT_TOL)])
        growth = (levers.get("recipe") or {}).get("--gradient_checkpointing")
        if growth:
            rows.append(["pretraining recipe with --gradient_checkpointing, SP 2 on 2 CPU processes: peak RSS growth "
                         f"≤ {GOAL_GROWTH_KB:.0f} KB per token per rank",
                         f"{growth['kb_per_token']:.1f} KB (no levers: "
                         f"{levers['recipe']['no levers']['kb_per_token']:.1f} KB)",
                         _status(growth["kb_per_token"] <= GOAL_GROWTH_KB)])
        by = {(r["tokens_per_rank"], r["scheme"]): r for r in lrows}
        ratios = [by[(t, "all")]["cpu_s"] / by[(t, "full")]["cpu_s"] for t, s in by if s == "all"]
        if ratios:
            rows.append([f"every lever costs ≤ {GOAL_TIME}× the step time without them (CPU, side by side)",
                         f"{min(ratios):.2f}–{max(ratios):.2f}× over {len(ratios)} row lengths",
                         _status(max(ratios) <= GOAL_TIME)])
        trl = [(by[(t, "chunked")]["peak_mib"] / by[(t, "trl_fused")]["peak_mib"]) for t, s in by if s == "trl_fused"]
        if trl:
            rows.append(["the chunked loss never worse than TRL's fused LM head (tensor peak, same model and rows)",
                         f"hf_hsap / TRL {min(trl):.2f}–{max(trl):.2f}", _status(max(trl) <= 1.0)])
        alst = [(by[(t, "all")]["peak_mib"] / by[(t, "alst")]["peak_mib"]) for t, s in by if s == "alst"]
        if alst:
            rows.append(["tensor peak with every lever vs DeepSpeed's ALST levers on the same model and rows",
                         f"hf_hsap / ALST {min(alst):.2f}–{max(alst):.2f}", _status(max(alst) <= 1.0)])
    if sft:
        rows.append(sft_goal_row(sft))
    if model:
        err = model["max_abs_error"]
        rows.append([f"memory model within {MODEL_TOL:.0%} of the exact tensor peaks",
                     f"worst {err:.1%} over {len(model['validation'])} configurations", _status(err <= MODEL_TOL)])
        best = _best_rows(model)
        for (name, gpus), goal in ROW_GOALS.items():
            r = best.get((name, gpus))
            if r is None:
                continue
            d = r.get("default") or r  # the shipped configs' pinned offload buffers
            text = (f"{r['tokens'] / 1e6:.2f}M (device {_mtok(r['device_tokens'])}, host {_mtok(r['host_tokens'])}: "
                    f"the {r['binds']} binds; {r['setting']}, offload {r['offload']}, {r['scheme']}; limited by "
                    f"{r['limiting_term']})")
            if r is not d and r["tokens"] > d["tokens"]:
                text += f"; with the shipped configs' pinned offload buffers: {d['tokens'] / 1e6:.2f}M"
            rows.append([f"predicted longest packed row, {name} on {gpus} × H100-80GB, every lever, a DGX-H100 "
                         f"node's host memory counted ≥ {goal / 1e6:g}M tokens", text, _status(r["tokens"] >= goal)])
    if host:
        err = host["max_abs_error"]
        rows.append([f"memory model's host memory within {host['tolerance']:.0%} of the measured peak resident set "
                     "of CPU training runs, on at least 8 configurations (malloc returning freed buffers: "
                     f"{_env(host)})", f"worst {err:.1%} over {len(host['validation'])} configurations (glibc's "
                     f"defaults, freed heap memory kept: worst {host['default_max_abs_error']:.1%})",
                     _status(err <= host["tolerance"] and len(host["validation"]) >= 8)])
    return rows


def _env(host: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in host["mmap_env"].items())


def host_memory_section(host: dict[str, Any]) -> str:
    """The host terms' validation: measured peak resident set against the model's host memory of CPU runs."""
    body = [[v["name"], f"{v['tokens']:,}", str(v["sp"]), f"{v['footprint_mib']:,.0f}",
             f"{v['tensors_measured_mib']:,.0f}", f"{v['tensors_predicted_mib']:,.0f}", f"{v['measured_mib']:,.0f}",
             f"{v['predicted_mib']:,.0f}", f"{v['error']:+.1%}", f"{v['default_measured_mib']:,.0f}",
             f"{v['default_error']:+.1%}"] for v in host["validation"]]
    return "\n\n".join([
        "## Host memory: the model against the peak resident set",
        f"Command: `{host['command']}` ({host['seconds']:.0f} s; also in `bash scripts/bench_memory.sh`). Each "
        f"configuration is a fresh CPU training run ({host['steps']} steps, SP 2 under torch.distributed.run on "
        "gloo); on CPU every tensor lives in host memory, so the model's host memory (`hf_hsap.memory.host."
        "host_memory(step, device=\"cpu\")`: the process's footprint plus every tensor term) is compared with the "
        "largest rank's peak resident set (`ru_maxrss`). The footprint is measured: the rank's resident set after "
        "its imports, process group, model build and levers, less the model's weights. On a GPU the footprint is a "
        "stated default and pinned buffers are rounded to powers of two: neither is exercised here. Each "
        f"configuration runs twice: with `{_env(host)}` (glibc maps every buffer of 128 KiB or more on its own and "
        "unmaps it when freed, so the resident set follows the live bytes the model counts: the goal's runs) and "
        "with glibc's defaults (its mmap threshold rises after large frees and the heap keeps freed pages: a CPU "
        "run's RSS also holds that retention, which the model does not count).",
        table(["configuration", "tokens", "SP", "footprint MiB", "tensors measured MiB", "tensors predicted MiB",
               "peak RSS MiB", "predicted MiB", "error", "glibc defaults: peak RSS MiB", "error"], body),
    ])


def memory_model_section(model: dict[str, Any]) -> str:
    """The memory model's validation and its longest rows."""
    val = [[v["name"], f"{v['tokens']:,}", str(v["sp"]), ", ".join(k for k, on in v["levers"].items() if on is True)
            or "none", f"{v['measured_mib']:.1f}", f"{v['predicted_mib']:.1f}", f"{v['error']:+.1%}"]
           for v in model["validation"]]
    longest = best_row_table(model)
    return "\n\n".join([
        "## Memory model and the longest row",
        f"Command: `{model.get('validation_command', model['command'])}` (also in `bash scripts/bench_memory.sh`). "
        "`hf_hsap.memory.model.predict_step_memory` against the exact tensor peak of one CPU step (TensorPeak; the "
        "weights and optimizer states that exist before the step are left out of both):",
        table(["configuration", "tokens", "SP", "levers", "measured MiB", "predicted MiB", "error"], val),
        f"Command: `{model['command']}`. " + longest_rows_caption(model) + " Host GiB: per node at the answer; host "
        "not counted: the longest device "
        "limit of every configuration searched.",
        table(LONGEST_HEADER + ["host GiB / node", "host not counted"], longest),
    ])


LONGEST_HEADER = ["model", "GPUs", "device limit", "host limit", "longest row", "binds", "levers", "offload",
                  "SAP setup", "limited by", "longest, pinned offload buffers", "ALST", "goal"]


def best_row_table(model: dict[str, Any], detail: bool = True) -> list[list[str]]:
    """One row per model and GPU count: the best configuration's device and host limits side by side."""
    out = []
    for r in model["best_rows"]:
        row = [r["model"], str(r["gpus"]), _tok(r["device_tokens"]), _tok(r["host_tokens"]), f"{r['tokens']:,}",
               r["binds"], r["setting"], r["offload"], r["scheme"], r["limiting_term"],
               f"{r['default']['tokens']:,}" if r.get("default") else "",
               f"{r['alst']:,}" if r.get("alst") else "",
               f"{r['goal']:,}" if r.get("goal") else ""]
        if detail:
            row += [f"{r['host_gib'].get('per_node', 0):,.0f}", f"{r['device_only']:,}"]
        out.append(row)
    return out


def longest_rows_caption(model: dict[str, Any]) -> str:
    """What the longest-row table assumes."""
    return (f"The longest packed row the model predicts (`hsap-plan --max-length`): H100 with "
            f"{model['gpu_memory_gib']:.0f} GiB per GPU less {model['reserve_gib']:.0f} GiB, a DGX-H100 node's "
            f"{model['host_memory_gib']:,.0f} GiB of host memory less {model['host_reserve_fraction']:.0%} for the OS "
            f"shared by {model['gpus_per_node']} GPU processes (1 GPU: the node's host for that one), "
            f"{model['footprint_gib']:g} GiB of each process's own; ZeRO-3, bf16 weights with float32 master weights "
            "and AdamW; the best of " + f"{len(model['settings'])} lever settings (all; all with the checkpoints "
            "kept on the GPU; all + the tiled attention with 1 to 4 layers per checkpoint and 0, 4 or 8 layers kept "
            "on the GPU, each with the engine's offload buffers pinned (the shipped configs) and unpinned; all = the "
            "chunked loss, checkpointing, activation offloading into hf_hsap's exactly sized slab, the tiled MLP and "
            "recomputed norms; offload buffers unpinned = \"pin_memory\": false in DeepSpeed's offload_optimizer / "
            "offload_param, CPUOffloadPolicy(pin_memory=False) for FSDP2), offloads (none, optimizer, params) and SAP setups per model and GPU count, the device's "
            "limit and the host's side by side (the row is the smaller); ALST's published figures beside.")


def memory_sections(res: dict[str, Any]) -> list[str]:
    """The sections of ``bash scripts/bench_memory.sh``: the levers, the SFT recipe, then the memory model.

    Args:
        res: a results dict with ``memory_levers`` / ``sft_memory`` / ``memory_model`` (any may be missing or
            ``None``).

    Returns:
        The markdown sections (empty when it has not run).
    """
    out = []
    if res.get("memory_levers"):
        out.append(levers_section(res["memory_levers"]))
    if res.get("sft_memory"):
        out.append(sft_memory_section(res["sft_memory"]))
    if res.get("memory_model"):
        out.append(memory_model_section(res["memory_model"]))
    if res.get("host_memory"):
        out.append(host_memory_section(res["host_memory"]))
    return out


def _fmt_mib(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.1f}"


def levers_section(res: dict[str, Any]) -> str:
    """The memory levers' section of the detail file ``benchmarks/results/memory.md``.

    Args:
        res: :func:`benchmarks.suites.memory_levers.main`'s results (``levers``, ``recipe``, ``seconds``; the results
            JSON).

    Returns:
        Markdown.
    """
    rows, lines = res["levers"]["rows"], []
    cfg = res["levers"]["config"]
    m = cfg["model"]
    lines += ["## Memory levers, measured side by side on CPU", "",
              "Schemes: `full` (full logits, no lever), `checkpointing`, `chunked` (hf_hsap's chunked loss), "
              "`trl_fused` (TRL's fused LM head, what `HSAPSFTTrainer` inherits), `checkpointing+chunked`, `all` "
              "(every hf_hsap lever that acts on CPU: chunked loss, checkpointing, tiled MLP, recomputed norms), "
              "`alst` (DeepSpeed's levers).", "",
              f"Command: `bash scripts/bench_memory.sh` (DeepSpeed's environment; {res['seconds']:.0f} s). SP "
              f"{cfg['world']} on gloo, Llama shape: vocabulary {m['vocab']:,}, hidden {m['hidden']}, {m['layers']} "
              f"layers, {m['heads']} / {m['kv_heads']} heads, MLP {m['inter']}; long-tail packed rows; float32. Peak: "
              "the exact tensor peak of one forward + backward on the busier rank (TensorPeak); time: its CPU time "
              f"(median of {cfg['reps']} interleaved rounds). Every scheme's loss and gradients are checked against "
              "`full` first (largest relative error in the last column). `alst`: DeepSpeed's `TiledMLP` + "
              "`TiledFusedLogitsLoss` + checkpointing" + ("" if res["levers"]["deepspeed"] == "ok" else
                                                          f" (not run: {res['levers']['deepspeed']})") + ".", ""]
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    lengths = list(dict.fromkeys(r["tokens_per_rank"] for r in rows))
    by = {(r["tokens_per_rank"], r["scheme"]): r for r in rows}
    lines += ["| scheme | " + " | ".join(f"MiB at {t:,}" for t in lengths) + " | " +
              " | ".join(f"time ×full at {t:,}" for t in lengths) + " | worst grad err |",
              "|---" * (2 * len(lengths) + 2) + "|"]
    for name in schemes:
        lines.append(f"| {name} | " + " | ".join(_fmt_mib(by[(t, name)]["peak_mib"]) for t in lengths) + " | " +
                     " | ".join(f"{by[(t, name)]['cpu_s'] / by[(t, 'full')]['cpu_s']:.2f}" for t in lengths) +
                     f" | {max(by[(t, name)]['grad_err'] for t in lengths):.1e} |")
    growth = res.get("recipe")
    if growth:
        lines += ["", "The pretraining recipe (tiny-llama, SP 2 on 2 CPU processes, rows of "
                  f"{RECIPE_LENGTHS[0]:,} and {RECIPE_LENGTHS[1]:,} tokens): the largest rank's peak resident set.", "",
                  "| run | RSS short (GiB) | RSS long (GiB) | tokens / rank short → long "
                  "| growth KB / token / rank |",
                  "|---|---|---|---|---|"]
        for name, g in growth.items():
            lines.append(f"| {name} | {g['short']['rss_gib']:.2f} | {g['long']['rss_gib']:.2f} | "
                         f"{g['short']['tokens_per_rank']:,.0f} → {g['long']['tokens_per_rank']:,.0f} | "
                         f"{g['kb_per_token']:.1f} |")
    return "\n".join(lines) + "\n"
