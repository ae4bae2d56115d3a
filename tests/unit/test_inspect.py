"""The ``hsap-plan`` inspector: printed numbers equal ``Plan.stats()``; the PNG is written."""
import json
import re

import numpy as np
import pytest

from hf_hsap.data.lengths import doc_lengths as lib_doc_lengths
from hf_hsap import plan_sequence
from hf_hsap.inspect import main, rank_owner, sample_lengths


def _rank_rows(text: str, with_a2a: bool) -> list[list[float]]:
    n = 8 if with_a2a else 7  # rank, part, tokens, work, recv, send, (a2a,) est/mean
    rows = []
    for line in text.splitlines():
        if re.fullmatch(r"\s*" + r"\s+".join([r"-?[\d.]+"] * n) + r"\s*", line):
            rows.append([float(x) for x in line.split()])
    return rows


@pytest.mark.parametrize("lengths,P,U,placement", [
    ([100, 2000, 3000, 500, 40, 900], 4, 1, "auto"),
    ([5000, 300, 2000, 700], 4, 2, "balanced"),
    ([1000, 1000, 1000], 3, 1, "contiguous"),
])
def test_printed_numbers_equal_plan_stats(capsys, tmp_path, lengths, P, U, placement):
    png = tmp_path / "plan.png"
    rc = main(["--lengths", ",".join(map(str, lengths)), "--P", str(P), "--U", str(U),
               "--placement", placement, "--png", str(png)])
    assert rc == 0
    out = capsys.readouterr().out
    plan = plan_sequence(np.concatenate([[0], np.cumsum(lengths)]), P, placement, ulysses_size=U)
    st = plan.stats()
    rows = _rank_rows(out, U > 1)
    assert len(rows) == P
    for r, row in enumerate(rows):
        assert row[0] == r and row[1] == r // U
        assert row[2] == st.tokens[r]
        assert row[3] == pytest.approx(st.attn_work[r], abs=0.06)
        assert row[4] == st.recv_kv_tokens[r]
        assert row[5] == st.send_kv_tokens[r]
        if U > 1:
            assert row[6] == st.a2a_tokens[r]
        assert row[-1] == pytest.approx(st.est_time[r] / np.mean(st.est_time), abs=6e-4)
    assert f"placement: {st.placement}" in out
    assert f"rounds {st.rounds} ({st.round_order})" in out
    ring = (P - 1) / P * sum(lengths)
    assert f"max {max(st.recv_kv_tokens)} ({max(st.recv_kv_tokens) / ring:.3f}" in out
    assert png.exists() and png.stat().st_size > 1000
    est = np.array(st.est_time)
    assert f"estimated step time max/mean {est.max() / est.mean():.3f}" in out


def test_distribution_sampler_is_the_benchmark_spec_one():
    """One sampler: ``hsap-plan --dist`` calls the library's, whose rows are pinned."""
    assert sample_lengths is lib_doc_lengths
    pinned = {("longtail", 20000, 0): [2504, 1657, 5706, 2422, 869, 3652, 3190],
              ("sft", 4000, 1): [818, 1256, 807, 185, 934],
              ("mixed", 20000, 1): [10000, 3560, 6440],
              ("single", 5000, 3): [5000]}
    for (dist, T, seed), want in pinned.items():
        got = sample_lengths(dist, T, seed)
        assert got.dtype == np.int64 and got.tolist() == want, (dist, T, seed)


def test_dist_option_and_rank_owner(capsys):
    assert main(["--dist", "mixed", "--seed", "1", "--T", "20000", "--P", "8"]) == 0
    out = capsys.readouterr().out
    assert "T = 20000" in out and "longest 10000" in out
    plan = plan_sequence(np.concatenate([[0], np.cumsum(sample_lengths("mixed", 20000, 1))]), 8)
    owner = rank_owner(plan)
    assert np.array_equal(np.bincount(owner, minlength=8), plan.stats().tokens)


@pytest.mark.parametrize("argv,msg", [
    (["--lengths", "10,x"], "comma-separated integers"),
    (["--lengths", "10,20", "--T", "31"], "sum to 30"),
    (["--lengths", "4", "--P", "8"], "every rank needs at least one token"),
])
def test_bad_arguments_exit_2(capsys, argv, msg):
    assert main(argv) == 2
    assert msg in capsys.readouterr().err


def test_per_batch_degree_option(capsys):
    from hf_hsap import choose_ulysses_size

    lengths = [3000, 40, 900, 60, 4000]
    assert main(["--lengths", ",".join(map(str, lengths)), "--P", "8", "--U", "per_batch", "--gpus_per_node", "8"]) == 0
    out = capsys.readouterr().out
    best, times = choose_ulysses_size(np.concatenate([[0], np.cumsum(lengths)]), 8, num_heads=32, gpus_per_node=8,
                                      num_kv_heads=8)  # the CLI plans for Llama-3-8B: 32 query, 8 kv heads
    assert f"per-batch Ulysses degree: U = {best} " in out and all(f"U={u}: " in out for u in times)
    assert f"U {best} (all-to-all) x R {8 // best}" in out  # the plan printed is that degree's
    with pytest.raises(SystemExit):  # argparse refuses a degree that is neither an int nor per_batch
        main(["--lengths", "100", "--U", "some"])
    assert "expected a positive integer or 'per_batch'" in capsys.readouterr().err


def test_rounds_option(capsys):
    assert main(["--lengths", "65536", "--P", "8", "--rounds", "by_peer"]) == 0
    assert "rounds 7 (by_peer)" in capsys.readouterr().out


def test_config_and_attention_only_options(capsys, tmp_path):
    """--config prices tokens and KV for that model (CostModel.from_config, on --hardware, KV over NVLink
    when --gpus_per_node holds the group); --attention-only sets the token cost to 0; the plans differ."""
    import json
    from types import SimpleNamespace

    from hf_hsap import CostModel

    cfg = {"num_attention_heads": 32, "num_key_value_heads": 32, "hidden_size": 4096, "intermediate_size": 11008}
    (tmp_path / "config.json").write_text(json.dumps({"text_config": cfg}))
    base = ["--dist", "mixed", "--T", "65536", "--P", "8", "--gpus_per_node", "8"]
    assert main(base + ["--config", str(tmp_path), "--hardware", "H100"]) == 0
    want = CostModel.from_config(SimpleNamespace(**cfg), "nvlink", "H100")
    out = capsys.readouterr().out
    assert f"token {want.token_cost:.0f}, KV token {want.kv_token_cost:.0f}," in out
    assert main(base + ["--attention-only"]) == 0
    out_att = capsys.readouterr().out
    assert "token 0, KV token 102," in out_att
    # the plans themselves differ (tokens, work, received and sent KV; not only the estimate column)
    assert [r[:-1] for r in _rank_rows(out_att, False)] != [r[:-1] for r in _rank_rows(out, False)]
    assert main(base + ["--hardware", "H100"]) == 0  # Llama-3-8B shapes on that GPU
    want = CostModel.from_config(SimpleNamespace(num_attention_heads=32, num_key_value_heads=8, hidden_size=4096,
                                                 intermediate_size=14336), "nvlink", "H100")
    assert f"token {want.token_cost:.0f}, KV token {want.kv_token_cost:.0f}," in capsys.readouterr().out


@pytest.mark.parametrize("content,msg", [(None, "no config file"), ("{oops", "not valid JSON"),
                                         ('{"hidden_size": 8}', "lacks num_attention_heads"),
                                         ("[1, 2]", "not a model config object"),
                                         ('{"num_attention_heads": 0, "hidden_size": 8}', "positive")])
def test_bad_config_exits_2(capsys, tmp_path, content, msg):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    assert main(["--lengths", "100,200", "--P", "2", "--config", str(path)]) == 2
    assert msg in capsys.readouterr().err


def test_windows_option_plans_every_kind(capsys, tmp_path):
    """--windows lists the layers' masks: one line per kind with its own received KV (the window's is smaller),
    and a config with layer_types gives the same kinds."""
    assert main(["--lengths", "3000,200,5000", "--P", "4", "--placement", "zigzag", "--windows", "64:5,full:1"]) == 0
    out = capsys.readouterr().out
    plan = plan_sequence(np.array([0, 3000, 3200, 8200]), 4, "zigzag", windows={64: 5, None: 1})
    st = plan.stats()
    for name, k in st.kinds.items():
        assert f"  {name}: {k.layers} layer(s)" in out and f"received KV max {max(k.recv_kv_tokens)} " in out
    assert max(st.kinds["window=64"].recv_kv_tokens) < max(st.kinds["full"].recv_kv_tokens)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 6,
                               "sliding_window": 64, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}))
    assert main(["--lengths", "3000,200,5000", "--P", "4", "--placement", "zigzag", "--config", str(cfg)]) == 0
    assert "  window=64: 5 layer(s)" in capsys.readouterr().out
    assert main(["--lengths", "100", "--P", "2", "--windows", "x:2"]) == 2
