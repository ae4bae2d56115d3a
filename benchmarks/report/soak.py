"""The soak's detail file (``benchmarks/results/soak.md``) from its results JSON."""
from __future__ import annotations

from typing import Any

from ..analytic.soak import DRIFT_TOL, RSS_GROWTH_MIB

__all__ = ["soak_markdown"]


def soak_markdown(s: dict[str, Any]) -> str:
    """The soak's section (the detail file ``benchmarks/results/soak.md``).

    Args:
        s: what :func:`summarize` returns, with ``when``, ``commit`` and ``seconds`` (the results JSON).

    Returns:
        Markdown: the run and one row per bounded quantity.
    """
    return "\n".join([
        "## Soak: a long run with a new layout every step",
        "",
        f"`python -m benchmarks soak` ({s['when']}, commit {s.get('commit', '?')}): {s['steps']:,} training steps of "
        f"a 2-layer Llama on {s['world']} CPU ranks (SP {s['world']}, gloo), one packed row of {s['tokens']} tokens "
        f"with 3-16 random documents every step ({s['distinct_layouts']:,} distinct layouts: every step plans "
        f"anew). Loss {s['loss_first']:.3f} -> {s['loss_last']:.3f}.",
        "",
        "| quantity | value | bound |",
        "| --- | --- | --- |",
        f"| resident memory after the warm-up (step {s['warmup']}) | +{s['rss_growth_mib']:.1f} MiB "
        f"({s['rss_start_mib']:.0f} -> {s['rss_end_mib']:.0f} MiB) | <= +{RSS_GROWTH_MIB:.0f} MiB |",
        f"| plan cache entries (max) | {s['cache_max']} | <= {s['cache_maxsize']} (LRU size) |",
        f"| communication counters: peers (max) | {s['peers_max']} | <= {s['world']} |",
        f"| `log_once` cases added after the warm-up | {s['logged_growth']} | 0 |",
        f"| steps / s, 2nd quarter -> last quarter | {s['steps_per_s_q2']:.1f} -> {s['steps_per_s_q4']:.1f} "
        f"({s['drift'] * 100:+.1f}%) | within ±{DRIFT_TOL * 100:.0f}% |",
    ])
