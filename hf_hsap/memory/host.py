"""Where offloading puts the weights, gradients and optimizer states, and a training step's host memory (pure: no
torch, no device query; the machine's figures are arguments).

**Offload** (``offload=`` of :func:`~.model.predict_step_memory`), as the engines hold it per process (``N`` =
the world size, ``P`` = parameters, ``w`` = bytes of a 16-bit or float32 weight):

* ``"none"``: everything on the device (the model module's docstring).
* ``"optimizer"``: DeepSpeed ZeRO-3 ``offload_optimizer: {device: cpu}``. The device keeps the 16-bit weights'
  shard (``P w / N``) and the gathered layer; DeepSpeed's ``stage3.py`` keeps on the host a float32 master copy of
  the shard (``4 P / N``, made on the host whatever the weights' dtype), DeepSpeedCPUAdam's two float32 moments
  (``8 P / N``), the flat float32 buffer the reduced gradient partitions are copied into
  (``grad_partitions_flat_buffer``, ``4 P / N``) and the float32 gradient of each optimizer sub-group
  (``4 P / N`` over sub-groups of at most ``sub_group_size`` = 1e9 elements); with ``pin_memory: true`` (what the
  shipped configs set) both gradient buffers are pinned. The step runs on the CPU, then each sub-group's float32
  master is copied into the device's 16-bit shard: the cast happens on the host first (a 16-bit copy of one
  sub-group). The device holds no optimizer state and no gradient shard (each is copied to the host as it is
  reduced; only the layer being reduced is on the device). FSDP2 has no optimizer-only offload (refused).
* ``"params"``: also the parameters on the host, gathered layer by layer onto the device. ZeRO-3
  ``offload_param: {device: cpu}`` (which DeepSpeed runs with ``offload_optimizer``): the 16-bit shard in one
  pinned flat buffer per parameter group. FSDP2's ``CPUOffloadPolicy`` (``pin_memory=True``, its default): each
  parameter's shard lives pinned on the host in the dtype the optimizer steps (float32 under mixed precision: the
  master weights themselves), its gradient is copied into pinned host memory when reduced, and the optimizer (with
  its moments) runs on the CPU; before a layer runs its shard is copied to the device and gathered. ``"params"``
  implies ``"optimizer"``, as CPUOffloadPolicy does.

**Pinned memory** comes from PyTorch's caching host allocator, which rounds every allocation up to a power of two
(``CachingHostAllocator.h``: ``PowerOf2Ceil``, unless ``pinned_max_round_threshold`` is set; unlimited by
default): :func:`pinned_bytes`; the engines' offload buffers are priced so. TRL's activation offloading pins one
host tensor per saved tensor that way (a checkpointed layer input of 6 GB takes 8 GiB of the host); hf_hsap's
offloading does not: it cuts a step's saved tensors from one exactly sized registered slab (:mod:`.offload`).

**Host memory** (:class:`HostMemory`, :func:`host_memory`) per process: the process's own footprint (Python, torch,
the CUDA runtime and kernels, NCCL, the data loader: :data:`DEFAULT_PROCESS_FOOTPRINT_GIB`), the offloaded
activations, the offloaded optimizer (master and moments), gradients and parameters, and on CPU every tensor of the
step. Per node: per process x GPUs per node. The node's memory: :data:`DEFAULT_HOST_MEMORY_GIB` less
:data:`HOST_RESERVE_FRACTION` for the OS.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ..model_shape import ModelShape

__all__ = ["DEFAULT_GPUS_PER_NODE", "DEFAULT_HOST_MEMORY_GIB", "DEFAULT_PROCESS_FOOTPRINT_GIB", "HOST_RESERVE_FRACTION",
           "HOST_TERMS", "HostMemory", "OFFLOADS", "Placement", "host_budget_bytes", "host_memory", "pinned_bytes",
           "place_states"]

OFFLOADS = ("none", "optimizer", "params")
# A DGX-H100 node's system memory: 2 TB (32 x 64 GB DIMMs, NVIDIA's DGX H100 datasheet), read as 2,048 GiB
DEFAULT_HOST_MEMORY_GIB = 2048.0
# kept free of training on every node: the kernel, the page cache that dataset reads and checkpoint writes go
# through, monitoring; pinned pages cannot be swapped or reclaimed, so a node pinned to the last page gets the OOM
# killer (and cgroup limits of Slurm / Kubernetes usually sit below the physical memory)
HOST_RESERVE_FRACTION = 0.10
# per GPU process, beside its tensors: Python, torch, Transformers and the tokenizer (about 0.6 GiB resident, measured
# on CPU), the CUDA runtime with cuBLAS / cuDNN / flash-attention kernels loaded (2-3 GiB resident), NCCL's host
# buffers and proxy threads (about 0.5 GiB) and the data loader's workers (forked, about 1 GiB each with prefetch, 2
# workers): rounded up to 8 GiB. A stated default, not a measurement: override it where yours is known.
DEFAULT_PROCESS_FOOTPRINT_GIB = 8.0
DEFAULT_GPUS_PER_NODE = 8
DS_SUB_GROUP_SIZE = 10**9  # DeepSpeed's default sub_group_size (elements per optimizer sub-group)
HOST_TERMS = ("footprint", "cpu_step", "activations", "optimizer", "grads", "params")
GIB = 2**30


def pinned_bytes(nbytes: float, count: int = 1, *, round_limit_mb: float | None = None) -> float:
    """Bytes ``count`` pinned host allocations of ``nbytes`` each take: the caching host allocator rounds each up to
    a power of two (module docstring), unless larger than ``round_limit_mb`` MiB (``PYTORCH_ALLOC_CONF``'s
    ``pinned_max_round_threshold_mb``; None: torch's default, no limit)."""
    if nbytes <= 0 or count <= 0:
        return 0.0
    if round_limit_mb is not None and nbytes > round_limit_mb * 2**20:
        return float(count) * nbytes
    return float(count) * 2.0 ** math.ceil(math.log2(nbytes))


@dataclass(frozen=True)
class Placement:
    """Where the weights, gradients and optimizer states live (bytes per process; module docstring).

    Attributes:
        weights: on the device (the shard that stays and the gathered layer).
        grad_per_param: device bytes per parameter of the gradients that stay there as they form (``w / N``; 0 when
            offloaded).
        grads_all: the device's gradients at the optimizer stage.
        states: optimizer states on the device; opt_tmp: the device optimizer's temporaries.
        host: tensors on the host by term: ``optimizer`` (master and moments, the step's temporaries), ``grads``,
            ``params`` (pinned buffers with their rounding on CUDA).
    """

    weights: float
    grad_per_param: float
    grads_all: float
    states: float
    opt_tmp: float
    host: dict[str, float] = field(default_factory=dict)


def _param_shards(s: ModelShape) -> list[tuple[int, int]]:
    """``(numel, count)`` of every parameter tensor (a dense decoder's exactly; an MoE layer's experts as Transformers'
    fused ``gate_up_proj`` / ``down_proj``)."""
    H, D = s.hidden, s.head_dim
    per_layer = [(H * s.q_heads * D, 2), (H * s.kv_heads * D, 2), (H, 2)]
    if s.qk_norm:
        per_layer.append((D, 2))
    if s.experts:
        per_layer += [(s.experts * 2 * s.moe_intermediate * H, 1), (s.experts * H * s.moe_intermediate, 1),
                      (s.experts * H, 1)]
        if s.shared_intermediate:
            per_layer.append((H * s.shared_intermediate, 3))
    else:
        per_layer.append((H * s.intermediate, 3))
    out = [(n, c * s.layers) for n, c in per_layer]
    return out + [(s.vocab * H, 1 if s.tied else 2), (H, 1)]


def place_states(s: ModelShape, *, w: int, shard: int, sharding: str, optimizer: str, master_weights: bool,
                 offload: str, device: str, pinned_round_limit_mb: float | None = None) -> Placement:
    """The weights, gradients and optimizer states of ``s``, on the device and on the host.

    Args:
        s: the model's shape. w: bytes of a weight. shard: the ranks the states are divided over (1: unsharded).
        sharding: ``"none"``, ``"ddp"``, ``"fsdp2"`` or ``"zero3"``. optimizer: ``"adamw"`` or ``"sgd"``.
        master_weights: a float32 master copy of 16-bit weights. offload: :data:`OFFLOADS`.
        device: ``"cuda"`` (pinned buffers rounded up to powers of two) or ``"cpu"`` (no pinning).
        pinned_round_limit_mb: as for :func:`pinned_bytes`.

    Returns:
        :class:`Placement`.

    Raises:
        ValueError: an offload the sharding has no engine for.
    """
    if offload not in OFFLOADS:
        raise ValueError(f"offload must be one of {', '.join(OFFLOADS)}, got {offload!r}")
    if offload != "none" and sharding not in ("zero3", "fsdp2"):
        raise ValueError(f"offload={offload!r} needs sharding 'zero3' (DeepSpeed ZeRO-3 offload_optimizer / "
                         "offload_param) or 'fsdp2' (CPUOffloadPolicy: offload='params'), got sharding "
                         f"{sharding!r}")
    if offload == "optimizer" and sharding == "fsdp2":
        raise ValueError("FSDP2's CPUOffloadPolicy offloads the parameters with the optimizer: use offload='params'")
    P, layer_w = s.params, s.layer_params * w
    master = master_weights and w < 4
    m = 4 if master else w  # the dtype AdamW steps in
    moments = 2 if optimizer == "adamw" else 0
    if offload == "none":
        grads_all = P * w / shard + (layer_w if shard > 1 else P * w if sharding == "ddp" else 0)  # DDP: buckets
        opt_tmp = (P * m / shard if device == "cuda" else max(s.vocab * s.hidden, s.layer_params) * m / shard) \
            if moments else 0.0
        return Placement(P * w / shard + (layer_w if shard > 1 else 0), w / shard, grads_all,
                         P * (moments * m + (4 if master else 0)) / shard, opt_tmp)
    def pin(nbytes: float, count: int = 1) -> float:
        if device != "cuda":
            return float(nbytes) * count
        return pinned_bytes(nbytes, count, round_limit_mb=pinned_round_limit_mb)

    n = math.ceil(P / shard)  # elements of this rank's shard
    if sharding == "zero3":  # DeepSpeed keeps float32 master, moments and two float32 gradient buffers on the host
        groups, rest = divmod(n, DS_SUB_GROUP_SIZE)
        sub_grads = pin(4 * DS_SUB_GROUP_SIZE, groups) + pin(4 * rest)
        host = {"optimizer": 4.0 * n + 4.0 * moments * n + min(n, DS_SUB_GROUP_SIZE) * w,
                "grads": pin(4 * n) + sub_grads,
                "params": pin(w * n) if offload == "params" else 0.0}
        weights = (w * n if offload == "optimizer" else 0.0) + layer_w
        return Placement(weights, 0.0, 0.0, 0.0, 0.0, host)
    # FSDP2 CPUOffloadPolicy: each shard pinned in the optimizer's dtype, its gradient pinned, moments unpinned
    shards = [(math.ceil(k / shard) * m, c) for k, c in _param_shards(s)]
    pinned = sum(pin(b, c) for b, c in shards)
    host = {"optimizer": moments * m * n + max(b for b, _ in shards),  # moments; one tensor's step temporary (CPU)
            "grads": pinned, "params": pinned}
    return Placement(layer_w + s.layer_params * m / shard, 0.0, 0.0, 0.0, 0.0, host)


@dataclass(frozen=True)
class HostMemory:
    """A step's host memory per process and per node, in bytes (module docstring).

    Attributes:
        footprint: the process's own (Python, torch, CUDA runtime, NCCL, data loader).
        cpu_step: on CPU, every tensor of the step (the device terms live in host memory); 0 on CUDA.
        activations: the offloaded saved tensors (hf_hsap's pinned slab, :mod:`.offload`).
        optimizer: offloaded master weights and moments, and the CPU step's temporaries.
        grads: offloaded gradient buffers. params: offloaded parameters.
        gpus_per_node: processes per node.
    """

    footprint: float
    cpu_step: float
    activations: float
    optimizer: float
    grads: float
    params: float
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE

    @property
    def per_process(self) -> float:
        """Bytes one process holds in host memory."""
        return float(sum(getattr(self, t) for t in HOST_TERMS))

    @property
    def per_node(self) -> float:
        """Bytes one node holds: :attr:`per_process` x :attr:`gpus_per_node`."""
        return self.per_process * self.gpus_per_node

    def limiting_term(self) -> str:
        """The largest term."""
        return max(HOST_TERMS, key=lambda t: getattr(self, t))

    def as_dict(self) -> dict[str, Any]:
        """Every term, the totals and the limiting term (bytes)."""
        return {**asdict(self), "per_process": self.per_process, "per_node": self.per_node,
                "limiting_term": self.limiting_term()}

    def table(self) -> str:
        """A plain-text table of the terms per process in GiB, and the node's total."""
        rows = [f"{t:<12s}{getattr(self, t) / GIB:10.2f} GiB" for t in HOST_TERMS]
        return "\n".join(rows + [f"{'per process':<12s}{self.per_process / GIB:10.2f} GiB",
                                 f"{'per node':<12s}{self.per_node / GIB:10.2f} GiB  ({self.gpus_per_node} processes)"])


def host_memory(step: Any, *, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                footprint_gib: float = DEFAULT_PROCESS_FOOTPRINT_GIB, device: str = "cuda") -> HostMemory:
    """The host memory of a modelled step.

    Args:
        step: a :class:`~.model.StepMemory` (its ``host_terms``: the tensors it keeps on the host).
        gpus_per_node: processes per node. footprint_gib: one process's own footprint (GiB).
        device: the step's device: on ``"cpu"`` every device term (``step.total``) is host memory too.

    Returns:
        :class:`HostMemory`.
    """
    h = getattr(step, "host_terms", {}) or {}
    return HostMemory(footprint_gib * GIB, step.total if device == "cpu" else 0.0, h.get("activations", 0.0),
                      h.get("optimizer", 0.0), h.get("grads", 0.0), h.get("params", 0.0), gpus_per_node)


def host_budget_bytes(host_memory_gib: float, *, gpus_per_node: int,
                      reserve_fraction: float = HOST_RESERVE_FRACTION) -> float:
    """Bytes of host memory one process may use: the node's memory less the OS reserve, over its processes."""
    return host_memory_gib * (1 - reserve_fraction) * GIB / gpus_per_node
