"""SP composes with DDP and FSDP2 over the whole world: after the wrapper's gradient averaging, every
parameter gradient equals single-device training on the same packed rows (float32, rel err <= 1e-4)."""
import pytest

from hf_hsap.testing import DistPool
from workers.composition import dp_sp_grads, reference_grads


@pytest.fixture(scope="module")
def pool4():
    with DistPool(4) as pool:
        yield pool


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_dp2_sp2_gradients_equal_single_device(pool4, wrapper):
    ref = reference_grads("qwen2")
    for grads in pool4.run(dp_sp_grads, "qwen2", wrapper, 2):
        assert grads.keys() == ref.keys()
        for name, g in grads.items():
            err = (g - ref[name]).abs().max() / ref[name].abs().max().clamp_min(1e-12)
            assert err <= 1e-4, (wrapper, name, float(err))
