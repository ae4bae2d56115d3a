"""benchmarks/suites/allocator.py: spawned ranks get the chosen allocator's glibc tunables and none of the others',
the parent's environment comes back unchanged, KEEP really stops a step's blocks from being mapped in again (page
faults counted, never timed), and the split-document report names the allocator and the other allocator's figures."""
from __future__ import annotations

import multiprocessing as mp
import os
import resource

import pytest

from benchmarks.report.recurrent_split import split_headline
from benchmarks.suites.allocator import ALLOCATORS, KEEP, spawn_env


def _env(names: list[str]) -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in names}


def _faults_of_a_second_round() -> int:
    """Minor page faults of allocating and freeing 48 MiB and 8 MiB tensors five times, after one such round."""
    import torch

    def rounds() -> None:
        for _ in range(5):
            a, b = torch.ones(12 << 20), torch.ones(2 << 20)
            del a, b

    rounds()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rounds()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _in_child(fn, *args):  # noqa: ANN001, ANN202
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def test_spawned_ranks_see_only_the_chosen_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    names = sorted(KEEP)
    monkeypatch.setenv(names[0], "12345")  # the parent's own setting: hidden from the default's ranks, then restored
    with spawn_env("keep") as env:
        assert env == KEEP and _in_child(_env, names) == KEEP
    with spawn_env("glibc_default") as env:
        assert env == {} and _in_child(_env, names) == {k: None for k in names}
    assert os.environ[names[0]] == "12345" and os.environ.get(names[1]) is None
    assert set(ALLOCATORS) == {"keep", "glibc_default"}


def test_keep_maps_no_block_in_again() -> None:
    with spawn_env("glibc_default"):
        default = _in_child(_faults_of_a_second_round)
    with spawn_env("keep"):
        kept = _in_child(_faults_of_a_second_round)
    assert default > 10_000 > 100 > kept  # 48 MiB mapped in five times (4 KiB pages) against none


def test_the_report_names_the_allocator_and_the_default_figures() -> None:
    row = {"A": {"cpu_s": 3.0, "equal": True}, "B": {"cpu_s": 2.5, "equal": True}, "cpu_ratio": 1.2}
    res = {"config": {"sizes": {"layers": 4, "hidden": 256}, "tokens": 8192}, "models": {"mamba2": {}},
           "modes": {"summary_exchange": {"status": "measured", "rows": [{"sp": 2, "models": {"mamba2": row}}]}},
           "allocators": {"measured": "keep", "env": KEEP, "check": {
               "allocator": "glibc_default", "env": {}, "sp": 2, "models": {"mamba2": {**row, "cpu_ratio": 1.31}}}}}
    head = "\n".join(split_headline(res))
    assert all(f"`{k}={v}`" in head for k, v in KEEP.items())
    assert "glibc's default allocator, same run: A / B Mamba2 1.31" in head and "| Mamba2 | 1.20 |" in head
