"""The journal every model change goes through (``hf_hsap.model_state.ModelChanges``): each kind of change is undone
exactly, newest first, also when the change that recorded it failed half-way."""
from __future__ import annotations

import pytest
import torch

from hf_hsap.model_state import RELAY, ModelChanges, state_of


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def test_every_kind_of_change_is_undone_newest_first() -> None:
    net, changes = _net(), ModelChanges()
    head, config = net[2], type("Config", (), {"use_cache": True})()
    config.use_cache = True  # the instance's own value
    changes.set(net, "2", torch.nn.Identity())  # a submodule swapped
    changes.set(net[0], "forward", lambda x: x)  # an instance forward
    changes.set(config, "use_cache", False)
    changes.put(net, RELAY, "state")
    changes.put(net, RELAY, "newer")  # put twice: undo restores the first, then removes it
    changes.hook(net.register_forward_hook(lambda *a: None))
    changes.keep(net[0], "weight_note")
    net[0].weight_note = "set by a library call"
    assert len(changes) == 7 and state_of(net, RELAY) == "newer"
    changes.undo()
    assert len(changes) == 0 and net[2] is head and "forward" not in net[0].__dict__
    assert config.use_cache is True and state_of(net, RELAY) is None and not net._forward_hooks
    assert "weight_note" not in net[0].__dict__


def test_hooks_a_failing_library_call_registered_are_undone() -> None:
    net, changes = _net(), ModelChanges()

    def library_call() -> None:  # registers hooks without handing out the handles, then fails
        net[0].register_forward_pre_hook(lambda *a: None)
        net[2].register_forward_hook(lambda *a: None, always_call=True, with_kwargs=True)
        raise RuntimeError("half-way")

    with pytest.raises(RuntimeError, match="half-way"), changes.hooks_registered_by(net):
        library_call()
    assert len(changes) == 2
    changes.undo()
    assert not any(m._forward_pre_hooks or m._forward_hooks or m._forward_hooks_always_called
                   or m._forward_hooks_with_kwargs for m in net.modules())
