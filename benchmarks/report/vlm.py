"""The VLM training step in markdown: the detail file ``benchmarks/results/vlm.md`` from its results JSON
(:func:`benchmarks.suites.vlm_step.run_vlm_step`'s)."""
from __future__ import annotations

from typing import Any

from .format import mib, ratio, secs

__all__ = ["vlm_section"]


def vlm_section(res: dict[str, Any]) -> str:
    """The markdown of the detail file ``benchmarks/results/vlm.md`` from :func:`benchmarks.suites.vlm_step.run_vlm_step`'s results."""
    cfg, row, m = res["config"], res["row"], res["model"]
    hs, bl = "hf_hsap", "baseline"
    worst_loss = max(r[bl]["loss_err"] for r in res["rows"])
    worst_grad = max(r[bl]["grad_err"] for r in res["rows"])
    lines = ["## VLM training step", "",
             f"`bash scripts/bench_vlm.sh` ({res['seconds']:.0f} s): one forward + backward (the model's loss) of a "
             f"random Qwen2.5-VL, text hidden {m['hidden']}, {m['layers']} layers, {m['heads']} / {m['kv_heads']} "
             f"heads, MLP {m['mlp']}, vocabulary {m['vocab']:,}; vision tower depth {m['vision_depth']}, hidden "
             f"{m['vision_hidden']}, {m['vision_heads']} heads, MLP {m['vision_mlp']}; float32, `hsap` attention. One "
             f"packed row of {row['tokens']:,} tokens: {row['documents']} documents, {row['images']} images, "
             f"{row['placeholders']:,} image placeholders, {row['pixel_rows']:,} pixel rows. SP = world size on "
             "spawned gloo ranks (CPU). `baseline`: every rank encodes every image and merges it into the global "
             "row's embeddings; a pre-hook on the language model then cuts `inputs_embeds` and `position_ids` to "
             f"the rank's tokens (the same plan). Its loss equals hf_hsap's within {worst_loss:.1e} and the SP "
             f"group's summed gradients within {worst_grad:.1e} (relative). Peak: the exact tensor peak of one step "
             f"(TensorPeak); time: CPU time of one step, median of {cfg['reps']} interleaved rounds after a "
             "warm-up; vision: the vision tower's forward + backward alone on the pixels the rank encodes; "
             "busiest rank of each. Ratio = hf_hsap / baseline. hf_hsap encodes an image split across ranks on "
             "each holder or once (its rows sent), as the default `vision_encoding=\"auto\"` prices it: pixel "
             "rows encoded summed over ranks " + ", ".join(
                 f"{sum(r[hs]['pixel_rows']):,} at SP {r['sp']}" for r in res["rows"]) +
             f" (the row has {row['pixel_rows']:,}).", "",
             "| SP | peak MiB hf_hsap | baseline | ratio | step s hf_hsap | baseline | ratio | vision s hf_hsap "
             "| baseline | images (pixel rows) per rank hf_hsap | baseline |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        a, b = r[hs], r[bl]
        lines.append(f"| {r['sp']} | {mib(a['peak_mib'])} | {mib(b['peak_mib'])} | "
                     f"{ratio(a['peak_mib'], b['peak_mib'])} | {secs(a['cpu_s'])} | {secs(b['cpu_s'])} | "
                     f"{ratio(a['cpu_s'], b['cpu_s'])} | {secs(a['vision_cpu_s'])} | {secs(b['vision_cpu_s'])} | "
                     f"{_encoded(a)} | {_encoded(b)} |")
    return "\n".join(lines + _video_lines(res)) + "\n"


def _video_lines(res: dict[str, Any]) -> list[str]:
    """The long video row's table (results without one: none): one line per SP size and scheme present."""
    if not res.get("video_rows"):
        return []
    v, cfg = res["video_row"], res["config"]
    names = [n for n in _VIDEO_SCHEMES if n in res["video_rows"][0]]
    seconds = f" ({res['video_seconds']:.0f} s, `--video-only`)" if res.get("video_seconds") else ""
    lines = ["", "### Long video row", "",
             f"One packed row{seconds} of {v['tokens']:,} tokens: {v['videos']} videos, {v['placeholders']:,} video "
             f"placeholders, {v['pixel_rows']:,} pixel rows (grids {', '.join(str(tuple(g)) for _, g, _ in cfg['video'])}"
             "), split across ranks by the plan. `once`: a video split across ranks is encoded by one holder (the "
             "least encoder work so far) and the others receive their feature rows (`HSAPConfig(vision_encoding="
             "\"once\")`, `hf_hsap.multimodal.exchange`); `holders`: every holder encodes it whole; `baseline`: "
             "every rank encodes every video (the tower replicated). Plan `decoder`: the placement weighs the "
             "decoder's work alone (`vision_balance=False`); `enc + dec`: it also weighs each rank's encoder work "
             "(`vision_balance=True`, the default; `hf_hsap.plan.items`, the per-patch work stated from the tower's "
             "shape, not calibrated). `auto` is what the default picks from the rule's prices (their constants are "
             "stated, not calibrated on a GPU). Losses equal within "
             f"{max(r[s]['loss_err'] for r in res['video_rows'] for s in names):.1e}, "
             "the group's summed gradients within "
             f"{max(r[s]['grad_err'] for r in res['video_rows'] for s in names):.1e} "
             "(relative). Busiest rank's CPU time per step, vision tower time and tensor peak; tokens, pixel rows "
             "encoded and feature rows received per rank; spread: the busiest rank's over the least busy rank's "
             "encoder + decoder time, predicted by the planner's model (the schemes that shard the tower) and measured "
             "(CPU time of a step).", "",
             "| SP | auto | scheme | plan | step s | vision s | peak MiB | tokens per rank | pixel rows per rank "
             "| rows received | spread predicted | spread measured |",
             "|---:|---|---|---|---:|---:|---:|---|---|---|---:|---:|"]
    for r in res["video_rows"]:
        for name in names:
            x = r[name]
            scheme, _, balanced = name.partition("_")
            lines.append(f"| {r['sp']} | {r['auto']} | {scheme} | {'enc + dec' if balanced else 'decoder'} | "
                         f"{secs(x['cpu_s'])} | {secs(x['vision_cpu_s'])} | {mib(x['peak_mib'])} | "
                         f"{_ints(x['tokens'])} | {_ints(x['pixel_rows'])} | "
                         f"{_ints(x['received']) if scheme == 'once' else '–'} | "
                         f"{_spread(x.get('predicted')) if scheme != 'baseline' else '–'} | "
                         f"{_spread(x.get('cpu_s_ranks'))} |")
    return lines


_VIDEO_SCHEMES = ("once", "once_balanced", "holders", "holders_balanced", "baseline")  # the table's order


def _ints(xs: list[int]) -> str:
    return ", ".join(f"{x:,}" for x in xs)


def _spread(xs: list[float] | None) -> str:
    """``max / min`` of per-rank figures (``–``: none, or a rank without)."""
    if not xs or None in xs or min(xs) <= 0:
        return "–"
    return f"{max(xs) / min(xs):.2f}"


def _encoded(s: dict[str, Any]) -> str:
    i = max(range(len(s["pixel_rows"])), key=lambda r: s["pixel_rows"][r])
    return f"{s['images'][i]} ({s['pixel_rows'][i]:,})"
