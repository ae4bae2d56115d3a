"""``BENCHMARKS.md``: the one page a user reads. A short header (machine, software, when and at which commit each
command measured), the goals met or not, then headline tables, each after the command that made it
(:mod:`benchmarks.report.headlines`: against the peers, memory and the longest row, planning time, the placement
sweep, model coverage), and the list of detail files (:data:`benchmarks.report.registry.DETAILS`), which hold the full
tables. Every figure is read from the results JSON (:func:`benchmarks.report.sources.load_results`);
:func:`benchmarks.report.publish.publish` writes the page.
"""
from __future__ import annotations

from typing import Any

from . import format as rp
from .headlines import coverage_headline, memory_headline, peers_headline, planning_headline, run_cmd, sweep_headline
from .details import CORE_GOALS, busy, calibration_note, core_goal_rows
from .memory import MEMORY_GOALS, memory_goal_rows
from .placement_goals import PLACEMENT_GOALS, placement_goal_rows
from .registry import DETAILS
from .sources import HYBRID_CMD, MEMORY_CMD, PEERS_CMD, SOAK_CMD, VLM_CMD

__all__ = ["MAX_LINES", "render_page"]

MAX_LINES = 300  # the page's length limit (the tests hold it)


def _when(d: dict[str, Any]) -> str:
    """When a result was measured.

    Args:
        d: a results dict (its own ``date`` / ``when``, or its ``meta`` / ``header``'s).

    Returns:
        ``"date, commit `hash`"``, or ``"date not recorded"``.
    """
    for src in (d, d.get("meta") or {}, d.get("header") or {}):
        date = src.get("date") or src.get("when")
        if date:
            commit = src.get("commit")
            return f"{date}" + (f", commit `{commit}`" if commit else "")
    return "date not recorded"


def _header(res: dict[str, Any]) -> list[str]:
    """Title, how the page is made, machine, software and the data's commands with their dates.

    Args:
        res: :func:`benchmarks.report.sources.load_results`'s dict.

    Returns:
        The header's lines.
    """
    m = res["meta"]
    peers, lev, mod = res.get("peers"), res.get("memory_levers"), res.get("memory_model")
    zoo = (res.get("model_zoo") or {}).get("header") or {}
    soft = [f"torch {m['torch']}, numpy {m['numpy']}, Python {m['python']}"]
    if peers:
        soft.append(f"DeepSpeed {peers.get('deepspeed') or 'not installed'} (peers)")
    if zoo:
        soft.append(f"Transformers {zoo['transformers']} (model zoo)")
    data = [f"{run_cmd(res)}: {_when(res)}, {m['seconds']:.0f} s; load average (1 min) {m['load_start'][0]:.1f} → "
            f"{m['load_end'][0]:.1f}" + (" (other jobs shared the machine: wall times are noisy)" if busy(m) else "")]
    if peers:
        pm, pe = peers["machine"], peers.get("machine_end", peers["machine"])
        noisy = max(pm["load"][0], pe["load"][0]) > (pm["cores"] or 1)
        data.append(f"`{PEERS_CMD}` (`{peers['command']}`): {_when(peers)}, {peers['seconds']:.0f} s; load average "
                    f"(1 min) {pm['load'][0]:.1f} → {pe['load'][0]:.1f}"
                    + (" (other jobs shared the machine: wall times are noisy)" if noisy else ""))
    if lev or mod:
        data.append(f"`{MEMORY_CMD}`: " + "; ".join(f"{name} {_when(d)}, {d['seconds']:.0f} s" for name, d in
                                               (("levers", lev), ("memory model", mod)) if d))
    for key, cmd in (("vlm_step", f"`{VLM_CMD}`"), ("hybrid_step", f"`{HYBRID_CMD}`"),
                     ("recurrent_split", f"`{HYBRID_CMD}` (recurrent split step)"), ("soak", f"`{SOAK_CMD}`")):
        if res.get(key) and res[key].get("video_seconds"):  # the long video row measured alone (--video-only)
            rows = res[key].get("rows_stamp")
            data.append(f"{cmd} `--video-only` (the long video row): {_when(res[key])}, "
                        f"{res[key]['video_seconds']:.0f} s; the image rows: "
                        + (f"{_when(rows)}, {rows['seconds']:.0f} s" if rows else
                           f"an earlier full run, {res[key]['seconds']:.0f} s"))
        elif res.get(key):
            data.append(f"{cmd}: {_when(res[key])}, {res[key]['seconds']:.0f} s")
    for key in ("model_zoo", "vlm_zoo"):
        if res.get(key):
            h = res[key]["header"]
            data.append(f"`{h['command']}`: {_when(res[key])}, {h['seconds']:.0f} s")
    return [
        "# hf_hsap benchmarks", "",
        "Headline figures on the work of the benchmark spec (`benchmarks/SPEC.md`); each table follows the command "
        "that made it, and the [detail files](#detail) hold the full tables. Generated from the JSON in `benchmarks/results/` by `python -m benchmarks report`, which "
        "each `benchmarks` command below runs after it measures (after the zoo scripts, run it yourself; "
        "`python -m benchmarks report --plots` also redraws the plots); do not edit by hand.", "",
        f"- **Machine**: {m['cpu']}, {m['cores']} cores, CPU only. {calibration_note(res)}",
        f"- **Software**: {'; '.join(soft)}.",
        "- **Data** (command: date, commit, duration):",
        *(f"  - {line}" for line in data),
    ]


def _goals(res: dict[str, Any], links: dict[str, str]) -> list[str]:
    """One short table per topic: goal and status (the figures are in the goals detail file).

    Args:
        res: the results dict. links: detail file name → link.

    Returns:
        The section's lines.
    """
    out = ["## Goals", "", "Every goal these benchmarks answer, met or not; "
           + (f"[goals.md]({links['goals']}) gives the figures each is judged on." if "goals" in links else "")]
    tables = ((CORE_GOALS, f"Command: {run_cmd(res)}.", core_goal_rows(res)),
              (PLACEMENT_GOALS, f"Command: {run_cmd(res)} for the sweep and planning rows, `{PEERS_CMD}` for the rows "
                                "against DeepSpeed.", placement_goal_rows(res)),
              (MEMORY_GOALS, f"Command: `{MEMORY_CMD}`.",
               memory_goal_rows(res.get("memory_levers"), res.get("memory_model"), res.get("sft_memory"),
                                res.get("host_memory"))))
    for topic, command, rows in tables:
        if rows:
            out += ["", f"### Goals: {topic}", "", command, "",
                    rp.table(["goal", "status"], [[g, s.split(";")[0]] for g, _, s in rows])]
    return out


def _detail_list(links: dict[str, str], models_link: str) -> list[str]:
    """The page's last section: one line per detail file.

    Args:
        links: detail file name → link (the files written). models_link: MODELS.md relative to the page.

    Returns:
        The section's lines.
    """
    out = ["## Detail", ""]
    out += [f"- [{d.title}]({links[d.name]}): {d.command_text()}" for d in DETAILS if d.name in links]
    return out + [f"- [Model zoo, every family]({models_link}): `python scripts/model_zoo.py`, "
                  "`python scripts/vlm_zoo.py`"]


def render_page(res: dict[str, Any], links: dict[str, str], models_link: str = "MODELS.md") -> str:
    """The whole ``BENCHMARKS.md``.

    Args:
        res: :func:`benchmarks.report.sources.load_results`'s dict (the main run's results with ``meta``, and the side
            results, ``None`` where missing). links: detail file name → its path relative to the page (only the
            files written). models_link: MODELS.md relative to the page.

    Returns:
        Markdown of at most :data:`MAX_LINES` lines.

    Raises:
        ValueError: when the page would be longer than :data:`MAX_LINES`.
    """
    parts = [_header(res), _goals(res, links), peers_headline(res), memory_headline(res), planning_headline(res),
             sweep_headline(res), coverage_headline(res, models_link), _detail_list(links, models_link)]
    text = "\n\n".join("\n".join(p) for p in parts if p) + "\n"
    if text.count("\n") > MAX_LINES:
        raise ValueError(f"BENCHMARKS.md would have {text.count(chr(10))} lines (at most {MAX_LINES}): move a table "
                         "to a detail file")
    return text
