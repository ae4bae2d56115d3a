"""HSAPConfig validation and helpers, the hsap_* fields of HSAPTrainingArguments / HSAPSFTConfig through the
Hugging Face parsers (command line and YAML), and check_parallelism_config's refusals."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from hf_hsap import HSAPConfig
from hf_hsap.config import DEFAULT_TIMEOUT_S, PLACEMENTS, ROUNDS, parse_dtype
from hf_hsap.devices import detect_hardware
from hf_hsap.plan.cost import CostModel
from hf_hsap.plan.placement import DEFAULT_TOKEN_SLACK
from hf_hsap.topology import check_parallelism_config

MODEL_CONFIG = SimpleNamespace(num_attention_heads=8, num_key_value_heads=2, hidden_size=256,
                               intermediate_size=704, head_dim=32)


# ------------------------------------------------------------------------------------------- HSAPConfig
def test_defaults() -> None:
    cfg = HSAPConfig()
    assert (cfg.sp_size, cfg.ulysses_size, cfg.placement, cfg.rounds) == (1, None, "auto", "auto")
    assert cfg.recv_budget_tokens is None and cfg.grad_comm_dtype is None and cfg.gpus_per_node is None
    assert cfg.token_slack == DEFAULT_TOKEN_SLACK and cfg.timeout_s == DEFAULT_TIMEOUT_S
    assert cfg.cost_model is None and cfg.model_config is None and cfg.num_heads is None


@pytest.mark.parametrize("field,value,extra", [
    ("sp_size", 0, {}), ("sp_size", -2, {}), ("sp_size", True, {}), ("sp_size", 2.0, {}), ("sp_size", "2", {}),
    ("ulysses_size", 0, {"sp_size": 4}), ("ulysses_size", "zero", {"sp_size": 4}), ("ulysses_size", True, {}),
    ("ulysses_size", 2.0, {"sp_size": 4}), ("ulysses_size", 3, {"sp_size": 4}), ("ulysses_size", "3", {"sp_size": 4}),
    ("placement", "spread", {}), ("placement", None, {}), ("rounds", "ring", {}), ("rounds", "", {}),
    ("recv_budget_tokens", 0, {}), ("recv_budget_tokens", -5, {}), ("recv_budget_tokens", 1.5, {}),
    ("token_slack", -0.01, {}), ("token_slack", 1.5, {}), ("token_slack", float("nan"), {}),
    ("timeout_s", 0, {}), ("timeout_s", -1.0, {}), ("timeout_s", float("nan"), {}),
    ("gpus_per_node", 0, {}), ("gpus_per_node", 2.0, {}), ("gpus_per_node", "8", {}),
    ("per_batch_memory_cap", 1, {}), ("per_batch_memory_cap", "no", {}),
    ("recurrent_mode", "ring", {}), ("recurrent_mode", None, {}), ("vision_encoding", "twice", {}),
    ("vision_balance", 1, {}), ("vision_balance", "no", {}),
])
def test_bad_field_raises_naming_it(field: str, value, extra: dict) -> None:
    with pytest.raises(ValueError, match=rf"HSAPConfig\.{field}="):
        HSAPConfig(**{field: value, **extra})


def test_ulysses_size_names_its_modes() -> None:
    with pytest.raises(ValueError, match="one of \\('auto', 'per_batch'\\)"):
        HSAPConfig(sp_size=4, ulysses_size="perbatch")


def test_per_batch_degrees_divide_p_the_heads_and_the_node() -> None:
    from hf_hsap.topology import ulysses_degrees

    assert ulysses_degrees(8, 8, 32) == [1, 2, 4, 8]
    assert ulysses_degrees(8, 8, 12) == [1, 2, 4]
    assert ulysses_degrees(16, 8, 32) == [1, 2, 4, 8]  # the all-to-all stays inside a node
    assert ulysses_degrees(6, 6, 4) == [1, 2]
    with pytest.raises(ValueError, match="num_heads=.*model_config"):
        ulysses_degrees(4, 4, None)


def test_ulysses_that_does_not_divide_names_sp_size() -> None:
    with pytest.raises(ValueError, match="does not divide sp_size=6"):
        HSAPConfig(sp_size=6, ulysses_size=4)


def test_bad_grad_comm_dtype_raises() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        HSAPConfig(grad_comm_dtype="int8")


def test_ulysses_digit_string_becomes_int() -> None:
    cfg = HSAPConfig(sp_size=4, ulysses_size="2")
    assert cfg.ulysses_size == 2 and type(cfg.ulysses_size) is int
    assert HSAPConfig(sp_size=4, ulysses_size="auto").ulysses_size == "auto"
    assert HSAPConfig(sp_size=4, ulysses_size="per_batch").ulysses_size == "per_batch"
    assert type(HSAPConfig(sp_size=4, ulysses_size=4).ulysses_size) is int


@pytest.mark.parametrize("name,dtype", [
    ("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16), ("torch.bfloat16", torch.bfloat16),
    ("fp16", torch.float16), ("half", torch.float16), ("float32", torch.float32), ("FP32", torch.float32),
    ("float", torch.float32), ("torch.float64", torch.float64), (torch.float32, torch.float32),
    (None, None), ("none", None), ("auto", None), ("", None),
])
def test_grad_comm_dtype_names(name, dtype) -> None:
    assert HSAPConfig(grad_comm_dtype=name).grad_comm_dtype is dtype
    assert parse_dtype(name) is dtype


def test_frozen() -> None:
    cfg = HSAPConfig(sp_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.sp_size = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.placement = "zigzag"  # type: ignore[misc]
    assert cfg.sp_size == 2 and cfg.placement == "auto"


def test_replace_validates_again_and_keeps_the_original() -> None:
    cfg = HSAPConfig(sp_size=4, ulysses_size=2, placement="zigzag")
    new = cfg.replace(sp_size=8, ulysses_size="4")
    assert new is not cfg and (new.sp_size, new.ulysses_size, new.placement) == (8, 4, "zigzag")
    assert (cfg.sp_size, cfg.ulysses_size) == (4, 2)
    with pytest.raises(ValueError, match=r"HSAPConfig\.ulysses_size="):
        cfg.replace(sp_size=5)  # ulysses_size=2 does not divide 5
    with pytest.raises(ValueError, match=r"HSAPConfig\.sp_size="):
        cfg.replace(sp_size=0)
    with pytest.raises(ValueError, match=r"HSAPConfig\.placement="):
        cfg.replace(placement="nope")
    assert cfg.replace(grad_comm_dtype="bf16").grad_comm_dtype is torch.bfloat16


def test_plan_options() -> None:
    opts = HSAPConfig(placement="balanced", rounds="by_peer", recv_budget_tokens=4096, token_slack=0.25).plan_options()
    assert opts == {"rounds": "by_peer", "recv_budget_tokens": 4096, "token_slack": 0.25}
    assert type(opts["token_slack"]) is float
    default = HSAPConfig(token_slack=0).plan_options()
    assert default == {"rounds": "auto", "recv_budget_tokens": None, "token_slack": 0.0}
    assert type(default["token_slack"]) is float


def test_cost_for() -> None:
    cfg = HSAPConfig(model_config=MODEL_CONFIG)
    assert cfg.num_heads == 8
    for link in ("network", "nvlink"):
        got = cfg.cost_for(link)
        assert isinstance(got, CostModel) and got == CostModel.from_config(MODEL_CONFIG, link, detect_hardware())
    assert cfg.cost_for("network") != cfg.cost_for("nvlink")
    assert cfg.cost_for("network") != CostModel.default()  # the model's shapes, not the Llama-3-8B default
    assert HSAPConfig().cost_for("network") is None
    assert HSAPConfig(model_config=SimpleNamespace(num_attention_heads=8)).cost_for("network") is None  # no hidden
    explicit = CostModel(token_cost=5.0)
    assert HSAPConfig(cost_model=explicit, model_config=MODEL_CONFIG).cost_for("nvlink") is explicit
    assert HSAPConfig(cost_model=explicit).cost_for("network") is explicit


def test_repr_leaves_the_model_config_out() -> None:
    text = repr(HSAPConfig(sp_size=2, model_config=MODEL_CONFIG))
    assert "sp_size=2" in text and "model_config" not in text and "num_attention_heads" not in text


# ------------------------------------------------------------------------------------------- arguments
CLI = ["--hsap_sp_size", "4", "--hsap_ulysses_size", "2", "--hsap_placement", "zigzag", "--hsap_rounds",
       "by_peer", "--hsap_recv_budget_tokens", "8192", "--hsap_token_slack", "0.2", "--hsap_grad_comm_dtype",
       "float32", "--hsap_timeout_s", "30", "--hsap_gpus_per_node", "8", "--hsap_per_batch_memory_cap", "False"]
EXPECTED = {"sp_size": 4, "ulysses_size": 2, "placement": "zigzag", "rounds": "by_peer", "recv_budget_tokens": 8192,
            "token_slack": 0.2, "grad_comm_dtype": torch.float32, "timeout_s": 30.0, "gpus_per_node": 8,
            "per_batch_memory_cap": False}


def _common(tmp_path) -> list[str]:
    return ["--output_dir", str(tmp_path), "--use_cpu", "--report_to", "none"]


def _check_hsap(args, model_config=None) -> HSAPConfig:
    cfg = args.hsap_config(model_config)
    assert isinstance(cfg, HSAPConfig)
    for name, value in EXPECTED.items():
        got = getattr(cfg, name)
        # float fields may hold an int from a YAML file ("30"); every other field has exactly the expected type
        want = (int, float) if isinstance(value, float) else (type(value),)
        assert got == value and type(got) in want, (name, got)
    return cfg


def test_training_arguments_from_the_command_line(tmp_path) -> None:
    from transformers import HfArgumentParser

    from hf_hsap.integrations.arguments import HSAPTrainingArguments

    (args,) = HfArgumentParser(HSAPTrainingArguments).parse_args_into_dataclasses(_common(tmp_path) + CLI)
    assert isinstance(args, HSAPTrainingArguments) and args.use_cpu
    assert args.hsap_sp_size == 4 and args.hsap_ulysses_size == "2" and args.hsap_recv_budget_tokens == 8192
    cfg = _check_hsap(args, MODEL_CONFIG)
    assert cfg.model_config is MODEL_CONFIG and cfg.num_heads == 8
    assert cfg.cost_for("network") == CostModel.from_config(MODEL_CONFIG, "network", detect_hardware())
    (plain,) = HfArgumentParser(HSAPTrainingArguments).parse_args_into_dataclasses(_common(tmp_path))
    assert plain.hsap_config().sp_size == 1 and plain.hsap_config().ulysses_size is None
    (per_batch,) = HfArgumentParser(HSAPTrainingArguments).parse_args_into_dataclasses(
        _common(tmp_path) + ["--hsap_sp_size", "4", "--hsap_ulysses_size", "per_batch"])
    assert per_batch.hsap_config(MODEL_CONFIG).ulysses_size == "per_batch"


def test_recipe_ulysses_size_flag() -> None:
    import argparse
    import importlib

    _ulysses_size = importlib.import_module("recipes.common")._ulysses_size  # a namespace package at the root
    assert _ulysses_size("per_batch") == "per_batch" and _ulysses_size("auto") == "auto" and _ulysses_size("4") == 4
    with pytest.raises(argparse.ArgumentTypeError, match="'auto' or 'per_batch'"):
        _ulysses_size("many")


def test_sft_config_from_the_command_line_with_trl_parser(tmp_path) -> None:
    from trl import TrlParser

    from hf_hsap.integrations.arguments import HSAPSFTConfig

    (args,) = TrlParser(HSAPSFTConfig).parse_args_and_config(_common(tmp_path) + CLI + ["--packing"])
    assert isinstance(args, HSAPSFTConfig) and args.packing and args.use_cpu
    _check_hsap(args)


def test_sft_config_from_a_yaml_file(tmp_path) -> None:
    from trl import TrlParser

    from hf_hsap.integrations.arguments import HSAPSFTConfig

    path = tmp_path / "hsap.yaml"
    path.write_text("hsap_sp_size: 4\nhsap_ulysses_size: 2\nhsap_placement: zigzag\nhsap_rounds: by_peer\n"
                    "hsap_recv_budget_tokens: 8192\nhsap_token_slack: 0.2\nhsap_grad_comm_dtype: float32\n"
                    "hsap_timeout_s: 30\nhsap_gpus_per_node: 8\nhsap_per_batch_memory_cap: false\nuse_cpu: true\n"
                    "report_to: none\npacking: true\n")
    (args,) = TrlParser(HSAPSFTConfig).parse_args_and_config(args=["--config", str(path), "--output_dir",
                                                                    str(tmp_path / "out")])
    assert args.packing and args.use_cpu
    _check_hsap(args)
    # the command line overrides the file
    (args,) = TrlParser(HSAPSFTConfig).parse_args_and_config(args=["--config", str(path), "--output_dir",
                                                                    str(tmp_path / "out"), "--hsap_placement",
                                                                    "balanced", "--hsap_sp_size", "8"])
    cfg = args.hsap_config()
    assert cfg.placement == "balanced" and cfg.sp_size == 8 and cfg.ulysses_size == 2


def test_invalid_placement_raises_at_construction(tmp_path) -> None:
    from hf_hsap.integrations.arguments import HSAPSFTConfig, HSAPTrainingArguments

    for cls in (HSAPTrainingArguments, HSAPSFTConfig):
        with pytest.raises(ValueError, match=r"HSAPConfig\.placement='spread'"):
            cls(output_dir=str(tmp_path), use_cpu=True, report_to="none", hsap_placement="spread")
        with pytest.raises(ValueError, match=r"HSAPConfig\.ulysses_size="):
            cls(output_dir=str(tmp_path), use_cpu=True, report_to="none", hsap_sp_size=4, hsap_ulysses_size="3")
    from transformers import HfArgumentParser

    with pytest.raises(ValueError, match=r"HSAPConfig\.placement='spread'"):
        HfArgumentParser(HSAPTrainingArguments).parse_args_into_dataclasses(
            _common(tmp_path) + ["--hsap_placement", "spread"])


def test_arguments_in_python_match_their_config(tmp_path) -> None:
    from hf_hsap.integrations.arguments import HSAPSFTConfig, HSAPTrainingArguments

    for cls in (HSAPTrainingArguments, HSAPSFTConfig):
        args = cls(output_dir=str(tmp_path), use_cpu=True, report_to="none", hsap_sp_size=4, hsap_ulysses_size="2",
                   hsap_placement="zigzag", hsap_rounds="by_peer", hsap_recv_budget_tokens=8192, hsap_token_slack=0.2,
                   hsap_grad_comm_dtype="float32", hsap_timeout_s=30.0, hsap_gpus_per_node=8,
                   hsap_per_batch_memory_cap=False)
        cfg = _check_hsap(args, MODEL_CONFIG)
        assert cfg.model_config is MODEL_CONFIG


# ------------------------------------------------------------------------------------------- parallelism config
@pytest.mark.parametrize("field,words", [
    ("cp_size", ["context parallelism (cp_size=2)", "--hsap_sp_size 2", "parallelism_config_cp_size"]),
    ("sp_size", ["sp_size=2", "--hsap_sp_size 2", "HSAPConfig(sp_size=2)"]),
    ("tp_size", ["tensor parallelism (tp_size=2)", "parallelism_config_tp_size"]),
])
def test_parallelism_config_object_refused(field: str, words: list[str]) -> None:
    pc = SimpleNamespace(cp_size=1, sp_size=1, tp_size=1, sp_backend="deepspeed")
    setattr(pc, field, 2)
    with pytest.raises(ValueError) as err:
        check_parallelism_config(pc)
    for w in words:
        assert w in str(err.value)


def test_accelerate_parallelism_config_refused() -> None:
    from accelerate import ParallelismConfig

    with pytest.raises(ValueError, match="--hsap_sp_size 2"):
        check_parallelism_config(ParallelismConfig(sp_size=2))
    with pytest.raises(ValueError, match="context parallelism"):
        check_parallelism_config(ParallelismConfig(cp_size=2))
    check_parallelism_config(ParallelismConfig())  # all ones (None) passes


def test_parallelism_config_all_ones_passes() -> None:
    assert check_parallelism_config(SimpleNamespace(cp_size=1, sp_size=1, tp_size=1)) is None
    assert check_parallelism_config(SimpleNamespace(cp_size=None, sp_size=None, tp_size=None)) is None
    assert check_parallelism_config(SimpleNamespace()) is None


def test_parallelism_config_from_the_environment(monkeypatch) -> None:
    for key in ("CP_SIZE", "SP_SIZE", "TP_SIZE", "SP_BACKEND"):
        monkeypatch.delenv(f"PARALLELISM_CONFIG_{key}", raising=False)
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SIZE", "2")
    monkeypatch.delenv("ACCELERATE_USE_PARALLELISM_CONFIG", raising=False)
    check_parallelism_config()  # sizes without the switch: not a parallelism config
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    with pytest.raises(ValueError, match="--hsap_sp_size 2") as err:
        check_parallelism_config()
    assert "sp_backend=deepspeed" in str(err.value)
    monkeypatch.setenv("PARALLELISM_CONFIG_SP_SIZE", "1")
    check_parallelism_config()  # all ones
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_SIZE", "4")
    with pytest.raises(ValueError, match="cp_size=4"):
        check_parallelism_config()


def test_placements_and_rounds_lists() -> None:
    assert set(PLACEMENTS) == {"auto", "balanced", "contiguous", "density", "zigzag"}
    assert set(ROUNDS) == {"auto", "batched", "by_peer"}
    for p in PLACEMENTS:
        assert HSAPConfig(placement=p).placement == p
    for r in ROUNDS:
        assert HSAPConfig(rounds=r).rounds == r


@pytest.mark.parametrize("field,value", [("recv_budget_tokens", True), ("gpus_per_node", True),
                                         ("grad_comm_dtype", "int8"), ("token_slack", "abc"),
                                         ("token_slack", None), ("timeout_s", None)])
def test_every_bad_value_is_a_value_error_naming_its_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"HSAPConfig.{field}="):
        HSAPConfig(**{field: value})


def test_the_default_degree_is_per_batch_when_the_heads_are_known(caplog) -> None:
    """ulysses_size unset: per_batch when the query heads are known and the group has several ranks (logged), else
    auto; a degree the user gave is kept as given."""
    import logging

    from hf_hsap.config import resolve_ulysses_size

    with caplog.at_level(logging.INFO, logger="hf_hsap"):
        assert resolve_ulysses_size(None, 32, 8) == "per_batch"
    assert "per_batch" in caplog.text and "32 query heads" in caplog.text
    assert resolve_ulysses_size(None, None, 8) == "auto"
    assert resolve_ulysses_size(None, 32, 1) == "auto"
    for given in (1, 4, "auto", "per_batch"):
        assert resolve_ulysses_size(given, 32, 8) == given


@pytest.mark.parametrize("family", ["qwen2_5_vl", "gemma3", "llava"])
def test_a_vision_language_config_gives_its_decoders_heads_and_cost(family: str) -> None:
    """A composite config has no top-level heads: the heads, the cost model and the windows come from its text
    config, so the default degree of a VLM is per_batch like a language model's."""
    from hf_hsap.config import resolve_ulysses_size, text_config
    from hf_hsap.examples import tiny_vlm_config

    config = tiny_vlm_config(family)
    assert getattr(config, "num_attention_heads", None) is None  # what the heads were read from before
    text = text_config(config)
    assert text is not config and text.num_attention_heads == 4
    cfg = HSAPConfig(sp_size=4, model_config=config)
    assert (cfg.num_heads, cfg.num_kv_heads) == (4, 2)
    assert resolve_ulysses_size(cfg.ulysses_size, cfg.num_heads, cfg.sp_size) == "per_batch"
    assert cfg.cost_for("nvlink") is not None  # priced from the decoder's shapes
    assert text_config(text) is text and text_config({"num_attention_heads": 2}) == {"num_attention_heads": 2}
