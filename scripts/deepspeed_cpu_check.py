"""DeepSpeed ZeRO-2 / ZeRO-3 (the shipped ``accelerate_configs/deepspeed/zero{2,3}.json``) with the HSAP
trainer on 2 CPU processes (HSAP SP 2) against one process without DeepSpeed: the per-step losses must agree to 1e-4 (fp32). Run by ``scripts/deepspeed_cpu_check.sh``
(its own virtual environment: DeepSpeed is not a dependency of hf_hsap; its first run compiles DeepSpeed's
CPU communication op, a few minutes). Writes ``runs/deepspeed_cpu_check.json``; exits 1 on a mismatch.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "scripts" / "deepspeed_sft_worker.py"


def _losses(cmd: list[str], env: dict[str, str]) -> tuple[list[float], str]:
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-4000:]}")
    found = re.search(r"^LOSS (\[.*\])$", proc.stdout, flags=re.M)
    optimizer = re.search(r"^OPTIMIZER (\S+)$", proc.stdout, flags=re.M)
    return json.loads(found.group(1)), optimizer.group(1) if optimizer else "?"


def main() -> int:
    from hf_hsap.examples import save_sft_data, save_tiny_model
    from hf_hsap.testing import free_port, launch_env

    tmp = Path(tempfile.mkdtemp(prefix="hsap_ds_"))
    model, data = save_tiny_model(tmp / "model", max_length=128), save_sft_data(tmp / "data", n_train=200)
    env = launch_env()
    ref, _ = _losses([sys.executable, str(WORKER), model, data, str(tmp / "ref")], env)
    results = {"reference (1 process, no DeepSpeed)": ref}
    ok = True
    for stage in (2, 3):
        ds = ROOT / "accelerate_configs" / "deepspeed" / f"zero{stage}.json"  # the shipped one; Trainer fills "auto"
        acc = tmp / f"zero{stage}.yaml"
        acc.write_text(f"compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
                       f"  deepspeed_config_file: {ds}\n  zero3_init_flag: {str(stage == 3).lower()}\n"
                       "machine_rank: 0\nmain_training_function: main\nnum_machines: 1\nnum_processes: 2\n"
                       "rdzv_backend: static\nsame_network: true\nuse_cpu: false\n")
        got, optimizer = _losses([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(acc),
                                  "--main_process_port", str(free_port()), str(WORKER), model, data,
                                  str(tmp / f"zero{stage}")], dict(env, DS_ACCELERATOR="cpu"))
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
        ok &= len(got) == len(ref) and worst <= 1e-4
        results[f"ZeRO-{stage} (2 processes, HSAP SP 2, {optimizer})"] = got
        print(f"ZeRO-{stage}: {got} (worst relative difference {worst:.1e})", flush=True)
    print(f"reference: {ref}")
    Path(ROOT / "runs").mkdir(exist_ok=True)
    (ROOT / "runs" / "deepspeed_cpu_check.json").write_text(json.dumps({"losses": results, "ok": ok}, indent=1))
    print("OK: DeepSpeed ZeRO-2 and ZeRO-3 give the single-process losses" if ok else "MISMATCH", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
