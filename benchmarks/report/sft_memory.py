"""The SFT recipe's resident memory (``benchmarks/results/sft_memory.json`` of :mod:`benchmarks.suites.sft_memory`):
its goal row, its section of the detail file ``benchmarks/results/memory.md`` and its line in ``BENCHMARKS.md``'s
memory headline. Nothing is measured here."""
from __future__ import annotations

from typing import Any

from ..analytic.memory import SFT_CHUNKED, SFT_PRETRAIN, SFT_TRL
from .format import table

__all__ = ["GOAL_SFT_GROWTH_KB", "sft_goal_row", "sft_headline_line", "sft_memory_section"]

GOAL_SFT_GROWTH_KB = 24.0  # the SFT recipe with checkpointing grows by at most this per token per rank
_RUNS = {SFT_PRETRAIN: "`recipes/pretrain.py` (hf_hsap's chunked loss)",
         SFT_CHUNKED: "`recipes/sft_trl.py`, hf_hsap's chunked loss (default)",
         SFT_TRL: "`recipes/sft_trl.py --hsap_chunked_loss false`, TRL's fused LM head"}


def _rows_k(n: int) -> str:
    """A row length in units of 1,024 tokens (``16384 -> "16K"``)."""
    return f"{n / 1024:g}K"


def _same_losses(res: dict[str, Any]) -> bool:
    """Whether the two SFT loss paths gave the same losses at every row length."""
    return all(c["ok"] for c in res["same_losses"].values())


def _setup(res: dict[str, Any]) -> str:
    """The runs' setup in words."""
    cfg = res["config"]
    short, long = cfg["lengths"]
    return (f"--gradient_checkpointing, SP {res['processes']} on {res['processes']} CPU processes, "
            f"{cfg['vocab'] / 1e3:.0f}K vocabulary, rows of {_rows_k(short)} and {_rows_k(long)} tokens")


def sft_goal_row(res: dict[str, Any]) -> list[str]:
    """The goal row ``[goal, value, status]``: the SFT recipe's growth with hf_hsap's chunked loss, TRL's fused LM
    head's beside it; met when the growth is within :data:`GOAL_SFT_GROWTH_KB` and both loss paths agree.

    Args:
        res: the suite's results.

    Returns:
        The row.
    """
    v, same = res["variants"], _same_losses(res)
    kb = v[SFT_CHUNKED]["kb_per_token"]
    return [f"SFT recipe with {_setup(res)}: peak RSS growth ≤ {GOAL_SFT_GROWTH_KB:.0f} KB per token per rank",
            f"{kb:.1f} KB (TRL's fused LM head: {v[SFT_TRL]['kb_per_token']:.1f} KB; "
            f"{'same losses' if same else 'losses differ'})",
            "**met**" if kb <= GOAL_SFT_GROWTH_KB and same else "**not met**"]


def sft_headline_line(res: dict[str, Any]) -> str:
    """The memory headline's line on the SFT recipe.

    Args:
        res: the suite's results.

    Returns:
        One markdown line.
    """
    v = res["variants"]
    return (f"The SFT recipe's peak resident set (`{res['command']}`: {_setup(res)}) grows by "
            f"{v[SFT_CHUNKED]['kb_per_token']:.1f} KB per token per rank with hf_hsap's chunked loss and "
            f"{v[SFT_TRL]['kb_per_token']:.1f} KB with TRL's fused LM head "
            f"({'same losses' if _same_losses(res) else 'losses differ'}); the pretraining recipe: "
            f"{v[SFT_PRETRAIN]['kb_per_token']:.1f} KB.")


def sft_memory_section(res: dict[str, Any]) -> str:
    """The SFT recipe's section of the detail file ``benchmarks/results/memory.md``.

    Args:
        res: the suite's results.

    Returns:
        Markdown.
    """
    cfg = res["config"]
    body = [[_RUNS.get(name, name), f"{g['short']['rss_gib']:.2f}", f"{g['long']['rss_gib']:.2f}",
             f"{g['short']['tokens_per_rank']:,.0f} → {g['long']['tokens_per_rank']:,.0f}",
             f"{g['kb_per_token']:.1f}", " / ".join(f"{x:.4f}" for x in g["long"]["loss"])]
            for name, g in res["variants"].items()]
    checks = "; ".join(f"{int(n):,} tokens: {c['max_rel_err']:.1e}" for n, c in res["same_losses"].items())
    return "\n\n".join([
        "## The SFT recipe's resident memory: hf_hsap's chunked loss against TRL's fused LM head",
        f"Command: `{res['command']}` ({res['seconds']:.0f} s; also in `bash scripts/bench_memory.sh`). Every run: "
        f"the same {cfg['model']}, {_setup(res)}, {cfg['steps']} steps; "
        "the largest rank's peak resident set (GiB) and its growth per token per rank between the two rows. TRL's "
        "fused LM head is the loss path TRL's own `SFTTrainer` runs. The pretraining recipe deals whole documents "
        "(about a row's worth per step), so its rows hold fewer tokens; the growth is per token it held.",
        table(["run", "RSS short (GiB)", "RSS long (GiB)", "tokens / rank short → long", "growth KB / token / rank",
               "losses at the long row"], body),
        f"The two SFT loss paths' losses, step by step (largest relative difference): {checks} — "
        + ("the same." if _same_losses(res) else "**they differ**."),
    ])
