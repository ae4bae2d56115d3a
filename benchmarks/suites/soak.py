"""Soak: thousands of training steps of a tiny model under SP, a different packing layout every step (CPU, gloo).

    .venv/bin/python -m benchmarks soak                    # 2,000 steps on 2 ranks -> benchmarks/results/soak.json
    .venv/bin/python -m benchmarks soak --steps 500        # shorter

Every step packs a fresh random set of 3-16 documents (never a layout seen before) into one row of
``--tokens`` tokens (so every step needs a new plan: the plan cache misses every time), shards it over the SP
group (:func:`hf_hsap.shard_batch`), runs forward, backward (gradients summed over the group) and an optimizer
step of a 2-layer Llama, and samples what could accumulate over a long run: the
resident set size, the group's plan cache, its communication counters and the loggers' ``log_once`` sets.
The run fails (exit 1) when one of them is not bounded or the throughput drifts; CI runs a short version as a
test (``tests/distributed/test_soak.py``) that checks the bounds but never the clock.
:func:`benchmarks.report.soak.soak_markdown` renders the result (``benchmarks/results/soak.md``, linked from
``BENCHMARKS.md``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from hf_hsap.testing import DistPool

from ..analytic.soak import DRIFT_TOL, check_bounded, summarize
from .output import RESULTS, ROOT, Outcome, renders_pages

DEFAULT_OUT = RESULTS / "soak.json"


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
        ``peers``, ``logged``), ``cache_maxsize``, ``misses``, ``hits``, ``entries_per_layout`` (the cache
        entries one new layout makes: one per Ulysses degree and the choice with ``ulysses_size="per_batch"``, else
        one), ``loss_first`` / ``loss_last``.
    """
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, LlamaConfig

    import hf_hsap
    from hf_hsap.data.packing import IGNORE_INDEX
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
        labels[pos == 0] = IGNORE_INDEX
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
            # a new layout's cache entries: with ulysses_size="per_batch" one plan per degree and the choice
            "entries_per_layout": len(sp.degrees) + 1 if len(sp.degrees) else 1,
            "loss_first": losses[0], "loss_last": losses[-1]}


def main(argv: Sequence[str]) -> Outcome:
    """Run the soak and write ``--out``.

    Args:
        argv: the command-line arguments.

    Returns:
        The outcome: status 1 when a bound or the drift is exceeded.
    """
    p = argparse.ArgumentParser(prog="python -m benchmarks soak", description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--no-write-md", action="store_true", help="leave BENCHMARKS.md and the detail files alone")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.time()
    with DistPool(args.world, timeout_s=3600) as pool:
        ranks = pool.run(soak_worker, args.steps, args.tokens)
    s = summarize(ranks)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    s.update(when=time.strftime("%Y-%m-%d", time.gmtime()), commit=commit or "?", seconds=time.time() - t0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(s, indent=1) + "\n")
    render = renders_pages(args.out, DEFAULT_OUT, args.no_write_md)
    try:
        check_bounded(s)
        assert abs(s["drift"]) <= DRIFT_TOL, f"throughput drifted by {s['drift'] * 100:+.1f}%"
    except AssertionError as e:
        print(f"soak FAILED: {e}")
        return Outcome(1, s, render)
    print(f"soak passed in {s['seconds']:.0f} s")
    return Outcome(0, s, render)
