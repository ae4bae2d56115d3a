"""The VLM SFT recipe (``recipes/sft_vlm.py``) and ``hsap-sft`` on a vision-language model: packed image + text rows
with assistant-only loss, the same losses at SP 2 (``accelerate launch``, 2 CPU processes) as on one process."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from hf_hsap.testing import launch_env
from recipe_runs import CPU_CONFIG, ROOT, run_recipe

sys.path.insert(0, str(ROOT / "recipes"))
import sft_vlm  # noqa: E402

REL_TOL = 1e-5  # float32 on CPU: SP changes only the order of the sums
RECIPE_ARGS = ["--max_steps", "3", "--train_rows", "32", "--max_length", "256", "--per_device_train_batch_size", "8"]
CLI_STEPS = 2


def _close(got: list[float], ref: list[float]) -> bool:
    return len(got) == len(ref) and all(abs(a - b) <= REL_TOL * abs(b) for a, b in zip(got, ref))


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("family,architecture", [("llava", "LlavaForConditionalGeneration"),
                                                 ("smolvlm", "SmolVLMForConditionalGeneration")])
def test_recipe_sp2_logs_the_sp1_losses_with_several_documents_and_images_per_row(
        tmp_path: Path, family: str, architecture: str) -> None:
    args = ["--model", family, *RECIPE_ARGS]
    sp1 = run_recipe("sft_vlm.py", tmp_path / "sp1", ["--hsap_sp_size", "1", *args])
    sp2 = run_recipe("sft_vlm.py", tmp_path / "sp2", ["--hsap_sp_size", "2", *args], procs=2)
    assert [r["step"] for r in sp1] == [1, 2, 3] and [r["step"] for r in sp2] == [1, 2, 3]
    losses1, losses2 = [r["loss"] for r in sp1], [r["loss"] for r in sp2]
    assert _close(losses2, losses1), (losses2, losses1)
    assert losses1[-1] < losses1[0]  # it trains
    pack1 = json.loads((tmp_path / "sp1" / "packing.json").read_text())
    pack2 = json.loads((tmp_path / "sp2" / "packing.json").read_text())
    assert pack2 == pack1  # the same rows trained on, counted once whichever rank packed them
    assert pack1["batches"] == 3 and pack1["documents"] == 3 * 8  # 8 examples per micro-batch, one document each
    assert pack1["documents_per_row"] >= 2 and pack1["images_per_row"] >= 2
    # assistant-only loss: far fewer trained tokens than tokens in a row
    assert 0 < pack1["trained_tokens_per_row"] < pack1["row_length"] / 2
    # the run saved the fine-tuned VLM (TRL's script) next to the base model the recipe built
    config = json.loads((tmp_path / "sp2" / "config.json").read_text())
    assert config["architectures"] == [architecture]
    assert (tmp_path / "sp2" / "base_model" / "processor_config.json").exists()


def test_recipe_model_flag_saves_the_built_in_tiny_vlm_of_trl_s_set(tmp_path: Path) -> None:
    from hf_hsap.examples import TRL_VLMS

    args, argv = sft_vlm.parse_args(["--model", "mistral3", "--output_dir", str(tmp_path / "out")])
    assert args.model == "mistral3" and args.model_name_or_path is None
    model, _ = sft_vlm.prepare_inputs(args, main_process=True)
    config = json.loads((Path(model) / "config.json").read_text())
    assert model == str(tmp_path / "out" / "base_model") and config["model_type"] == "mistral3"
    assert config["architectures"] == ["Mistral3ForConditionalGeneration"]
    assert json.loads((Path(model) / "processor_config.json").read_text())["processor_class"] == "PixtralProcessor"
    hsap_argv = sft_vlm.hsap_sft_argv(args, argv, model, "d")
    assert "--model" not in hsap_argv and "mistral3" not in hsap_argv  # a recipe flag, not an hsap-sft one
    assert list(TRL_VLMS) == ["llava", "llava_next", "mllama", "smolvlm", "gemma3", "qwen2_5_vl", "qwen3_vl",
                              "mistral3"]
    with pytest.raises(SystemExit):  # argparse names the choices
        sft_vlm.parse_args(["--model", "blip-2"])
    # images per packed row: counted from the examples, whatever the family's pixel layout
    assert sft_vlm.count_images([{"images": [1, 2]}, {"images": []}, {"image": 3}, {"image": None}]) == 3


def test_recipe_writes_a_save_to_disk_dataset_as_parquet_that_load_dataset_reads(tmp_path: Path) -> None:
    from datasets import Dataset, DatasetDict, load_dataset

    from hf_hsap.examples import vlm_sft_rows

    saved = tmp_path / "saved"
    DatasetDict(train=Dataset.from_list(vlm_sft_rows(6)), test=Dataset.from_list(vlm_sft_rows(2, seed=1))).save_to_disk(
        str(saved))
    args = Namespace(model_name_or_path="some/model", dataset_name=str(saved), train_rows=4,
                     output_dir=str(tmp_path / "out"), seed=0)
    model, data = sft_vlm.prepare_inputs(args, main_process=True)
    assert model == "some/model" and data == str(tmp_path / "out" / "data")
    back = load_dataset(data)
    assert {k: len(v) for k, v in back.items()} == {"train": 6, "test": 2}
    original = Dataset.from_list(vlm_sft_rows(6))
    assert back["train"]["messages"] == original["messages"]
    assert [len(x) for x in back["train"]["images"]] == [len(x) for x in original["images"]]
    assert back["train"][0]["images"][0].size == (16, 16)
    # a name load_dataset reads goes to hsap-sft as it is; the user's flags win over the recipe's defaults
    args.dataset_name = str(tmp_path / "parquet_dir")
    assert sft_vlm.prepare_inputs(args, main_process=False) == ("some/model", str(tmp_path / "parquet_dir"))
    argv = sft_vlm.hsap_sft_argv(args, ["--dataset_name", "x", "--max_length=96", "--train_rows", "4"], "m", "d")
    assert argv[-4:] == ["--model_name_or_path", "m", "--dataset_name", "d"] and "--train_rows" not in argv
    assert argv.index("--max_length=96") > argv.index("--max_length")


def _hsap_sft(out: Path, model: str, data: str, procs: int) -> tuple[list[float], str]:
    """``hsap-sft`` (``python -m hf_hsap.cli.sft``) for CLI_STEPS steps; its logged losses and its output."""
    cmd = ["-m", "hf_hsap.cli.sft", "--model_name_or_path", model, "--dataset_name", data, "--packing",
           "--max_length", "256", "--use_cpu", "--bf16", "false", "--assistant_only_loss", "true",
           "--per_device_train_batch_size", "8", "--max_steps", str(CLI_STEPS), "--learning_rate", "2e-3",
           "--logging_steps", "1", "--save_strategy", "steps", "--save_steps", str(CLI_STEPS), "--report_to", "none",
           "--seed", "0", "--dataloader_num_workers", "0", "--disable_tqdm", "true",
           "--hsap_sp_size", str(procs), "--output_dir", str(out)]
    if procs > 1:  # --main_process_port 0: Accelerate picks a free port right before binding it
        cmd = ["-m", "accelerate.commands.launch", "--config_file", str(CPU_CONFIG), "--num_processes", str(procs),
               "--main_process_port", "0", *cmd]
    proc = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=launch_env(), capture_output=True, text=True,
                          timeout=240)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"hsap-sft failed ({proc.returncode}):\n{output[-6000:]}"
    state = json.loads((out / f"checkpoint-{CLI_STEPS}" / "trainer_state.json").read_text())
    return [r["loss"] for r in state["log_history"] if "loss" in r], output


@pytest.mark.distributed
@pytest.mark.slow
def test_hsap_sft_trains_a_saved_vlm_on_a_vision_dataset_at_sp2_with_the_sp1_losses(tmp_path: Path) -> None:
    from datasets import Dataset

    from hf_hsap.examples import save_tiny_vlm, vlm_sft_rows

    model = save_tiny_vlm(str(tmp_path / "vlm"))
    data = tmp_path / "data"
    Dataset.from_list(vlm_sft_rows(32, seed=2)).to_parquet(str(data / "train.parquet"))  # load_dataset(dir) reads it
    ref, _ = _hsap_sft(tmp_path / "sp1", model, str(data), procs=1)
    got, output = _hsap_sft(tmp_path / "sp2", model, str(data), procs=2)
    assert len(ref) == CLI_STEPS and all(math.isfinite(x) for x in ref + got)
    assert _close(got, ref), (got, ref)
    assert "Training completed" in output
    # TRL's script loaded the checkpoint's own architecture and processor, and saved them
    config: dict[str, Any] = json.loads((tmp_path / "sp2" / "config.json").read_text())
    assert config["architectures"] == ["LlavaForConditionalGeneration"]
    assert (tmp_path / "sp2" / "processor_config.json").exists()
    args = __import__("torch").load(tmp_path / "sp2" / f"checkpoint-{CLI_STEPS}" / "training_args.bin",
                                    weights_only=False)
    assert args.packing and args.assistant_only_loss and args.hsap_sp_size == 2
