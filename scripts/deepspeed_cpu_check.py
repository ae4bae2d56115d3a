"""The engines' CPU check: DeepSpeed ZeRO-2 / ZeRO-3 / ZeRO-3 with offload_optimizer (+ offload_param) and FSDP2
with CPUOffloadPolicy, each through its shipped Accelerate config (``accelerate_configs/*_8.yaml`` with
``--num_processes 2``), on 2 CPU processes at HSAP SP 2, fp32, against one process without an engine:

* HSAPSFTTrainer (``scripts/engine_sft_worker.py``): 4 steps of 2 micro-batches;
* the pretraining recipe (``recipes/pretrain.py``): 4 steps of 2 micro-batches (``--grad_accum 2``) and an eval;
  under ZeRO-3 with both offloads also a checkpoint at step 2, the run resumed from it (steps 3 and 4) and the final
  model (gathered from the partitions) against the reference's weights.

Every per-step loss must agree with the reference's to ``REL_TOL`` (1e-4). Run by ``scripts/deepspeed_cpu_check.sh``
(its own virtual environment: DeepSpeed is not a dependency of hf_hsap; its first run compiles DeepSpeed's CPU ops,
a few minutes). The ranks run under ``scripts/cpu_engine.py`` (Accelerate runs neither engine on CPU by itself).
Writes ``benchmarks/results/offload_check.json``; exits 1 on a mismatch.
"""
from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS, WORKER = ROOT / "scripts" / "cpu_engine.py", ROOT / "scripts" / "engine_sft_worker.py"
RESULTS = ROOT / "benchmarks" / "results" / "offload_check.json"
REL_TOL = 1e-4
# config file -> what it runs (the shipped 8-GPU files, launched with 2 processes)
ENGINES = {"deepspeed_zero2_8.yaml": "DeepSpeed ZeRO-2",
           "deepspeed_zero3_8.yaml": "DeepSpeed ZeRO-3",
           "deepspeed_zero3_offload_optimizer_8.yaml": "DeepSpeed ZeRO-3 + offload_optimizer (cpu)",
           "deepspeed_zero3_offload_8.yaml": "DeepSpeed ZeRO-3 + offload_optimizer + offload_param (cpu)",
           "fsdp2_offload_8.yaml": "FSDP2 + CPUOffloadPolicy (pin_memory=False on CPU)"}
PRETRAIN_ENGINES = ("deepspeed_zero3_8.yaml", "deepspeed_zero3_offload_optimizer_8.yaml",
                    "deepspeed_zero3_offload_8.yaml", "fsdp2_offload_8.yaml")
PRETRAIN = ["--max_steps", "4", "--grad_accum", "2", "--max_length", "128", "--docs_per_step", "8",
            "--max_samples", "300", "--eval_docs", "16", "--eval_every", "4", "--seed", "3"]
SAVED = "deepspeed_zero3_offload_8.yaml"  # the pretraining run that also saves, resumes and writes its final model


def _run(cmd: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-6000:]}")
    return proc.stdout


def _launch(config: str, target: list[str], env: dict[str, str]) -> tuple[str, str]:
    """``accelerate launch`` of ``target`` under ``config`` on 2 CPU processes; returns (stdout, ENGINE line)."""
    from hf_hsap.testing import free_port

    extra = ["--mixed_precision", "no"] if config.startswith("fsdp") else []  # its bf16 is for GPUs
    out = _run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(ROOT / "accelerate_configs" / config), "--num_processes", "2", *extra,
                "--main_process_port", str(free_port()), str(HARNESS), *target], dict(env, DS_ACCELERATOR="cpu"))
    engine = re.search(r"^ENGINE (\S+) OFFLOAD (\S+)$", out, flags=re.M)
    return out, f"{engine.group(1)}, offload {engine.group(2)}" if engine else "?"


def _sft_losses(out: str) -> tuple[list[float], str]:
    optimizer = re.search(r"^OPTIMIZER (\S+)$", out, flags=re.M)
    return json.loads(re.search(r"^LOSS (\[.*\])$", out, flags=re.M).group(1)), optimizer.group(1) if optimizer else "?"


def _pretrain_losses(out_dir: Path) -> dict[str, list[float]]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"loss": [r["loss"] for r in records], "eval_loss": [r["eval_loss"] for r in records if "eval_loss" in r]}


def _weights_rel_diff(got: Path, ref: Path) -> float:
    """The largest ``|w - w_ref| / |w_ref|`` over the tensors of two saved models (their model.safetensors)."""
    from safetensors.torch import load_file

    a, b = load_file(got / "model.safetensors"), load_file(ref / "model.safetensors")
    if a.keys() != b.keys():
        return float("inf")
    return max(float((a[k].double() - b[k].double()).norm() / b[k].double().norm().clamp_min(1e-30)) for k in a)


def _worst(got: list[float], ref: list[float]) -> float:
    if len(got) != len(ref):
        return float("inf")
    return max(abs(a - b) / abs(b) for a, b in zip(got, ref))


def main() -> int:
    from hf_hsap.examples import save_sft_data, save_tiny_model
    from hf_hsap.testing import launch_env

    tmp = Path(tempfile.mkdtemp(prefix="hsap_engines_"))
    model, data = save_tiny_model(tmp / "model", max_length=128), save_sft_data(tmp / "data", n_train=200)
    env = launch_env()
    sft_ref, _ = _sft_losses(_run([sys.executable, str(WORKER), model, data, str(tmp / "sft_ref")], env))
    _run([sys.executable, str(ROOT / "recipes" / "pretrain.py"), "--output_dir", str(tmp / "pre_ref"),
          "--sp_size", "1", *PRETRAIN], env)
    pre_ref = _pretrain_losses(tmp / "pre_ref")
    runs, ok = [], True
    for config, name in ENGINES.items():
        out, engine = _launch(config, [str(WORKER), model, data, str(tmp / f"sft_{config}")], env)
        got, optimizer = _sft_losses(out)
        worst = _worst(got, sft_ref)
        runs.append({"trainer": "HSAPSFTTrainer", "config": f"accelerate_configs/{config}", "engine": name,
                     "accelerate_state": engine, "optimizer": optimizer, "loss": got, "worst_rel_diff": worst})
        print(f"HSAPSFTTrainer, {name} [{engine}; {optimizer}]: {got} (worst relative difference {worst:.1e})",
              flush=True)
        ok &= worst <= REL_TOL
    for config in PRETRAIN_ENGINES:
        out_dir = tmp / f"pre_{config}"
        extra = ["--save_every", "2"] if config == SAVED else ["--no_final_model"]
        _, engine = _launch(config, [str(ROOT / "recipes" / "pretrain.py"), "--output_dir", str(out_dir),
                                     "--sp_size", "2", *PRETRAIN, *extra], env)
        got = _pretrain_losses(out_dir)
        worst = max(_worst(got["loss"], pre_ref["loss"]), _worst(got["eval_loss"], pre_ref["eval_loss"]))
        run = {"trainer": "recipes/pretrain.py", "config": f"accelerate_configs/{config}", "engine": ENGINES[config],
               "accelerate_state": engine, **got}
        if config == SAVED:  # resumed from checkpoint-2: steps 3 and 4; the final model's weights
            resumed = tmp / "pre_resumed"
            _launch(config, [str(ROOT / "recipes" / "pretrain.py"), "--output_dir", str(resumed), "--sp_size", "2",
                             *PRETRAIN, "--no_final_model", "--resume_from_checkpoint",
                             str(out_dir / "checkpoint-2")], env)
            again = _pretrain_losses(resumed)
            weights = _weights_rel_diff(out_dir / "final_model", tmp / "pre_ref" / "final_model")
            run |= {"resumed_from_step_2": again, "final_model_weights_rel_diff": weights}
            worst = max(worst, _worst(again["loss"], pre_ref["loss"][2:]),
                        _worst(again["eval_loss"], pre_ref["eval_loss"]), weights)
        runs.append(run | {"worst_rel_diff": worst})
        print(f"pretrain.py, {ENGINES[config]} [{engine}]: {got} (worst relative difference {worst:.1e})", flush=True)
        ok &= worst <= REL_TOL
    print(f"references: HSAPSFTTrainer {sft_ref}; pretrain.py {pre_ref}")
    result = {
        "what": "per-step training losses on 2 CPU processes (gloo, HSAP SP 2, fp32) under each engine's shipped "
                "Accelerate config (--num_processes 2) against one process without an engine; tiny Llama "
                "(hf_hsap.examples.save_tiny_model), HSAPSFTTrainer 4 steps x 2 micro-batches, pretrain.py 4 steps x "
                "2 micro-batches + eval (under ZeRO-3 offload also resumed from its step-2 checkpoint, and its final "
                "model's weights against the reference's); command: bash scripts/deepspeed_cpu_check.sh",
        "rel_tol": REL_TOL, "ok": bool(ok),
        "versions": {k: version(k) for k in ("torch", "accelerate", "transformers", "trl", "deepspeed")}
        | {"python": platform.python_version()},
        "reference": {"HSAPSFTTrainer": sft_ref, "recipes/pretrain.py": pre_ref},
        "runs": runs,
        "worst_rel_diff": max(r["worst_rel_diff"] for r in runs),
    }
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'OK' if ok else 'MISMATCH'}: worst relative difference {result['worst_rel_diff']:.1e} "
          f"(bound {REL_TOL:.0e}); {RESULTS.relative_to(ROOT)}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
