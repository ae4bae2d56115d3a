"""A VLM training step under SP on CPU: per-rank tensor peak and step time of one forward + backward of a
Qwen2.5-VL on one packed image + text row at SP 1, 2 and 4, vision tower included, hf_hsap beside a baseline where
every rank encodes every image of the row (:mod:`benchmarks.suites.vlm_workers`, whose two schemes are checked equal first);
and a long video row at SP 2 and 4 whose videos are split across ranks: each split video encoded once and its rows
sent (``vision_encoding="once"``), by every holder (``"holders"``), and by every rank (the baseline), on the plan of
the decoder's work alone, and the first two again on the plan that weighs each rank's encoder work too
(``vision_balance``, the default).

Each SP size runs on its own spawned gloo ranks (SP = world size). Per scheme and rank: the exact tensor peak of one
step (:class:`benchmarks.tensor_memory.TensorPeak`, in its own untimed step), the CPU time of a step (median of the
interleaved timed rounds after a warm-up), the images and pixel rows its vision tower encodes, and the vision tower's
own forward + backward time on those pixels. Reported: the busiest rank (max over ranks).

Usage: ``python -m benchmarks vlm [--quick] [--video-only] [--out benchmarks/results/vlm_step.json] [--no-write-md]``
(``bash scripts/bench_vlm.sh``; ``--video-only``: the long video row alone, its rows replaced in the results at
``--out``, the image rows kept). Writes the results JSON; the entry point then renders it
(:func:`benchmarks.report.vlm.vlm_section`) into the detail file ``benchmarks/results/vlm.md`` and
``BENCHMARKS.md``'s headline.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from hf_hsap.testing import DistPools

from . import vlm_workers as vw
from .output import RESULTS, Outcome, step_main

DEFAULT_OUT = RESULTS / "vlm_step.json"
# (text before, image grid (t, h, w) in patches or None, text after) per document: about a third placeholders
SHAPES = ((300, (1, 48, 48), 200), (150, (1, 32, 40), 250), (400, None, 300), (100, (1, 32, 32), 120),
          (60, (1, 24, 24), 80), (200, (1, 16, 24), 150), (50, (1, 16, 16), 90), (90, None, 84))

# the long video row: (text before, video grid (t, h, w) in patches, text after); at SP 4 the first two videos are
# split across ranks and the busiest holder of "every holder encodes" holds pieces of both
VIDEO_SHAPES = ((20, (4, 24, 32), 10), (20, (4, 24, 32), 10), (20, (4, 16, 32), 10))


@dataclass(frozen=True)
class VLMStepConfig:
    """What :func:`run_vlm_step` measures.

    Attributes:
        sp_sizes: the SP sizes (each its own world). text / vision: the fields of the model's text config and
        vision tower that differ from :func:`hf_hsap.examples.vlm.tiny_vlm_config` (see
        :func:`benchmarks.suites.vlm_workers.model_config`). vocab: text vocabulary. shapes: the row's documents.
        pad_to: the row length's multiple (the same row at every SP size). reps: timed rounds (0: memory only).
        seed: weights, tokens and pixels. loss_tol: largest difference of the two schemes' losses.
        video: the long video row's documents (:data:`VIDEO_SHAPES`); video_sp_sizes: its SP sizes (empty: not run).
    """

    sp_sizes: tuple[int, ...] = (1, 2, 4)
    text: dict[str, Any] = field(default_factory=lambda: dict(
        hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
        head_dim=32, max_position_embeddings=8192, mrope_section=(4, 6, 6)))
    vision: dict[str, Any] = field(default_factory=lambda: dict(
        depth=4, hidden_size=128, intermediate_size=384, num_heads=4, window_size=16, fullatt_block_indexes=(1, 3)))
    vocab: int = 4096
    shapes: tuple[tuple[int, tuple[int, int, int] | None, int], ...] = SHAPES
    pad_to: int = 4
    reps: int = 5
    seed: int = 0
    loss_tol: float = 1e-5
    video: tuple[tuple[int, tuple[int, int, int], int], ...] = VIDEO_SHAPES
    video_sp_sizes: tuple[int, ...] = (2, 4)

    def quick(self) -> "VLMStepConfig":
        """Tiny sizes at SP 1 and 2, memory only: a smoke run of a few seconds."""
        return dataclasses.replace(self, sp_sizes=(1, 2), text={}, vision={}, vocab=128, reps=0,
                                   shapes=((6, (1, 8, 8), 5), (3, None, 4), (2, (1, 4, 4), 3), (4, (1, 4, 8), 2)),
                                   video=((3, (2, 8, 8), 2), (3, (2, 8, 8), 2), (2, (2, 4, 8), 2)),
                                   video_sp_sizes=(2,))


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _scheme_row(rs: list[dict[str, Any]]) -> tuple[dict[str, Any], list, list]:
    """What every row reports of one scheme over its ranks' results ``rs``: the busiest rank's peak, step and vision
    CPU seconds (medians), the wall seconds of rank 0, tokens, loss and the worst errors; and the per-rank medians of
    the step and vision times."""
    times = [_median(r["cpu_s"]) for r in rs]
    vision = [_median(r["vision_cpu_s"]) for r in rs]
    row = {"peak_mib": max(r["peak_bytes"] for r in rs) / 2**20,
           "peak_mib_ranks": [r["peak_bytes"] / 2**20 for r in rs],
           "cpu_s": None if None in times else max(times), "wall_s": _median(rs[0]["wall_s"]),
           "vision_cpu_s": None if None in vision else max(vision),
           "pixel_rows": [r["pixel_rows"] for r in rs], "tokens": [r["tokens"] for r in rs], "loss": rs[0]["loss"],
           "loss_err": max(r["loss_err"] for r in rs), "grad_err": max(r["grad_err"] for r in rs)}
    return row, times, vision


def _summary(sp_size: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One SP size's row of the results from every rank's :func:`benchmarks.suites.vlm_workers.run_sp`."""
    row: dict[str, Any] = {"sp": sp_size}
    for name in vw.SCHEMES:
        rs = [r[name] for r in ranks]
        row[name], _, _ = _scheme_row(rs)
        row[name].update(images=[r["images"] for r in rs], at_peak=rs[0]["at_peak"])
    return row


def _video_summary(sp_size: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One SP size's row of the long video row from every rank's :func:`benchmarks.suites.vlm_workers.run_video`."""
    row: dict[str, Any] = {"sp": sp_size, "auto": ranks[0]["auto"]}
    for name in vw.VIDEO_SCHEMES:
        rs = [r[name] for r in ranks]
        row[name], times, vision = _scheme_row(rs)
        row[name].update(cpu_s_ranks=times, vision_cpu_s_ranks=vision, videos=[r["videos"] for r in rs],
                         sent=[r["sent"] for r in rs], received=[r["received"] for r in rs],
                         predicted=rs[0]["predicted"])
    return row


def video_facts(cfg: VLMStepConfig) -> dict[str, int]:
    """Tokens, videos, placeholders and pixel rows of the long video row (no model needed)."""
    merge = model_facts(cfg)["merge"]
    pixels = sum(t * h * w for _, (t, h, w), _ in cfg.video)
    tokens = sum(a + b + 2 + t * h * w // merge for a, (t, h, w), b in cfg.video)
    return {"tokens": -(-tokens // cfg.pad_to) * cfg.pad_to, "videos": len(cfg.video), "placeholders": pixels // merge,
            "pixel_rows": pixels}


def row_facts(cfg: VLMStepConfig) -> dict[str, int]:
    """Tokens, documents, images, placeholders and pixel rows of the configuration's row (no model needed)."""
    merge = model_facts(cfg)["merge"]
    grids = [g for _, g, _ in cfg.shapes if g]
    pixels = sum(t * h * w for t, h, w in grids)
    tokens = sum(a + b + (2 + t * h * w // merge if g else 0) for a, g, b in cfg.shapes
                 for t, h, w in [g or (0, 0, 0)])
    return {"tokens": -(-tokens // cfg.pad_to) * cfg.pad_to, "documents": len(cfg.shapes), "images": len(grids),
            "placeholders": pixels // merge, "pixel_rows": pixels}


def model_facts(cfg: VLMStepConfig) -> dict[str, Any]:
    """The sizes of the configuration's model, read from its Transformers config (no model built)."""
    c = vw.model_config(cfg.text, cfg.vision, cfg.vocab)
    t, v = c.text_config, c.vision_config
    return {"hidden": t.hidden_size, "layers": t.num_hidden_layers, "heads": t.num_attention_heads,
            "kv_heads": t.num_key_value_heads, "mlp": t.intermediate_size, "vocab": t.vocab_size,
            "vision_depth": v.depth, "vision_hidden": v.hidden_size, "vision_heads": v.num_heads,
            "vision_mlp": v.intermediate_size, "merge": v.spatial_merge_size ** 2}


def run_vlm_step(cfg: VLMStepConfig, pools: DistPools | None = None, timeout_s: float = 3600.0) -> dict[str, Any]:
    """Every SP size of ``cfg`` (module docstring).

    Args:
        cfg: what to measure; pools: spawned gloo ranks to use (default: fresh ones, closed at the end);
        timeout_s: how long one SP size may take (the hang guard).

    Returns:
        ``{"config", "model", "row", "rows": [{"sp", "hf_hsap": {...}, "baseline": {...}}], "seconds"}``.
    """
    t0 = time.perf_counter()
    own = pools is None
    pools = DistPools(timeout_s=timeout_s, pg_timeout_s=timeout_s) if own else pools
    rows, video_rows, facts = [], [], row_facts(cfg)
    try:
        for sp_size in cfg.sp_sizes:
            ranks = pools.get(sp_size, timeout_s=timeout_s).run(vw.run_sp, dataclasses.asdict(cfg), sp_size, cfg.reps)
            rows.append(_summary(sp_size, ranks))
            base = rows[-1]["baseline"]
            assert sum(base["tokens"]) == facts["tokens"] and base["pixel_rows"][0] == facts["pixel_rows"], \
                f"the row is not the configuration's: {base['tokens']} tokens, {base['pixel_rows']} pixel rows"
        for sp_size in cfg.video_sp_sizes:
            ranks = pools.get(sp_size, timeout_s=timeout_s).run(vw.run_video, dataclasses.asdict(cfg), sp_size,
                                                                cfg.reps)
            video_rows.append(_video_summary(sp_size, ranks))
            base = video_rows[-1]["baseline"]
            assert sum(base["tokens"]) == video_facts(cfg)["tokens"], f"the video row has {base['tokens']} tokens"
    finally:
        if own:
            pools.close()
    return {"config": dataclasses.asdict(cfg), "model": model_facts(cfg), "row": facts, "rows": rows,
            "video_row": video_facts(cfg), "video_rows": video_rows, "seconds": time.perf_counter() - t0}


def _video_only(out: str) -> Any:
    """``run`` of ``--video-only``: the long video row of ``cfg`` measured alone, merged into the results at
    ``out`` (their image rows and configuration kept, with the image rows' date, commit and seconds as
    ``rows_stamp``; the video fields replaced, this run's seconds as ``video_seconds``)."""
    def run(cfg: VLMStepConfig) -> dict[str, Any]:
        old = json.loads(Path(out).read_text())
        new = run_vlm_step(dataclasses.replace(cfg, sp_sizes=()))
        config = {**old["config"], **{k: new["config"][k] for k in ("video", "video_sp_sizes")}}
        rows_stamp = old.get("rows_stamp") or {k: old[k] for k in ("date", "commit", "seconds") if k in old}
        return {**old, "config": config, "video_row": new["video_row"], "video_rows": new["video_rows"],
                "video_seconds": new["seconds"], "rows_stamp": rows_stamp}
    return run


def main(argv: Sequence[str]) -> Outcome:
    """``python -m benchmarks vlm`` with the command line ``argv`` (:func:`benchmarks.suites.output.step_main`;
    ``--video-only``: :func:`_video_only`)."""
    argv = list(argv)
    video_only = "--video-only" in argv
    if video_only:
        argv.remove("--video-only")
        out = argv[argv.index("--out") + 1] if "--out" in argv else str(DEFAULT_OUT)
    return step_main(argv, suite="vlm", description=__doc__.split("\n")[0],
                     config=lambda quick: VLMStepConfig().quick() if quick else VLMStepConfig(),
                     run=_video_only(out) if video_only else run_vlm_step,
                     out=DEFAULT_OUT, quick_help="tiny sizes, SP 1 and 2, memory only")
