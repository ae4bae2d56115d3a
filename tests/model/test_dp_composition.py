"""SP composes with DDP and FSDP2 over the whole world: after the wrapper's gradient averaging, every
parameter gradient equals single-device training on the same packed rows (float32, rel err <= 1e-4); also with
every memory lever (the chunked head's loss computed inside the wrapped forward, checkpointing, tiled MLP,
recomputed norms)."""
import pytest

from helpers import rel_err
from workers.composition import dp_sp_grads, reference_grads


@pytest.mark.parametrize("levers", [False, True], ids=["plain", "levers"])
@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_dp2_sp2_gradients_equal_single_device(pools, wrapper, levers):
    ref = reference_grads("qwen2")
    for grads in pools(4).run(dp_sp_grads, "qwen2", wrapper, 2, levers):
        assert grads.keys() == ref.keys()
        for name, g in grads.items():
            err = rel_err(g, ref[name])
            assert err <= 1e-4, (wrapper, name, err)
