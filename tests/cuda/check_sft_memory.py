"""The TRL SFT path's memory on one GPU (run by ``scripts/gpu_check.sh``'s memory step; skipped without CUDA).

``recipes/sft_trl.py`` (``HSAPSFTTrainer``, ``--gradient_checkpointing``, bf16 autocast over float32 weights) runs
on one GPU at a short and a long row, with hf_hsap's chunked loss (the default) and with TRL's fused LM head
(``--hsap_chunked_loss false``). Per run: ``torch.cuda.max_memory_allocated`` (the recipe's ``peak_mem_gb``). The
growth of that peak per token between the two rows is compared with the memory model's
(:func:`hf_hsap.memory.model.predict_step_memory`, ``device="cuda"``), and the two loss paths must give the same
losses (bf16). The figures are added to ``$OUT/sft_memory.json`` (or /tmp/hsap_gpu). On CPU the same measurement is
``python -m benchmarks sft_memory`` (peak resident set, SP 2).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_hsap.memory import MemoryLevers
from hf_hsap.memory.model import predict_step_memory

ROOT = Path(__file__).resolve().parents[2]
DEV = torch.device(os.environ.get("HSAP_CHECK_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu"))
pytestmark = pytest.mark.skipif(DEV.type != "cuda", reason="needs CUDA (the CPU measurement: python -m benchmarks "
                                                          "sft_memory)")

MODEL = "small-llama"  # hf_hsap.examples' built-in 1024-wide, 12-layer Llama, with a Llama-3 vocabulary
VOCAB = 128256
LENGTHS = (8192, 32768)
STEPS = 2
TOL = 0.15  # as tests/cuda/check_memory.py: allocator rounding and the kernels' workspaces
LOSS_RTOL = 2e-2  # the two loss paths in bf16 autocast


def recipe_flags(length: int, chunked: bool, out: Path, model: Path) -> list[str]:
    """``recipes/sft_trl.py``'s arguments for one run (one process, SP 1, one packed row per step)."""
    return ["--model", str(model), "--max_length", str(length), "--max_steps", str(STEPS), "--rows_per_step", "1",
            "--gradient_checkpointing", "--output_dir", str(out),
            *([] if chunked else ["--hsap_chunked_loss", "false"])]


def predicted_growth(config: dict[str, Any], lengths: tuple[int, int], chunked: bool) -> float:
    """The memory model's peak growth per token (bytes) between the two rows, as the recipe runs on one GPU:
    float32 weights and AdamW states, bf16 activations, checkpointing, no DP wrapper."""
    levers = MemoryLevers(chunked_loss=chunked, gradient_checkpointing=True)
    short, long = (predict_step_memory(config, n, world=1, sp_size=1, sharding="none", levers=levers,
                                       param_dtype="fp32", compute_dtype="bf16", master_weights=False, device="cuda")
                   for n in lengths)
    return (long.total - short.total) / (lengths[1] - lengths[0])


def measured_growth(runs: dict[int, dict[str, Any]], lengths: tuple[int, int]) -> float:
    """The measured peak's growth per token (bytes) between the two rows (``runs[length]["peak_gib"]``)."""
    return (runs[lengths[1]]["peak_gib"] - runs[lengths[0]]["peak_gib"]) * 2**30 / (lengths[1] - lengths[0])


def _run(flags: list[str], out: Path) -> dict[str, Any]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, str(ROOT / "recipes" / "sft_trl.py"), *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"peak_gib": max(r["peak_mem_gb"] for r in records), "loss": [r["loss"] for r in records]}


def test_sft_path_memory_on_the_gpu() -> None:
    from benchmarks.suites.sft_memory import SftMemoryConfig, build_model
    from hf_hsap.examples import builtin_config

    cfg = SftMemoryConfig(lengths=LENGTHS, vocab=VOCAB, model=MODEL, steps=STEPS, rows_per_step=1)
    config = builtin_config(MODEL, VOCAB, max(LENGTHS)).to_dict()
    results: dict[str, Any] = {"model": MODEL, "vocab": VOCAB, "lengths": LENGTHS, "paths": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model", cfg)
        for name, chunked in (("chunked loss", True), ("TRL fused head", False)):
            runs = {n: _run(recipe_flags(n, chunked, Path(tmp) / f"{name}_{n}".replace(" ", "_"), model),
                            Path(tmp) / f"{name}_{n}".replace(" ", "_")) for n in LENGTHS}
            got, pred = measured_growth(runs, LENGTHS), predicted_growth(config, LENGTHS, chunked)
            results["paths"][name] = {"runs": {str(n): r for n, r in runs.items()}, "measured_bytes_per_token": got,
                                      "predicted_bytes_per_token": pred, "error": pred / got - 1}
    out = Path(os.environ.get("OUT") or "/tmp/hsap_gpu")
    out.mkdir(parents=True, exist_ok=True)
    (out / "sft_memory.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results))
    chunked, fused = results["paths"]["chunked loss"], results["paths"]["TRL fused head"]
    for n in map(str, LENGTHS):
        for a, b in zip(chunked["runs"][n]["loss"], fused["runs"][n]["loss"]):
            assert a == pytest.approx(b, rel=LOSS_RTOL), (n, chunked["runs"][n]["loss"], fused["runs"][n]["loss"])
    assert chunked["measured_bytes_per_token"] < fused["measured_bytes_per_token"], results
    for name, row in results["paths"].items():
        assert abs(row["error"]) <= TOL, (name, row)
