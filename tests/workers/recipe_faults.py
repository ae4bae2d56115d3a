"""One rank of a recipe with a fault injected at a chosen point (tests/recipes/test_faults.py).

    HSAP_TEST_FAULT=<kind>:<rank>:<step> python tests/workers/recipe_faults.py recipes/pretrain.py ARGS...

runs the recipe's ``main`` with, on rank ``<rank>`` only, at optimizer step ``<step>`` (1-based):

* ``sigterm_in_step`` / ``kill_in_step``: SIGTERM / SIGKILL to itself when the step's batches are drawn (its
  forward and backward still to run);
* ``sigterm_in_trainer_step``: SIGTERM to itself in the first ``Trainer.training_step`` of that step (the
  SFT recipe);
* ``kill_in_save``: SIGKILL to itself right after its own files of ``checkpoint-<step>`` are written (before
  every rank has finished: the checkpoint must stay partial);
* ``enospc_in_save``: ``OSError(ENOSPC)`` from ``torch.save`` while writing the optimizer of
  ``checkpoint-<step>``, after a few bytes of it (a full disk).

The hooks patch the recipe's objects in this process only; the recipe itself has no test hook.
"""
from __future__ import annotations

import errno
import os
import runpy
import signal
import sys
from pathlib import Path
from typing import Any

import torch


def install(kind: str, rank: int, step: int, recipes: Path) -> None:
    """Patch this process for the fault (see the module docstring)."""
    if kind == "none" or int(os.environ.get("RANK", "0")) != rank:
        return
    sys.path.insert(0, str(recipes))
    if kind == "sigterm_in_trainer_step":
        from transformers import Trainer

        training_step = Trainer.training_step

        def patched_training_step(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self.state.global_step + 1 == step and not getattr(self, "_fault_sent", False):
                self._fault_sent = True
                os.kill(os.getpid(), signal.SIGTERM)
            return training_step(self, *args, **kwargs)

        Trainer.training_step = patched_training_step
        return
    if kind in ("sigterm_in_step", "kill_in_step"):
        import pretrain_data

        draw = pretrain_data.StepData.micro_batches
        sig = signal.SIGTERM if kind == "sigterm_in_step" else signal.SIGKILL

        def micro_batches(self: Any, s: int, *args: Any, **kwargs: Any) -> Any:
            if s + 1 == step:
                os.kill(os.getpid(), sig)
            return draw(self, s, *args, **kwargs)

        pretrain_data.StepData.micro_batches = micro_batches
        return
    from accelerate import Accelerator

    save_state = Accelerator.save_state
    torch_save = torch.save
    saving: list[str] = []

    def patched_save_state(self: Any, output_dir: str | None = None, **kwargs: Any) -> Any:
        here = Path(str(output_dir)).name == f"checkpoint-{step}"
        saving.append(str(output_dir)) if here else None
        try:
            out = save_state(self, output_dir, **kwargs)
        finally:
            saving.clear()
        if here and kind == "kill_in_save":
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    def patched_torch_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if saving and kind == "enospc_in_save" and "optimizer" in str(f):
            with open(f, "wb") as fh:
                fh.write(b"\0" * 64)
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return torch_save(obj, f, *args, **kwargs)

    Accelerator.save_state = patched_save_state
    torch.save = patched_torch_save


if __name__ == "__main__":
    kind, rank, step = os.environ["HSAP_TEST_FAULT"].split(":")
    script = Path(sys.argv[1]).resolve()
    install(kind, int(rank), int(step), script.parent)
    sys.argv = sys.argv[1:]
    runpy.run_path(str(script), run_name="__main__")
