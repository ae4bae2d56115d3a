"""Reference runs of the recipes, once per session (test_recipes.py and test_faults.py compare with them)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from recipe_runs import PRETRAIN_ARGS, PRETRAIN_SAVE, SFT_ARGS, SFT_SAVE, run_recipe


@pytest.fixture(scope="session")
def pretrain_sp1(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("pretrain_sp1")
    return out, run_recipe("pretrain.py", out, ["--sp_size", "1", "--save_every", str(PRETRAIN_SAVE),
                                                *PRETRAIN_ARGS])


@pytest.fixture(scope="session")
def sft_sp1(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("sft_sp1")
    return out, run_recipe("sft_trl.py", out, ["--sp_size", "1", "--save_every", str(SFT_SAVE), *SFT_ARGS])
