"""Worker of the indexed-attention tests: a tiny DeepSeek-V3.2 (every layer DeepSeek-sparse, a top-k of 8 keys) on the
zoo's packed row under SP (``zoo.sp_rank_run``: float64, logits and every parameter gradient)."""
from __future__ import annotations

import torch

from workers import zoo
from workers import zoo_configs as ZC

FAMILY = "deepseek_v32"
TIED = "model.layers.0.self_attn.indexer.weights_proj.weight"  # zeroed: every indexer score of layer 0 ties at 0


def tiny_state(tied: bool) -> tuple[object, dict[str, torch.Tensor]]:
    """The tiny config and float64 weights (``tied``: layer 0's indexer scores all exactly 0, so its top-k is decided
    by ``torch.topk``'s order among ties alone)."""
    config = ZC.tiny_config(FAMILY)
    with zoo.full_precision(config, torch.float64):
        model = ZC.build_model(config, "eager", torch.float64, draw=torch.float64)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if tied:
        state[TIED].zero_()
    return config, state


def sp_run(state: dict[str, torch.Tensor], sp_size: int, ulysses: int, checkpointing: bool) -> dict:
    """This rank's :func:`zoo.sp_rank_run` of the tiny DeepSeek-V3.2 on the zoo's row (``checkpointing``: every layer,
    its gathers too, recomputed in the backward)."""
    torch.set_num_threads(1)
    config = ZC.tiny_config(FAMILY)
    with zoo.full_precision(config, torch.float64):
        return zoo.sp_rank_run(config, state, torch.float64, sp_size, ulysses, checkpointing=checkpointing)
