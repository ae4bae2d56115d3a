"""The SFT recipe's resident memory (benchmarks/suites/sft_memory.py, benchmarks/report/sft_memory.py): the runs the
suite launches, its loss check, and the goal row, detail section and headline line rendered from hand-made results
(the suite itself takes minutes: it is run by ``python -m benchmarks sft_memory``, not here)."""
from __future__ import annotations

import json
from pathlib import Path

from benchmarks.__main__ import SUITES
from benchmarks.analytic.memory import SFT_CHUNKED, SFT_PRETRAIN, SFT_TRL, SFT_VARIANTS
from benchmarks.report.headlines import memory_headline
from benchmarks.report.memory import memory_goal_rows, memory_sections
from benchmarks.report.sft_memory import GOAL_SFT_GROWTH_KB
from benchmarks.suites import sft_memory
from benchmarks.suites.sft_memory import SftMemoryConfig, recipe_args, loss_check


def _results(chunked_kb: float, *, same: bool = True) -> dict:
    def run(kb: float, loss: float) -> dict:
        short = {"rss_gib": 1.0, "tokens_per_rank": 2048.0, "loss": [loss, loss - 0.1]}
        long = {"rss_gib": 1.0 + kb * 1e3 * 6144 / 2**30, "tokens_per_rank": 8192.0, "loss": [loss, loss - 0.2]}
        return {"short": short, "long": long, "kb_per_token": kb}

    return {"config": {"lengths": [4096, 16384], "vocab": 49152, "model": "tiny-llama", "steps": 3, "rows_per_step": 2},
            "processes": 2, "variants": {SFT_PRETRAIN: run(4.0, 10.9), SFT_CHUNKED: run(chunked_kb, 10.8),
                                         SFT_TRL: run(183.0, 10.8)},
            "same_losses": {"4096": {"max_rel_err": 1e-7, "ok": True},
                            "16384": {"max_rel_err": 1e-7 if same else 1e-3, "ok": same}},
            "seconds": 480.0, "command": "python -m benchmarks sft_memory", "date": "d", "commit": "c"}


def test_the_goal_is_met_only_within_its_growth_and_with_the_same_losses() -> None:
    (met,) = memory_goal_rows(None, None, _results(5.3))
    assert met[0] == ("SFT recipe with --gradient_checkpointing, SP 2 on 2 CPU processes, 49K vocabulary, rows of 4K "
                      f"and 16K tokens: peak RSS growth ≤ {GOAL_SFT_GROWTH_KB:.0f} KB per token per rank")
    assert met[1] == "5.3 KB (TRL's fused LM head: 183.0 KB; same losses)" and met[2] == "**met**"
    (over,) = memory_goal_rows(None, None, _results(GOAL_SFT_GROWTH_KB + 0.1))
    assert over[2] == "**not met**"
    (differ,) = memory_goal_rows(None, None, _results(5.3, same=False))
    assert differ[2] == "**not met**" and "losses differ" in differ[1]


def test_the_section_and_the_headline_show_every_run_and_name_the_command() -> None:
    res = _results(5.3)
    (text,) = memory_sections({"sft_memory": res})
    assert "Command: `python -m benchmarks sft_memory`" in text
    rows = [line for line in text.splitlines() if line.startswith("| `recipes/")]
    assert len(rows) == 3 and "--hsap_chunked_loss false" in rows[2]
    assert rows[1].split(" | ")[4] == "5.3" and rows[2].split(" | ")[4] == "183.0"
    assert "2,048 → 8,192" in rows[0] and "the same." in text
    assert "**they differ**" in memory_sections({"sft_memory": _results(5.3, same=False)})[0]
    head = "\n".join(memory_headline({"sft_memory": res}))
    assert "5.3 KB per token per rank with hf_hsap's chunked loss and 183.0 KB with TRL's fused LM head" in head
    assert "`python -m benchmarks sft_memory`" in head and "pretraining recipe: 4.0 KB" in head
    assert memory_headline({}) == []


def test_the_suite_runs_each_variant_on_the_same_model_and_checks_the_losses() -> None:
    cfg, model = SftMemoryConfig(), Path("/m")
    runs = {v: recipe_args(v, 4096, model, cfg) for v in SFT_VARIANTS}
    assert runs[SFT_PRETRAIN][0] == "pretrain.py" and runs[SFT_CHUNKED][0] == runs[SFT_TRL][0] == "sft_trl.py"
    for _, flags in runs.values():
        assert flags[flags.index("--model") + 1] == "/m" and "--gradient_checkpointing" in flags
        assert flags[flags.index("--sp_size") + 1] == "2" and flags[flags.index("--max_length") + 1] == "4096"
    assert "--hsap_chunked_loss" not in runs[SFT_CHUNKED][1]
    assert runs[SFT_TRL][1][-2:] == ["--hsap_chunked_loss", "false"]
    assert cfg.lengths == (4096, 16384) and cfg.quick().lengths == (512, 1024)
    assert loss_check([10.0, 9.0], [10.0, 9.00001])["ok"]
    assert not loss_check([10.0, 9.0], [10.0, 9.001])["ok"] and not loss_check([10.0], [10.0, 9.0])["ok"]


def test_the_suite_is_its_own_command_and_part_of_the_memory_suite() -> None:
    assert [s.run for s in SUITES["sft_memory"]] == [sft_memory.main]
    assert sft_memory.main in [s.run for s in SUITES["memory"]]


def test_the_committed_results_render_every_run_with_the_same_losses() -> None:
    res = json.loads(sft_memory.DEFAULT_OUT.read_text())
    assert list(res["variants"]) == list(SFT_VARIANTS) and all(c["ok"] for c in res["same_losses"].values())
    (row,) = memory_goal_rows(None, None, res)
    assert row[0].startswith("SFT recipe with --gradient_checkpointing") and row[2] in ("**met**", "**not met**")
    assert res["command"] in memory_sections({"sft_memory": res})[0]
