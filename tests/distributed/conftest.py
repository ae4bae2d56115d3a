"""Pools of spawned gloo ranks shared by the distributed tests (one pool per world size)."""
import pytest

from hf_hsap.testing import DistPool


@pytest.fixture(scope="session")
def pools():
    opened: dict[int, DistPool] = {}

    def get(world: int) -> DistPool:
        if world not in opened:
            opened[world] = DistPool(world)
        return opened[world]

    yield get
    for pool in opened.values():
        pool.close()
