"""The peers benchmark (hf_hsap beside DeepSpeed, ``benchmarks/suites/peers.py``) without DeepSpeed: its summary and
Markdown, the float64 reference and the exactness check, and a tiny end-to-end run of the hf_hsap schemes."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import hf_hsap
from benchmarks.suites import peer_workers as pw
from benchmarks.analytic import peers as peer_figures
from benchmarks.report.peers import peers_section
from benchmarks.suites import peers
from benchmarks.analytic.distributions import doc_lengths

CU = [0, 40, 41, 100, 128]  # a short row: 4 documents, one of a single token


def _per_rank(times: dict, cpu: dict, errors: dict | None = None, exact: dict | None = None) -> dict:
    errors = errors or {n: {t: 1e-7 for t in pw.TENSORS} for n in times}
    return {"times": times, "cpu": cpu, "errors": errors, "exact": exact or {n: True for n in errors},
            "info": {n: {} for n in errors}, "check_s": 0.1}


def _results(configs: list[dict], probe: dict, load: float = 0.5) -> dict:
    cfg = dataclasses.asdict(dataclasses.replace(peers.PeersConfig(), T=128, reps=3))
    m = {"cores": 2, "load": [load, load, load], "torch": "2.x", "numpy": "2.x", "python": "3.11", "cpu": "x86_64"}
    return {"config": cfg, "probe": probe, "deepspeed": probe.get("deepspeed"), "schemes": cfg["schemes"],
            "configs": configs, "all_exact": all(v["exact"] for c in configs for v in c["results"].values()),
            "machine": m, "machine_end": m, "seconds": 12.0, "command": "python -m benchmarks peers --quick"}


def test_summarize_ratios_noise_and_memory():
    r0 = _per_rank({"hsap": [1.0, 2.0, 4.0], "deepspeed_ulysses": [2.0, 2.0, 9.0]},
                   {"hsap": [1.0, 1.0, 1.0], "deepspeed_ulysses": [3.0, 3.0, 3.0]})
    r1 = _per_rank({"hsap": [1.5, 1.0, 3.0], "deepspeed_ulysses": [1.0, 5.0, 1.0]},
                   {"hsap": [1.0, 1.0, 1.0], "deepspeed_ulysses": [1.0, 1.0, 1.0]})
    mem = [{"peak_delta_bytes": {"hsap": 2**20, "deepspeed_ulysses": 3 * 2**20}, "peak_reset": True,
            "tensor_peak_bytes": {"hsap": 2**20, "deepspeed_ulysses": 2 * 2**20}},
           {"peak_delta_bytes": {"hsap": 5 * 2**20, "deepspeed_ulysses": 2**20}, "peak_reset": True,
            "tensor_peak_bytes": {"hsap": 4 * 2**20, "deepspeed_ulysses": 2**19}}]
    s = peer_figures.summarize([r0, r1], mem)
    # slowest rank per round: hsap [1.5, 2, 4], peer [2, 5, 9]
    assert s["hsap"]["ms"] == pytest.approx(2000.0)
    assert s["deepspeed_ulysses"]["ms"] == pytest.approx(5000.0)
    assert s["deepspeed_ulysses"]["runs_ms"] == [2000.0, 5000.0, 9000.0]
    paired = np.array([2 / 1.5, 5 / 2, 9 / 4])
    assert s["deepspeed_ulysses"]["ratio"] == pytest.approx(2.25)  # median of the per-round ratios
    assert s["deepspeed_ulysses"]["ratio_of_medians"] == pytest.approx(5000 / 2000)
    q1, q3 = np.percentile(paired, [25, 75])
    assert s["deepspeed_ulysses"]["ratio_q1"] == pytest.approx(q1)
    assert s["deepspeed_ulysses"]["ratio_q3"] == pytest.approx(q3)
    assert s["hsap"]["noise"] == pytest.approx((3.0 - 1.75) / 2.0)  # IQR of [1.5, 2, 4] / median
    assert s["deepspeed_ulysses"]["cpu_ratio"] == pytest.approx(2.0)  # summed over ranks: 4 / 2
    assert s["hsap"]["peak_mib"] == pytest.approx(5.0) and s["deepspeed_ulysses"]["peak_mib"] == pytest.approx(3.0)
    assert s["hsap"]["tensor_mib"] == pytest.approx(4.0) and s["deepspeed_ulysses"]["tensor_mib"] == pytest.approx(2.0)


def test_median_interval_is_the_order_statistics_of_the_binomial_tail():
    # n = 15: P(Binomial(15, 1/2) <= 3) = 576 / 32768 = 1.8 % <= 2.5 % < P(<= 4) = 5.9 %: x_(4) and x_(12)
    x = np.random.default_rng(0).permutation(np.arange(1.0, 16.0))
    assert peer_figures.median_interval(x) == (4.0, 8.0, 12.0)
    assert peer_figures.median_interval(x, confidence=0.80) == (5.0, 8.0, 11.0)  # P(<= 4) = 5.9 % <= 10 %
    assert peer_figures.median_interval(np.array([3.0, 1.0, 2.0])) == (1.0, 2.0, 3.0)  # too few rounds: the whole range
    assert peer_figures.median_interval(np.array([0.9])) == (0.9, 0.9, 0.9)


def test_the_cpu_ratio_is_the_median_of_per_round_ratios_with_its_interval():
    hsap = [1.0] * 15
    peer = [0.97, 0.98, 0.99, 1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07, 1.08, 1.09, 1.1, 2.0]
    s = peer_figures.summarize([_per_rank({"hsap": hsap, "alst": peer}, {"hsap": hsap, "alst": peer[::-1]})])
    assert s["alst"]["cpu_ratio"] == pytest.approx(1.04)
    assert (s["alst"]["cpu_lo"], s["alst"]["cpu_hi"]) == pytest.approx((1.0, 1.08))  # x_(4), x_(12)
    text = peers_section(_results([{"dist": "sft", "label": "SFT", "T": 128, "hq": 8, "hkv": 8, "d": 64,
                                          "n_docs": 4, "pairs": 1, "check_s": 0.1, "seconds": 1.0, "results": s}],
                                        {"deepspeed": "0.x", "deepspeed_ulysses": "ok", "alst": "ok"}))
    assert "| 1.04 (1.00–1.08) |" in text and "measurably slower by CPU time in 0/1" in text


def test_peers_section_renders_the_table():
    per_rank = [_per_rank({"hsap": [1.0, 1.0, 1.0], "hsap_ulysses": [1.2, 1.2, 1.2],
                           "deepspeed_ulysses": [1.5, 1.5, 1.5]},
                          {"hsap": [1.0] * 3, "hsap_ulysses": [1.1] * 3, "deepspeed_ulysses": [2.0] * 3},
                          errors={n: {t: e for t in pw.TENSORS} for n, e in (("hsap", 1e-7), ("hsap_ulysses", 2e-7),
                                                                             ("deepspeed_ulysses", 3e-7),
                                                                             ("alst", 0.5))},
                          exact={"hsap": True, "hsap_ulysses": True, "deepspeed_ulysses": True, "alst": False})]
    mem = [{"peak_delta_bytes": {"hsap": 10 * 2**20, "hsap_ulysses": 20 * 2**20, "deepspeed_ulysses": 30 * 2**20,
                                 "alst": 40 * 2**20}, "peak_reset": True,
            "tensor_peak_bytes": {"hsap": 5 * 2**20, "hsap_ulysses": 2**19}}]
    per_rank[0]["info"]["hsap"] = {"ulysses": 2}  # the degree the row ran at: the U column
    c = {"dist": "sft", "label": peers.ROW_LABELS["sft"], "T": 128, "hq": 8, "hkv": 2, "d": 64, "n_docs": 5,
         "pairs": 100, "results": peer_figures.summarize(per_rank, mem)}
    text = peers_section(_results([c], {"deepspeed": "0.19.8", "deepspeed_ulysses": "ok", "alst": "ok"}, load=5.0))
    assert text.startswith("## hf_hsap beside DeepSpeed")
    assert "DeepSpeed 0.19.8" in text and "`python -m benchmarks peers --quick`" in text
    assert "wall times are noisy" in text  # load 5 on 2 cores
    assert "| SFT (many short documents) | 5 | 2 | deepspeed_ulysses | – | 1500 | 0.00 | 1.50 (1.50–1.50) | 2.00 (2.00–2.00) " \
           "| 3.0e-07 | 30 | – |" in text  # no tensor peak for this scheme
    assert "| SFT (many short documents) | 5 | 2 | hsap | 2 | 1000 | 0.00 | 1 (base) | 1.00 (1.00–1.00) | 1.0e-07 | 10 | " \
           "5.0 |" in text
    assert "| hsap_ulysses | – | 1200 |" in text and "| 20 | 0.5 |" in text
    assert "| alst | – | not timed |" in text and "**not exact**" in text
    assert "Some schemes were not exact" in text
    assert "hsap faster in 1/1" in text  # alst is not timed, so only deepspeed_ulysses counts
    quiet = peers_section(_results([c], {"deepspeed": None, "deepspeed_ulysses": "DeepSpeed is not installed",
                                               "alst": "DeepSpeed is not installed"}))
    assert "DeepSpeed not installed" in quiet and "Not run: `deepspeed_ulysses`: DeepSpeed is not installed" in quiet
    assert "noisy" not in quiet


def test_scheme_errors_catch_a_wrong_row():
    g = torch.Generator().manual_seed(0)
    ref = [torch.randn(10, 2, 4, generator=g, dtype=torch.float64) for _ in range(4)]
    idx = torch.tensor([7, 2, 5])
    res = [r.index_select(0, idx).float() for r in ref]
    ok = pw.scheme_errors(res, ref, idx)
    assert set(ok) == set(pw.TENSORS) and max(ok.values()) < 1e-6
    res[2] = res[2].clone()
    res[2][1, 0, 0] += 0.01 * float(ref[2].abs().max())  # one wrong dk entry
    bad = pw.scheme_errors(res, ref, idx)
    assert bad["dk"] == pytest.approx(0.01, rel=1e-3) and bad["out"] < 1e-6
    assert pw.scheme_errors(res, ref, torch.tensor([2, 7, 5]))["out"] > 0.01  # rows in the wrong order


def test_reference_row_matches_dense_float64(pools):
    g = torch.Generator().manual_seed(3)
    T, hq, hkv, d = CU[-1], 4, 2, 8
    q, k, v, dout = (torch.randn(T, h, d, generator=g) for h in (hq, hkv, hkv, hq))
    got = pools(2).run(pw.reference_row, CU, q, k, v, dout)
    qd, kd, vd = (x.double().requires_grad_(True) for x in (q, k, v))
    out, _ = hf_hsap.reference_attention(qd, kd, vd, torch.tensor(CU))
    want = (out, *torch.autograd.grad(out, (qd, kd, vd), dout.double()))
    for rank in got:
        for name, a, b in zip(pw.TENSORS, rank, want):
            assert a.dtype == torch.float64 and a.shape == b.shape, name
            assert torch.allclose(a, b, rtol=0, atol=1e-10), name


FIGURES = {"pair_s": 1e-7, "p2p_bytes_per_s": 5e8, "a2a_bytes_per_s": 5e8, "latency_s": 1e-4}  # made up


def test_cpu_cost_model_from_figures():
    from benchmarks.suites.cpu_calibration import DIAG_BLOCK, cpu_cost_model

    cost = cpu_cost_model(8, 2, 64, FIGURES)
    # a KV token: K and V of 2 heads x 64 in float32, forward and their gradients back = 2048 bytes over 5e8 B/s,
    # in pairs of 1e-7 s; the all-to-all: q, k, v, out and their gradients (2 x (2*8 + 2*2) x 64 x 4 bytes)
    assert cost.kv_token_cost == pytest.approx(2048 / 5e8 / 1e-7)
    assert cost.a2a_token_cost == pytest.approx(2 * 20 * 64 * 4 / 5e8 / 1e-7)
    assert cost.round_cost == pytest.approx(2 * 1e-4 / 1e-7)
    assert cost.token_cost == 0 and cost.overlap == 0 and cost.diag_block == DIAG_BLOCK


def test_hsap_schemes_exact_and_timed(pools):
    res = pools(2).run(pw.peers_task, CU, 4, 1, 8, 0, 3, ("hsap", "hsap_flat", "hsap_ulysses"), 1e-5, FIGURES)
    for r in res:
        assert r["exact"] == {"hsap": True, "hsap_flat": True, "hsap_ulysses": True}
        assert r["info"]["hsap_flat"]["ulysses"] == 1 and r["info"]["hsap"]["ulysses"] in (1, 2)
        assert all(len(t) == 3 and min(t) > 0 for t in r["times"].values())
        assert max(max(e.values()) for e in r["errors"].values()) < 1e-5
    assert res[0]["errors"] == res[1]["errors"]  # group-wide maxima
    assert res[0]["info"]["hsap"]["placement"]
    strict = pools(2).run(pw.peers_task, CU, 4, 1, 8, 0, 1, ("hsap",), 0.0, FIGURES)  # nothing is below 0: nothing timed
    assert strict[0]["exact"] == {"hsap": False} and strict[0]["times"] == {}


def test_run_peers_without_deepspeed(pools):
    cfg = peers.PeersConfig(world=2, T=2048, hq=4, kv_heads=(2,), d=32, rows=("sft",), reps=2)
    res = peers.run_peers(cfg=cfg, pool=pools(2))
    have_ds = res["deepspeed"] is not None
    assert res["schemes"][:3] == ["hsap", "hsap_flat", "hsap_ulysses"]
    assert have_ds or res["schemes"] == ["hsap", "hsap_flat", "hsap_ulysses"]
    assert set(res["calibration"]) == {"2"} and res["calibration"]["2"]["pair_s"] > 0
    assert res["all_exact"]
    (c,) = res["configs"]
    assert c["n_docs"] == len(doc_lengths("sft", 2048, 0)) and c["hkv"] == 2
    for name in ("hsap", "hsap_ulysses"):
        v = c["results"][name]
        assert v["exact"] and len(v["runs_ms"]) == 2
        # out, dq (4 heads) and dk, dv (2 heads) of 1024 local rows, float32: 1.5 MiB the step must add
        assert v["peak_mib"] >= 1.5, v["peak_mib"]
        assert v["tensor_mib"] >= 1.5, v["tensor_mib"]  # the exact figure holds the same tensors
    assert c["results"]["hsap"]["ratio"] == pytest.approx(1.0)
    assert c["peak_reset"] is True
    text = peers_section(res)
    assert "| SFT (many short documents) |" in text and ("Not run" in text) != have_ds
