"""Attention sinks (GPT-OSS's ``s_aux``): one extra logit per query head in every softmax denominator.

A sink is a column of the softmax with a logit but no value (GPT-OSS's eager attention concatenates it to
the scores, takes the softmax and drops it). It joins each query's denominator once, so it is applied
after every partial result of the query was merged (:func:`apply_sinks`). The attention backward run with
the final (sunk) ``out``/``lse`` is exactly the gradient of q, k and v with sinks: ``P = exp(S - lse)``
already carries the sink's share of the denominator and ``delta = rowsum(dO * O)`` has no sink term (the
sink has no value). The sink's own gradient is :func:`sinks_grad`.

Both functions are plain tensor code without autograd, used by the autograd functions of
:func:`hf_hsap.kernels.varlen_attention` and of the sequence-parallel attention.
"""
from __future__ import annotations

import torch

from .base import lse_dtype

__all__ = ["apply_sinks", "sinks_grad"]


def _weight(a: torch.Tensor, lse_f: torch.Tensor) -> torch.Tensor:
    """``exp(a - lse_f)``, 0 where ``lse_f`` is ``-inf`` (a row with no key and a ``-inf`` sink)."""
    empty = torch.isneginf(lse_f)
    return torch.where(empty, torch.zeros_like(lse_f), torch.exp(a - torch.where(empty, 0.0, lse_f)))


def apply_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Add the sinks to the softmax denominators of merged attention results.

    Args:
        out: ``[N, H, D]`` merged attention output (accumulator dtype, fp32/fp64).
        lse: ``[N, H]`` its log-sum-exp (``-inf`` for a row that sees no key).
        sinks: ``[H]`` one logit per query head, any float dtype.

    Returns:
        ``(out_f [N, H, D], lse_f [N, H])`` in ``out``'s / ``lse``'s dtypes: ``lse_f = logaddexp(lse, sink)``,
        ``out_f = out * exp(lse - lse_f)``; a row with ``lse = -inf`` gets output 0 and ``lse_f = sink``.
    """
    if sinks.dim() != 1 or sinks.shape[0] != lse.shape[1]:
        raise ValueError(f"sinks must be [heads] = [{lse.shape[1]}] (one logit per query head), got "
                         f"{tuple(sinks.shape)}")
    s = sinks.detach().to(device=lse.device, dtype=lse.dtype).unsqueeze(0)  # [1, H]
    lse_f = torch.logaddexp(lse, s)  # [N, H]
    out_f = out * _weight(lse, lse_f).unsqueeze(-1).to(out.dtype)  # [N, H, 1] weights
    return out_f, lse_f


def sinks_grad(dout: torch.Tensor, out_f: torch.Tensor, lse_f: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Gradient of the loss with respect to the sinks.

    ``d sink_h = - sum_n exp(sink_h - lse_f[n, h]) * sum_d dout[n, h, d] * out_f[n, h, d]`` (the sink's
    softmax share times the derivative of the output along itself).

    Args:
        dout: ``[N, H, D]`` gradient of the attention output.
        out_f, lse_f: ``[N, H, D]``, ``[N, H]``: the final outputs (:func:`apply_sinks`).
        sinks: ``[H]`` the sink logits.

    Returns:
        ``[H]`` in ``sinks``' dtype and device, summed in fp32 (fp64 for fp64 inputs).
    """
    acc = torch.float64 if torch.float64 in (out_f.dtype, lse_f.dtype) else lse_dtype(out_f.dtype)
    delta = (dout.to(acc) * out_f.to(acc)).sum(-1)  # [N, H]
    share = _weight(sinks.detach().to(device=lse_f.device, dtype=acc).unsqueeze(0), lse_f.to(acc))  # [N, H]
    return -(share * delta).sum(0).to(device=sinks.device, dtype=sinks.dtype)
