"""Shared pytest set-up.

* ``tests/`` is importable: worker functions for spawned ranks live in ``tests/workers`` (imported by name in
  the child processes) and the helpers shared by test modules in ``tests/helpers.py``.
* Hypothesis profiles ``ci`` (default) and ``long``, chosen by ``HSAP_HYPOTHESIS_PROFILE`` (below).
* ``pools``: the one way tests get spawned gloo ranks (a session-wide :class:`~hf_hsap.testing.DistPools`).
* The ``distributed`` marker (see ``pytest.ini``) on every test that uses ``pools``; tests that spawn processes
  another way (``accelerate launch``, their own ``multiprocessing`` ranks) carry it in their module.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from helpers import hypothesis_profile  # noqa: E402  (needs the path above)

from hf_hsap.testing import DistPools  # noqa: E402

# Hypothesis profiles, selected by the environment variable HSAP_HYPOTHESIS_PROFILE (default "ci"):
#   ci   - what CI and a plain `pytest` run: derandomized (the same examples on every run, so a failure
#          reproduces and no example database is written), 100 examples per property test (tests with slow
#          examples ask for fewer with @settings(max_examples=helpers.ci_examples(n))), no deadline (shared,
#          loaded machines), and a failing example is printed with its @reproduce_failure blob.
#   long - HSAP_HYPOTHESIS_PROFILE=long pytest ...: randomized, 2000 examples per property test, the
#          ci_examples ones included (hours on a laptop: a soak run, not a CI job).
# A test with a literal @settings(max_examples=n) keeps n under both profiles (use ci_examples instead).
if importlib.util.find_spec("hypothesis") is not None:  # absent where only tests/cuda runs (gpu_check.sh)
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, max_examples=100, deadline=None, print_blob=True)
    settings.register_profile("long", derandomize=False, max_examples=2000, deadline=None, print_blob=True)
    settings.load_profile(hypothesis_profile())


@pytest.fixture(scope="session")
def pools() -> Iterator[DistPools]:
    """Pools of spawned gloo ranks shared by the whole session: ``pools(world)`` (optionally
    ``pools(world, timeout_s=...)``, the task's hang guard) is a :class:`~hf_hsap.testing.DistPool` of
    ``world`` ranks, started on first use (seconds) and reused by every later test of any module; a pool
    that ended (a task timed out, a rank died) is replaced by a fresh one on the next call."""
    with DistPools() as opened:
        yield opened


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the ``pools`` fixture (directly or through another fixture) ``distributed``."""
    for item in items:
        if "pools" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.distributed)
