"""One CPU training run whose peak resident set the host-memory suite (:mod:`benchmarks.suites.host_memory`) compares
with the memory model: run as ``python -m benchmarks.suites.host_workers SPEC.json OUT.json`` (one process, SP 1) or
under ``torch.distributed.run --nproc_per_node 2`` (gloo, SP 2), each rank writing ``OUT.json.<rank>``.

What a rank does, in order: import torch, Transformers and hf_hsap; join the process group and build the SP group;
build the tiny random model and apply the levers (``prepare_model``); read its resident set less the model's weights
(the **footprint**: the process's own memory, the code of the model's modules included); make the optimizer (AdamW or
SGD) and run ``steps`` training steps on one packed row of one document (forward, backward, optimizer step,
``zero_grad(set_to_none=True)``); then read its peak resident set (``ru_maxrss``, the kernel's high-water mark over
the process's life).
"""
from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

import psutil


def _rss() -> int:
    return psutil.Process().memory_info().rss


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """One run of ``spec`` on this process (module docstring).

    Args:
        spec: ``sizes`` (config sizes), ``tokens``, ``levers`` (:class:`hf_hsap.MemoryLevers` fields), ``sp``,
            ``dtype`` (``"fp32"`` / ``"bf16"``), ``optimizer`` (``"adamw"`` / ``"sgd"``), ``steps``.

    Returns:
        ``{"footprint", "peak" (ru_maxrss), "before_build", "after_build", "weights"}`` in bytes and ``"loss"`` (per
        step).
    """
    import torch
    import transformers  # noqa: F401  (imported before the footprint is read, as a training script does)

    import hf_hsap
    from hf_hsap import prepare_model
    from hf_hsap.integrations import hsap_model_loss, shard_batch

    from .memory_model import build_model

    torch.set_num_threads(1)
    sp: Any = 1
    if spec["sp"] > 1:
        torch.distributed.init_process_group("gloo")
        sp = hf_hsap.init_sequence_parallel(hf_hsap.HSAPConfig(sp_size=spec["sp"], ulysses_size=1))
    before_build = _rss()
    model = build_model(spec["sizes"], spec["dtype"])
    prepared = prepare_model(model, sp_size=spec["sp"], levers=hf_hsap.MemoryLevers(**spec["levers"]))
    after_build = _rss()
    g = torch.Generator().manual_seed(0)
    tokens = spec["tokens"]
    ids = torch.randint(0, spec["sizes"]["vocab_size"], (1, tokens), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(tokens).unsqueeze(0)}
    local = shard_batch(batch, sp, check_previous=False)
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-4) if spec["optimizer"] == "adamw"
           else torch.optim.SGD(model.parameters(), lr=1e-4))
    losses = []
    for _ in range(spec["steps"]):
        with prepared.offload():
            loss = hsap_model_loss(model, local, local["num_items_in_batch"])
            loss.backward()
        losses.append(float(loss.detach()))
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"before_build": before_build, "footprint": after_build - weights, "peak": peak, "after_build": after_build,
            "weights": weights, "loss": losses}


def main(argv: list[str]) -> int:
    """``SPEC.json OUT.json``: run and write the result (``OUT.json.<rank>`` under a process group)."""
    spec = json.loads(Path(argv[0]).read_text())
    res = run(spec)
    rank = os.environ.get("RANK")
    Path(argv[1] + (f".{rank}" if spec["sp"] > 1 else "")).write_text(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
