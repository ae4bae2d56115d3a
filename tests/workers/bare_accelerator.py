"""Run under ``accelerate launch`` (tests/recipes/test_launch_checks.py): create an Accelerator as given by
argv[1] (``bare``: ``Accelerator()``; ``cpu``: ``Accelerator(cpu=True)``), then init_sequence_parallel."""
import sys

import torch.distributed as dist
from accelerate import Accelerator

import hf_hsap

accelerator = Accelerator() if sys.argv[1] == "bare" else Accelerator(cpu=True)
sp = hf_hsap.init_sequence_parallel(dist.get_world_size())
print(f"OK accelerator {accelerator.num_processes} processes, sp {sp.size}", flush=True)
dist.destroy_process_group()
