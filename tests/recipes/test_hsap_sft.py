"""``hsap-sft`` and ``HSAPSFTTrainer`` end to end on CPU, with TRL's defaults (bf16 autocast on), under
``accelerate launch`` on 2 and 4 processes, against plain TRL (``trl.scripts.sft``, ``SFTTrainer``) on one
process; the YAML form; an ALST-style config refused before anything is built."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hf_hsap.testing import launch_env

ROOT = Path(__file__).resolve().parents[2]
CPU_CONFIG = ROOT / "accelerate_configs" / "cpu_4proc.yaml"
STEPS = 3
# bf16 autocast: the same batches in another order of bf16 roundings; a wrong mask or a lost document is
# off by far more (the losses move by ~0.05 per step at this learning rate)
REL_TOL = 2e-3
TRAIN = {"max_length": 128, "max_steps": STEPS, "per_device_train_batch_size": 1,
         "gradient_accumulation_steps": 2, "learning_rate": 1e-3, "logging_steps": 1, "save_strategy": "steps",
         "save_steps": STEPS, "report_to": "none", "seed": 0, "disable_tqdm": True}


def _flags(fields: dict[str, Any]) -> list[str]:
    return [x for k, v in fields.items() for x in (f"--{k}", str(v))]


def _run(cmd: list[str], procs: int) -> str:
    if procs > 1:  # --main_process_port 0: Accelerate picks a free port right before binding it
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_CONFIG),
               "--num_processes", str(procs), "--main_process_port", "0", *cmd]
    else:
        cmd = [sys.executable, *cmd]
    proc = subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True, timeout=420)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-6000:]}"
    return output


def _losses(out: Path) -> list[float]:
    state = json.loads((out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    losses = [r["loss"] for r in state["log_history"] if "loss" in r]
    assert len(losses) == STEPS
    return losses


def _assert_close(got: list[float], ref: list[float]) -> None:
    assert all(abs(a - b) <= REL_TOL * abs(b) for a, b in zip(got, ref)), (got, ref)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from hf_hsap.examples import save_sft_data, save_tiny_model

    base = tmp_path_factory.mktemp("hsap_sft")
    model, data = save_tiny_model(base / "model"), save_sft_data(base / "data", n_train=48)
    ref_out = base / "ref"
    # plain TRL on one process: TRL's own script and SFTTrainer, with attention "sdpa" and TRL's bf16 default
    _run(["-m", "trl.scripts.sft", "--model_name_or_path", model, "--dataset_name", data, "--packing",
          "--use_cpu", "--output_dir", str(ref_out), *_flags(TRAIN)], procs=1)
    ref = _losses(ref_out)
    assert ref[0] > ref[-1]  # it trains
    return {"base": base, "model": model, "data": data, "ref": ref}


@pytest.mark.distributed
@pytest.mark.slow
def test_hsap_sft_flags_on_2_processes_logs_the_single_process_trl_losses(inputs: dict[str, Any]) -> None:
    out = inputs["base"] / "cli2"
    output = _run(["-m", "hf_hsap.cli.sft", "--model_name_or_path", inputs["model"], "--dataset_name",
                   inputs["data"], "--packing", "--use_cpu", "--hsap_sp_size", "2", "--output_dir", str(out),
                   "--log_level", "info", *_flags(TRAIN)], procs=2)
    _assert_close(_losses(out), inputs["ref"])
    args = __import__("torch").load(out / f"checkpoint-{STEPS}" / "training_args.bin", weights_only=False)
    assert args.bf16 and args.hsap_sp_size == 2 and not args.ignore_data_skip  # TRL's default, nothing overridden
    assert "Training completed" in output
    # 1 row x 2 micro-batches per step, shared by the 2 SP ranks (Trainer alone would count 4)
    assert "Total train batch size (w. parallel, distributed & accumulation) = 2" in output


@pytest.mark.distributed
@pytest.mark.slow
def test_hsap_sft_yaml_on_4_processes_ulysses2_logs_the_single_process_trl_losses(inputs: dict[str, Any]) -> None:
    out = inputs["base"] / "cli4"
    config = inputs["base"] / "sft4.yaml"
    fields = {"model_name_or_path": inputs["model"], "dataset_name": inputs["data"], "packing": True,
              "use_cpu": True, "output_dir": str(out), "hsap_sp_size": 4, "hsap_ulysses_size": "2", **TRAIN}
    config.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in fields.items()))
    _run(["-m", "hf_hsap.cli.sft", "--config", str(config)], procs=4)
    _assert_close(_losses(out), inputs["ref"])


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("procs", [4])  # 2 processes: the hsap-sft test above
def test_trl_docs_script_with_hsap_trainer_logs_the_single_process_trl_losses(inputs: dict[str, Any],
                                                                              procs: int) -> None:
    out = inputs["base"] / f"script{procs}"
    _run([str(ROOT / "examples" / "trl_sft.py"), inputs["model"], inputs["data"], str(out),
          *(f"{k}={json.dumps(v)}" for k, v in TRAIN.items())], procs=procs)
    _assert_close(_losses(out), inputs["ref"])


def test_alst_yaml_is_refused_with_the_fix(tmp_path: Path) -> None:
    from hf_hsap.cli.sft import main

    config = tmp_path / "alst.yaml"
    config.write_text("model_name_or_path: m\ndataset_name: d\noutput_dir: o\nparallelism_config:\n"
                      "  parallelism_config_sp_size: 2\n  parallelism_config_sp_backend: deepspeed\n")
    with pytest.raises(ValueError, match="hsap_sp_size 2"):
        main(["--config", str(config)])
    config.write_text("model_name_or_path: m\ndataset_name: d\noutput_dir: o\nparallelism_config_cp_size: 4\n")
    with pytest.raises(ValueError, match="context parallelism"):
        main(["--config", str(config)])
