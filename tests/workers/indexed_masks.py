"""Worker of the Qwen4-Exp tests (``tests/model/test_indexed_masks.py``): its tiny text model (gated delta rule layers,
a QSA indexed layer keeping 2 blocks of 4 keys and the incomplete tail, per-layer n-gram embeddings with their dilated
convolution on two layers) on the zoo's packed row under SP (``zoo.sp_rank_run``: float64, logits and every parameter
gradient)."""
from __future__ import annotations

import torch

from workers import zoo
from workers import zoo_configs as ZC

FAMILY = "qwen4_exp_text"
PLE_CONV = "ple.conv1d.weight"  # zero at init (Transformers' choice): drawn here, so its output counts too


def tiny_state() -> tuple[object, dict[str, torch.Tensor]]:
    """The tiny config and float64 weights (the PLE convolutions' weights drawn, not zero)."""
    config = ZC.tiny_config(FAMILY)
    with zoo.full_precision(config, torch.float64):
        model = ZC.build_model(config, "eager", torch.float64, draw=torch.float64)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(11)
    for k in state:
        if k.endswith(PLE_CONV):
            state[k] = 0.2 * torch.randn(state[k].shape, generator=gen, dtype=torch.float64)
    return config, state


def sp_run(state: dict[str, torch.Tensor], sp_size: int, ulysses: int, checkpointing: bool) -> dict:
    """This rank's :func:`zoo.sp_rank_run` of the tiny Qwen4-Exp on the zoo's row."""
    torch.set_num_threads(1)
    config = ZC.tiny_config(FAMILY)
    with zoo.full_precision(config, torch.float64):
        return zoo.sp_rank_run(config, state, torch.float64, sp_size, ulysses, checkpointing=checkpointing)
