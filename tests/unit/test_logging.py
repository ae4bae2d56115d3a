"""hf_hsap's logging: quiet by default, one "hf_hsap" hierarchy, decisions at DEBUG once per case."""
from __future__ import annotations

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import hf_hsap  # noqa: F401  (registers attn_implementation="hsap")
from hf_hsap.data import PackingCollator
from hf_hsap.log import forget_logged, get_logger, log_once

VOCAB = 61


@pytest.fixture(autouse=True)
def _fresh_once() -> None:
    forget_logged()  # each test sees every case logged again
    yield
    forget_logged()


def _tiny_llama() -> torch.nn.Module:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                         bos_token_id=None, eos_token_id=None, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="hsap").float().eval()
    assert model.config._attn_implementation == "hsap"
    return model


def _packed(lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and position_ids ``[1, T]`` of documents of ``lens`` tokens packed into one row."""
    ids = torch.randint(1, VOCAB, (1, sum(lens)), generator=torch.Generator().manual_seed(1))
    pos = torch.cat([torch.arange(n) for n in lens]).unsqueeze(0)  # [1, T], restarting at every document
    return ids, pos


def _ours(caplog: pytest.LogCaptureFixture, level: int = logging.NOTSET) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("hf_hsap") and r.levelno >= level]


def _branches(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in _ours(caplog) if "single-device branch" in r.getMessage()]


def test_the_library_logger_is_quiet_and_propagates() -> None:
    root = logging.getLogger("hf_hsap")
    assert root.handlers == []  # no handler of its own: no NullHandler either, which would silence warnings
    assert root.propagate and root.level == logging.NOTSET  # the application decides the level
    assert get_logger() is root and get_logger("hf_hsap") is root
    assert get_logger("data").name == "hf_hsap.data"
    assert get_logger("hf_hsap.integrations.trainer").parent.name in ("hf_hsap", "hf_hsap.integrations")
    for name in ("hf_hsap.integrations.local_attention", "hf_hsap.integrations.trainer", "hf_hsap.kernels.select",
                 "hf_hsap.data.packing"):
        logger = logging.getLogger(name)
        assert logger.propagate and logger.level == logging.NOTSET, name


def test_log_once_remembers_only_what_it_logged(caplog: pytest.LogCaptureFixture) -> None:
    logger = get_logger("tests.log_once")
    caplog.set_level(logging.INFO, logger="hf_hsap")
    assert not log_once(logger, logging.DEBUG, "k", "case %d", 1)  # DEBUG off: not logged, not remembered
    caplog.set_level(logging.DEBUG, logger="hf_hsap")
    assert log_once(logger, logging.DEBUG, "k", "case %d", 1)
    assert not log_once(logger, logging.DEBUG, "k", "case %d", 1)
    assert log_once(logger, logging.DEBUG, "other", "case %d", 2)
    assert [r.getMessage() for r in _ours(caplog)] == ["case 1", "case 2"]


def test_single_device_attention_logs_its_layout_branch_once(caplog: pytest.LogCaptureFixture) -> None:
    model = _tiny_llama()
    ids, pos = _packed([5, 3, 8])
    caplog.set_level(logging.DEBUG, logger="hf_hsap")
    with torch.no_grad():  # without a cache masking_utils composes the packed documents: the mask's ids
        model(input_ids=ids, position_ids=pos, use_cache=False)
        model(input_ids=ids, position_ids=pos, use_cache=False)  # 2 forwards x 2 layers: one case, logged once
    branches = _branches(caplog)
    assert len(branches) == 1, branches
    assert "'same_length'" in branches[0] and "document ids" in branches[0] and "LlamaAttention" in branches[0]
    assert "3 segments" in branches[0]
    assert not _ours(caplog, logging.WARNING)  # a normal call: nothing at WARNING

    caplog.clear()
    with torch.no_grad():  # with a cache the mask function sees no documents: position_ids split them
        model(input_ids=ids, position_ids=pos)
    branches = _branches(caplog)
    assert len(branches) == 1 and "(no mask, position_ids)" in branches[0] and "3 segments" in branches[0], branches

    caplog.clear()
    cu = torch.tensor([0, 5, 8, 16], dtype=torch.int32)
    with torch.no_grad():
        model(input_ids=ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    branches = _branches(caplog)
    assert len(branches) == 1 and "'cu_seq_lens'" in branches[0], branches
    assert not _ours(caplog, logging.WARNING)


def test_generation_logs_the_cached_branch(caplog: pytest.LogCaptureFixture) -> None:
    model = _tiny_llama()
    prompt = torch.randint(1, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    caplog.set_level(logging.DEBUG, logger="hf_hsap")
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=3, do_sample=False)
    branches = _branches(caplog)
    assert any("'same_length'" in b for b in branches), branches  # the prefill
    assert sum("'cached'" in b for b in branches) == 1, branches  # every decoding step: one case
    assert not _ours(caplog, logging.WARNING)


def test_nothing_is_logged_when_debug_is_off(caplog: pytest.LogCaptureFixture) -> None:
    model = _tiny_llama()
    ids, pos = _packed([4, 4])
    caplog.set_level(logging.INFO, logger="hf_hsap")
    with torch.no_grad():
        model(input_ids=ids, position_ids=pos)
    assert not _branches(caplog)
    caplog.set_level(logging.DEBUG, logger="hf_hsap")  # not remembered while off: logged once turned on
    with torch.no_grad():
        model(input_ids=ids, position_ids=pos)
    assert len(_branches(caplog)) == 1


def test_packing_collator_logs_cuts_and_warns_without_a_prompt_mask(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="hf_hsap")
    PackingCollator(max_length=4)([{"input_ids": [1, 2, 3]}])
    assert not _ours(caplog)  # nothing to cut, masks not asked for: silent
    PackingCollator(max_length=4, overflow="truncate")([{"input_ids": [1, 2, 3, 4, 5, 6]}])
    info = [r for r in _ours(caplog) if r.levelno == logging.INFO]
    assert len(info) == 1 and "truncated" in info[0].getMessage() and "2 tokens dropped" in info[0].getMessage()
    assert not _ours(caplog, logging.WARNING)
    collate = PackingCollator(max_length=8, completion_only_loss=True)
    collate([{"input_ids": [1, 2, 3], "completion_mask": [0, 1, 1]}])
    assert not _ours(caplog, logging.WARNING)  # a mask: nothing falls back
    collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    warnings = _ours(caplog, logging.WARNING)
    assert len(warnings) == 1 and "2 of 2 examples" in warnings[0].getMessage()


def test_warnings_reach_stderr_and_decisions_stay_quiet_without_configuration() -> None:
    """A fresh process with no logging set up: an hf_hsap WARNING is printed (Python's last-resort handler),
    an INFO decision is not."""
    import subprocess
    import sys

    code = ("import logging, hf_hsap; lg = logging.getLogger('hf_hsap.data.packing'); "
            "lg.info('a decision'); lg.warning('a fallback')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "a fallback" in res.stderr and "a decision" not in res.stderr
