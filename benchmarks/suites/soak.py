"""Soak: thousands of training steps of a tiny model under SP, a different packing layout every step (CPU, gloo).

    .venv/bin/python -m benchmarks.soak                    # 2,000 steps on 2 ranks -> benchmarks/results/soak.json
    .venv/bin/python -m benchmarks.soak --steps 500        # shorter

Every step packs a fresh random set of 3-16 documents (never a layout seen before) into one row of
``--tokens`` tokens (so every step needs a new plan: the plan cache misses every time), shards it over the SP
group (:func:`hf_hsap.shard_batch`), runs forward, backward (gradients summed over the group) and an optimizer
step of a 2-layer Llama, and samples what could accumulate over a long run: the
resident set size, the group's plan cache, its communication counters and the loggers' ``log_once`` sets.
The run fails (exit 1) when one of them is not bounded or the throughput drifts; CI runs a short version as a
test (``tests/distributed/test_soak.py``) that checks the bounds but never the clock.
:func:`soak_markdown` renders the result (``benchmarks/results/soak.md``, linked from ``BENCHMARKS.md``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .publish import publish_after

RESULTS = Path(__file__).resolve().parent / "results" / "soak.json"
RSS_GROWTH_MIB = 64.0  # resident memory may grow at most this much after the warm-up (allocator noise)
DRIFT_TOL = 0.25  # steps/s of the last quarter within 25% of the second quarter's


def _rss_mib() -> float:
    """Resident set size of this process now (``/proc/self/statm``), MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _logged_cases() -> int:
    """Cases remembered by :func:`hf_hsap.log.log_once` on every hf_hsap logger."""
    return sum(len(getattr(lg, "_hsap_logged", ())) for name, lg in logging.Logger.manager.loggerDict.items()
               if name.startswith("hf_hsap") and isinstance(lg, logging.Logger))


def soak_worker(steps: int, tokens: int = 256, cache_size: int = 64, seed: int = 0,
                sample_every: int = 10) -> dict[str, Any]:
    """One rank of the soak (run on every rank of a :class:`~hf_hsap.testing.DistPool`; SP = the world).

    Args:
        steps: optimizer steps. tokens: tokens of the packed row. cache_size: the SP group's plan-cache size.
        seed: of the model and of the document lengths (the same on every rank). sample_every: steps between
            samples of memory and state.

    Returns:
        ``steps``, ``step_s`` (every step's wall time), ``samples`` (``step``, ``rss_mib``, ``cache``,
        ``peers``, ``logged``), ``cache_maxsize``, ``misses``, ``hits``, ``loss_first`` / ``loss_last``.
    """
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, LlamaConfig

    import hf_hsap
    from hf_hsap.integrations import hsap_causal_lm_loss, reduce_loss_for_logging

    world = dist.get_world_size() if dist.is_initialized() else 1
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=tokens,
                         tie_word_embeddings=False)
    sp = hf_hsap.init_sequence_parallel(hf_hsap.HSAPConfig(sp_size=world, model_config=config))
    sp.plan_cache = hf_hsap.PlanCache(cache_size)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="hsap", dtype=torch.float32).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    step_s, samples, losses, seen = [], [], [], set()
    for step in range(steps):
        t0 = time.perf_counter()
        cuts = np.sort(rng.choice(np.arange(1, tokens), size=int(rng.integers(2, 16)), replace=False))
        while tuple(cuts) in seen:  # the same on every rank (one generator, one seed)
            cuts = np.sort(rng.choice(np.arange(1, tokens), size=int(rng.integers(2, 16)), replace=False))
        seen.add(tuple(cuts))
        lens = np.diff(np.concatenate([[0], cuts, [tokens]]))
        pos = torch.from_numpy(np.concatenate([np.arange(n) for n in lens])).unsqueeze(0)
        ids = torch.from_numpy(rng.integers(1, config.vocab_size, tokens)).unsqueeze(0)
        labels = ids.clone()
        labels[pos == 0] = -100
        local = hf_hsap.shard_batch({"input_ids": ids, "position_ids": pos, "labels": labels}, sp, verify=False)
        logits = model(input_ids=local["input_ids"], position_ids=local["position_ids"], use_cache=False,
                       hsap_plan=local["hsap_plan"], hsap_plan_use=local.get("hsap_plan_use")).logits
        loss = hsap_causal_lm_loss(logits, local["shift_labels"], local["num_items_in_batch"], sp=sp)
        loss.backward()
        if world > 1:  # each rank's loss is its tokens' share of the global mean: the gradient is their sum
            flat = torch.cat([p.grad.flatten() for p in params])
            dist.all_reduce(flat)
            for p, g in zip(params, flat.split([p.numel() for p in params])):
                p.grad.copy_(g.view_as(p))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(reduce_loss_for_logging(loss.detach(), sp))
        step_s.append(time.perf_counter() - t0)
        if step % sample_every == 0 or step == steps - 1:
            samples.append({"step": step + 1, "rss_mib": _rss_mib(), "cache": len(sp.plan_cache),
                            "peers": len(sp.comm_stats.per_peer_bytes_sent), "logged": _logged_cases()})
    return {"steps": steps, "world": world, "tokens": tokens, "step_s": step_s, "samples": samples,
            "cache_maxsize": cache_size, "misses": sp.plan_cache.misses, "hits": sp.plan_cache.hits,
            "loss_first": losses[0], "loss_last": losses[-1]}


def summarize(ranks: list[dict[str, Any]], warmup: int | None = None) -> dict[str, Any]:
    """The soak's figures over every rank.

    Args:
        ranks: :func:`soak_worker`'s results. warmup: steps before the memory baseline (default: a quarter of
            the run, at least twice the cache size: the cache is full and the allocator warm).

    Returns:
        ``rss_growth_mib`` (largest RSS after the warm-up minus the RSS at it, worst rank), ``cache_max`` /
        ``cache_maxsize``, ``distinct_layouts`` (plan-cache misses of rank 0), ``peers_max``, ``logged_growth``,
        ``steps_per_s_q2`` / ``steps_per_s_q4`` (second and last quarter, slowest rank per step) and ``drift``
        (their relative change).
    """
    steps = ranks[0]["steps"]
    warmup = warmup if warmup is not None else min(steps - 1, max(steps // 4, 2 * ranks[0]["cache_maxsize"]))
    growth, logged = 0.0, 0
    for r in ranks:
        base = min((s for s in r["samples"] if s["step"] >= warmup), key=lambda s: s["step"])
        after = [s for s in r["samples"] if s["step"] >= base["step"]]
        growth = max(growth, max(s["rss_mib"] for s in after) - base["rss_mib"])
        logged = max(logged, max(s["logged"] for s in after) - base["logged"])
    per_step = np.max(np.array([r["step_s"] for r in ranks]), axis=0)
    q = steps // 4
    q2, q4 = 1.0 / float(np.mean(per_step[q:2 * q])), 1.0 / float(np.mean(per_step[3 * q:]))
    return {"steps": steps, "world": ranks[0]["world"], "tokens": ranks[0]["tokens"], "warmup": warmup,
            "rss_start_mib": max(r["samples"][0]["rss_mib"] for r in ranks),
            "rss_end_mib": max(r["samples"][-1]["rss_mib"] for r in ranks), "rss_growth_mib": growth,
            "cache_max": max(s["cache"] for r in ranks for s in r["samples"]),
            "cache_maxsize": ranks[0]["cache_maxsize"],
            "distinct_layouts": ranks[0]["misses"], "peers_max": max(s["peers"] for r in ranks for s in r["samples"]),
            "logged_growth": logged, "steps_per_s_q2": q2, "steps_per_s_q4": q4, "drift": q4 / q2 - 1.0,
            "loss_first": ranks[0]["loss_first"], "loss_last": ranks[0]["loss_last"]}


def check_bounded(s: dict[str, Any], rss_growth_mib: float = RSS_GROWTH_MIB) -> None:
    """Assert what a long run must keep bounded (no clock: the tests use this one).

    Raises:
        AssertionError: the plan cache over its size, fewer distinct layouts than steps (the soak would not test
            the cache), RSS growing by more than ``rss_growth_mib`` after the warm-up, communication counters
            or ``log_once`` sets growing.
    """
    assert s["cache_max"] <= s["cache_maxsize"], s
    assert s["distinct_layouts"] == s["steps"], s  # a new layout (a cache miss) every step
    assert s["rss_growth_mib"] <= rss_growth_mib, s
    assert s["peers_max"] <= s["world"] and s["logged_growth"] == 0, s


def main(argv: list[str] | None = None) -> int:
    """Run the soak, write ``--out``, print the section; returns 1 when a bound or the drift is exceeded."""
    import subprocess

    from hf_hsap.testing import DistPool

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--no-write-md", action="store_true", help="leave BENCHMARKS.md and the detail files alone")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.time()
    with DistPool(args.world, timeout_s=3600) as pool:
        ranks = pool.run(soak_worker, args.steps, args.tokens)
    s = summarize(ranks)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    s.update(when=time.strftime("%Y-%m-%d", time.gmtime()), commit=commit or "?", seconds=time.time() - t0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(s, indent=1) + "\n")
    print(soak_section(args.out))
    publish_after(args.out, RESULTS, args.no_write_md)
    try:
        check_bounded(s)
        assert abs(s["drift"]) <= DRIFT_TOL, f"throughput drifted by {s['drift'] * 100:+.1f}%"
    except AssertionError as e:
        print(f"soak FAILED: {e}")
        return 1
    print(f"soak passed in {s['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
