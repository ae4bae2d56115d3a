"""Worker of the split-document hybrid tests: one family's tiny model on a row whose first document spans several
ranks and whose short documents leave runs shorter than the convolution's ``k - 1``, under SP with gradient
checkpointing (``zoo.sp_rank_run``: float64, logits and every parameter gradient)."""
from __future__ import annotations

import torch

from workers import zoo
from workers import zoo_configs as ZC

# 4 ranks of 16 tokens: the 40-token document spans 3 ranks (contiguous) or every rank, back and forth (zigzag: 7
# runs); zigzag also leaves continued runs of 1 and 2 tokens, shorter than a convolution's k - 1 = 3
LENS = [40, 1, 2, 11, 2, 8]


def split_run(family: str, state: dict[str, torch.Tensor], sp_size: int, ulysses: int, placement: str,
              recurrent_mode: str = "auto") -> dict:
    """This rank's :func:`zoo.sp_rank_run` of ``family`` on :data:`LENS` with gradient checkpointing
    (``{"group", "index", "logits", "loss", "a2a_bytes"}``, ``"grads"`` on SP rank 0), the group's recurrent
    layers in ``recurrent_mode``."""
    torch.set_num_threads(1)
    config = ZC.tiny_config(family)
    with zoo.full_precision(config, torch.float64):
        return zoo.sp_rank_run(config, state, torch.float64, sp_size, ulysses, lens=LENS, checkpointing=True,
                               placement=placement, recurrent_mode=recurrent_mode)
