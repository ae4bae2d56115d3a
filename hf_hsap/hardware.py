"""The one table of GPU kinds (pure: no torch, no device query; the benchmark models' shapes: :mod:`.model_shape`).

Every GPU figure of the project is read from :data:`GPU_KINDS`: the planner's cost model
(:meth:`hf_hsap.CostModel.from_config`, ``HARDWARE_LINKS``), :func:`hf_hsap.devices.detect_hardware`,
the benchmark cost model (``benchmarks/analytic/cost_model.py``), the calibration script
(``benchmarks/suites/gpu_calibrate.py``) and the recipes' MFU (``recipes/common.py``). A process's GPU is
identified from its ``torch.cuda.get_device_name()`` by :func:`hardware_for_device_name` (the caller
queries the device; this module never does).

Where the figures come from (vendor datasheets, per GPU):

* ``peak_bf16_flops``: dense (no sparsity) bf16 tensor-core peak of the SXM / flagship part. A100 312,
  H100 SXM 989 TFLOP/s (NVIDIA A100 / H100 datasheets); H200, H800 and GH200 have the H100's Hopper
  compute. B200 2.25 and GB200 2.5 PFLOP/s (NVIDIA DGX B200 / GB200 NVL72 datasheets: half the
  sparse figure). L40S 362, L4 121, A10G 70, RTX 4090 165, RTX 3090 71, V100 125 (fp16; V100 has no
  bf16), MI300X 1307 TFLOP/s (AMD datasheet), L40 181 TFLOP/s (NVIDIA L40 datasheet); an L40 is its own
  kind, not an L4 (the longest name that matches wins).
* ``nvlink_bytes_per_s``: per GPU, per direction = half the datasheet's bidirectional NVLink figure:
  A100 600 GB/s -> 300e9, H100 900 GB/s -> 450e9, B200 / GB200 (NVLink 5) 1.8 TB/s -> 900e9.
* ``network_bytes_per_s``: one InfiniBand NIC per GPU, per direction, as in the DGX reference nodes:
  A100 HDR 200 Gb/s -> 25e9; H100, B200, GB200 NDR / ConnectX-7 400 Gb/s -> 50e9.

Kinds and name variants (one value each, for every user of the table):

* B200 / GB200: kinds of their own with the Blackwell figures above, so the planner on a B200 weighs its
  faster compute and NVLink.
* H200, H800, GH200: name variants of the ``"H100"`` kind (same compute and, except the export-limited
  H800 NVLink, same links). An H100 PCIe (756 TFLOP/s) is matched as an H100 SXM too.
* A800: a name variant of ``"A100"``.

Only kinds with both link figures can price a plan (:func:`cost_model_kinds`: ``"A100"``, ``"H100"``,
``"B200"``, ``"GB200"``). Every other GPU, and a process without one, is priced as
:data:`DEFAULT_HARDWARE` (``"A100"``).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

__all__ = [
    "DEFAULT_HARDWARE",
    "GPUKind",
    "GPU_KINDS",
    "cost_hardware_for_device_name",
    "cost_model_kinds",
    "gpu_kind",
    "hardware_for_device_name",
    "peak_flops_for_device_name",
]


@dataclass(frozen=True)
class GPUKind:
    """One kind of GPU.

    Args:
        key: the table's name for it (``"A100"``, ``"H100"``, ...): what ``hardware=`` takes.
        name_substrings: substrings of ``torch.cuda.get_device_name()`` that identify it (case-sensitive;
            the longest match over the whole table wins, so ``"GB200"`` beats ``"B200"``).
        peak_bf16_flops: dense bf16 tensor-core peak FLOP/s of one GPU.
        nvlink_bytes_per_s: NVLink bytes/s per GPU, per direction (``None``: not given; the kind cannot
            price a plan).
        network_bytes_per_s: network (between nodes) bytes/s per GPU, per direction (``None``: not given).
    """

    key: str
    name_substrings: tuple[str, ...]
    peak_bf16_flops: float
    nvlink_bytes_per_s: float | None = None
    network_bytes_per_s: float | None = None

    @property
    def has_links(self) -> bool:
        """Whether both link figures are given (the kind can price a plan)."""
        return self.nvlink_bytes_per_s is not None and self.network_bytes_per_s is not None


GPU_KINDS: tuple[GPUKind, ...] = (
    GPUKind("A100", ("A100", "A800"), 312e12, 300e9, 25e9),
    GPUKind("H100", ("H100", "H200", "H800", "GH200"), 989e12, 450e9, 50e9),
    GPUKind("B200", ("B200",), 2.25e15, 900e9, 50e9),
    GPUKind("GB200", ("GB200",), 2.5e15, 900e9, 50e9),
    GPUKind("L40S", ("L40S",), 362e12),
    GPUKind("L40", ("L40",), 181e12),
    GPUKind("L4", ("L4",), 121e12),
    GPUKind("A10G", ("A10G",), 70e12),
    GPUKind("RTX 4090", ("RTX 4090",), 165e12),
    GPUKind("RTX 3090", ("RTX 3090",), 71e12),
    GPUKind("V100", ("V100",), 125e12),
    GPUKind("MI300X", ("MI300X",), 1307e12),
)
DEFAULT_HARDWARE = "A100"
_BY_KEY: Mapping[str, GPUKind] = MappingProxyType({k.key: k for k in GPU_KINDS})


def gpu_kind(key: str) -> GPUKind:
    """The table's entry for a key.

    Args:
        key: a :attr:`GPUKind.key` (``"A100"``, ``"H100"``, ...).

    Returns:
        The entry.

    Raises:
        ValueError: an unknown key (the message lists the known ones).
    """
    if key not in _BY_KEY:
        raise ValueError(f"unknown hardware {key!r}; choose one of {', '.join(_BY_KEY)}")
    return _BY_KEY[key]


def cost_model_kinds() -> tuple[str, ...]:
    """Keys of the kinds that can price a plan (both link figures given), in table order.

    Returns:
        ``("A100", "H100", "B200", "GB200")``.
    """
    return tuple(k.key for k in GPU_KINDS if k.has_links)


def hardware_for_device_name(name: str) -> str | None:
    """The kind a device name belongs to.

    Args:
        name: a ``torch.cuda.get_device_name()`` string, e.g. ``"NVIDIA H100 80GB HBM3"``.

    Returns:
        The :attr:`GPUKind.key` whose longest matching substring is the longest in the table
        (``"NVIDIA GH200 480GB"`` -> ``"H100"``, ``"NVIDIA GB200"`` -> ``"GB200"``), or ``None``
        when no substring matches.
    """
    best, best_len = None, 0
    for kind in GPU_KINDS:
        for sub in kind.name_substrings:
            if sub in name and len(sub) > best_len:
                best, best_len = kind.key, len(sub)
    return best


def peak_flops_for_device_name(name: str) -> float | None:
    """Dense bf16 peak FLOP/s of one device, for MFU.

    Args:
        name: a ``torch.cuda.get_device_name()`` string.

    Returns:
        The kind's :attr:`GPUKind.peak_bf16_flops`, or ``None`` for an unknown device.
    """
    key = hardware_for_device_name(name)
    return None if key is None else _BY_KEY[key].peak_bf16_flops


def cost_hardware_for_device_name(name: str | None) -> str:
    """The cost-model hardware key for a device name.

    Args:
        name: a ``torch.cuda.get_device_name()`` string, or ``None`` (no GPU).

    Returns:
        The device's kind when it can price a plan (:func:`cost_model_kinds`), else
        :data:`DEFAULT_HARDWARE`.
    """
    key = None if name is None else hardware_for_device_name(name)
    return key if key is not None and _BY_KEY[key].has_links else DEFAULT_HARDWARE
