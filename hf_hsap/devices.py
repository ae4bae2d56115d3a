"""Device queries: which GPU this process runs on, named by the table of :mod:`hf_hsap.hardware`.

The planner (:mod:`hf_hsap.plan`) never queries a device; code that builds a cost model for the
process's own GPU passes ``detect_hardware()`` to :meth:`hf_hsap.CostModel.from_config`.
"""
from __future__ import annotations

from .hardware import cost_hardware_for_device_name

__all__ = ["detect_hardware", "device_name"]


def device_name() -> str | None:
    """``torch.cuda.get_device_name()`` of the current device.

    Returns:
        The name, or ``None`` without a CUDA (or ROCm) device.
    """
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name()


def detect_hardware() -> str:
    """The cost-model hardware key of this process's GPU.

    Returns:
        ``"H100"`` on Hopper GPUs (H100, H200, H800, GH200), ``"B200"`` / ``"GB200"`` on Blackwell,
        ``"A100"`` on A100 / A800, and ``"A100"`` (:data:`hf_hsap.hardware.DEFAULT_HARDWARE`) on any
        other GPU or without one (:func:`hf_hsap.hardware.cost_hardware_for_device_name`).
    """
    return cost_hardware_for_device_name(device_name())
