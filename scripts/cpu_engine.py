"""Run a training script under DeepSpeed or FSDP on CPU processes: a check harness, not library code.

    accelerate launch --config_file <DeepSpeed or FSDP config> scripts/cpu_engine.py recipes/pretrain.py ARGS
    accelerate launch --config_file <...> scripts/cpu_engine.py -m hf_hsap.cli.sft ARGS

On a machine without GPUs Accelerate (1.16) runs neither engine: under DeepSpeed it picks no backend and counts
one process (the ranks would train apart; ``init_sequence_parallel`` refuses that state), and with
``Accelerator(cpu=True)`` it runs plain data parallelism (MULTI_CPU) and ignores the FSDP plugin. Both engines run on
CPU with gloo, so for the CPU checks (scripts/deepspeed_cpu_check.py, tests/recipes/test_fsdp2_offload.py) this
harness, before the script builds its Accelerator:

* DeepSpeed: makes Accelerate's backend choice gloo / MULTI_CPU where it found none (DeepSpeed then runs on its CPU
  accelerator, ``DS_ACCELERATOR=cpu``);
* FSDP: makes the Accelerate state FSDP with the plugin the launcher configured; the plugin's ``CPUOffloadPolicy``
  gets ``pin_memory=False`` (Accelerate builds it with torch's default ``pin_memory=True``, and pinning host
  memory needs an accelerator: "Cannot access accelerator device when none is available").

It prints ``ENGINE <distributed type> OFFLOAD <detect_offload>`` on rank 0 once the model is prepared.
"""
import os
import runpy
import sys

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

from hf_hsap.integrations.memory_fit import detect_offload

if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and not torch.cuda.is_available():
    _prepare_backend = PartialState._prepare_backend

    def _gloo_backend(self, cpu=False, sagemaker_dp=False, backend=None):  # noqa: ANN001, ANN202 - Accelerate's
        chosen, kind = _prepare_backend(self, cpu, sagemaker_dp, backend)
        return ("gloo", DistributedType.MULTI_CPU) if chosen is None else (chosen, kind)

    PartialState._prepare_backend = _gloo_backend

if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and not torch.cuda.is_available():
    from torch.distributed.fsdp import CPUOffloadPolicy

    _init = AcceleratorState.__init__

    def _fsdp_on_cpu(self, *args, fsdp_plugin=None, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        _init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            if isinstance(fsdp_plugin.cpu_offload, CPUOffloadPolicy):
                fsdp_plugin.cpu_offload = CPUOffloadPolicy(pin_memory=False)
            self.fsdp_plugin = fsdp_plugin
            self.distributed_type = DistributedType.FSDP
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = _fsdp_on_cpu

_prepare = Accelerator.prepare


def _prepare_and_report(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    out = _prepare(self, *args, **kwargs)
    if any(isinstance(a, torch.nn.Module) for a in args) and self.is_main_process:
        print(f"ENGINE {self.distributed_type.name} OFFLOAD {detect_offload(self)}", flush=True)
    return out


Accelerator.prepare = _prepare_and_report

if __name__ == "__main__":
    if sys.argv[1] == "-m":
        sys.argv = sys.argv[2:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
        runpy.run_path(sys.argv[0], run_name="__main__")
