"""The sequence-sharding hook: one global packed batch -> this rank's tokens, plan and exact-loss targets.

Every rank of an SP group calls :func:`shard_batch` with the *same* global batch (the data-loader
adapter in :mod:`.dataloader` arranges that). Next-token targets are computed on the global batch,
before sharding, because a rank cannot see the token after its shard's last one::

    global row   | d0 d0 d0 | d1 d1 | d2 d2 d2 d2 |        (3 documents, flattened B*L tokens)
    shift_labels | l1 l2 -- | l4 -- | l6 l7 l8 -- |        (-- = -100 at every document end)
    plan.shard   rank 0 gets some tokens, rank 1 the others (plan order, not necessarily contiguous)

The returned local batch feeds ``model(**local)`` directly: ``hsap_plan`` rides through the model's
kwargs to the ``"hsap"`` attention, ``shift_labels`` + ``num_items_in_batch`` make the model's loss
``sum(local CE) / global valid count`` (see :mod:`.loss`).
"""
from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..config import HSAPConfig
from ..data.packing import IGNORE_INDEX, shift_labels_global
from ..data.vision import LAYOUT_KEY as VISION_LAYOUT_KEY, PIXEL_KEYS
from ..multimodal import batch_blocks, item_work, shard_vision, vision_keys
from ..multimodal.cross import shard_cross
from ..plan.blocks import keep_blocks_whole
from ..data.positions import check_position_ids, document_starts
from ..sp_plan import SPPlan, plan_sequence
from .batch_gather import collective_device
from .plan_use import PLAN_USE_KEY, PlanNotUsedError, PlanUse

# Keys that describe the global layout; they are replaced by the plan and never reach the model.
LAYOUT_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx", "attention_mask")

__all__ = ["IGNORE_INDEX", "batch_cu_seqlens", "shard_batch", "shift_labels_global"]


def batch_cu_seqlens(batch: Mapping[str, Any]) -> torch.Tensor:
    """Document boundaries over the flattened ``B * L`` tokens of a packed batch.

    Args:
        batch: with ``input_ids [B, L]`` and ``cu_seq_lens_q [n + 1]`` or ``position_ids [B, L]``
            (a new document wherever the position does not continue, e.g. restarts at 0, and at every row).

    Returns:
        ``[n_docs + 1]`` int64 CPU tensor, ``0 < ... < B * L``.

    Raises:
        ValueError: a padding ``attention_mask`` with zeros, no document information, or ``cu_seq_lens_q``
            that does not cover the batch (what :func:`shard_batch` and the trainers' init probe refuse).
    """
    ids = batch["input_ids"]
    total = ids.numel()
    mask = batch.get("attention_mask")
    if mask is not None and not bool(torch.as_tensor(mask).all()):
        raise ValueError(
            "shard_batch got a padding attention_mask with zeros; sequence parallelism needs padding-free packed "
            "batches: make padding its own document (hf_hsap.data.PackingCollator, or TRL with padding_free=True)"
        )
    cu = batch.get("cu_seq_lens_q")
    if cu is not None:
        cu = torch.as_tensor(cu).detach().to("cpu", torch.int64).flatten()
        if cu[0] != 0 or cu[-1] != total or bool((cu.diff() <= 0).any()):
            raise ValueError(f"cu_seq_lens_q must rise strictly from 0 to the batch's {total} tokens, got "
                             f"{cu.tolist()[:8]}...; build it over the flattened batch (PackingCollator does)")
        return cu
    pos = batch.get("position_ids")
    if pos is None:
        raise ValueError(
            "shard_batch needs the document layout of the packed batch: pass position_ids (restarting at 0 at "
            "every document) or cu_seq_lens_q, e.g. from hf_hsap.data.PackingCollator or TRL's padding_free collator"
        )
    pos = text_positions(torch.as_tensor(pos), ids.shape).detach().to("cpu")  # [B, L]
    starts = document_starts(pos).flatten()  # [B*L]
    idx = torch.nonzero(starts, as_tuple=False).flatten()
    return torch.cat([idx, torch.tensor([total])]).to(torch.int64)


def text_positions(pos: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The 1-D positions of ``position_ids``: itself (``[B, L]``), or row 0 of Transformers' packed multimodal
    convention ``[4, B, L]`` (text positions, then the 3 rotary rows).

    Raises:
        ValueError: ``[3, B, L]`` rotary rows alone (they do not restart at document starts).
    """
    if pos.dim() == 3:
        if pos.shape[0] != 4:
            raise ValueError(
                f"position_ids of shape {tuple(pos.shape)}: multimodal rotary positions must come in Transformers' "
                "packed convention [4, B, L] (row 0 the text positions restarting per document), as "
                "PackingCollator(vision=hf_hsap.vision_spec(model)) builds them")
        pos = pos[0]
    return pos.reshape(shape)  # [B, L]


def _shard_positions(pos: torch.Tensor, n: int, shard: Any) -> torch.Tensor:
    """``[B, L]`` -> ``[1, T_local]``, or ``[4, B, L]`` -> ``[4, 1, T_local]``."""
    if pos.dim() == 3:
        return torch.stack([shard(row) for row in pos.reshape(pos.shape[0], n)]).unsqueeze(1)  # [4, 1, T_local]
    return shard(pos.reshape(n)).unsqueeze(0)  # [B, L] -> [1, T_local]


def _first_positions(pos: torch.Tensor, shape: torch.Size, cu: torch.Tensor) -> np.ndarray | None:
    """``[n_docs]`` position of each document's first token where a chunked-attention layer's chunks count from
    them (:func:`~hf_hsap.plan.chunks.chunk_layout`), else ``None`` (document-relative chunks).

    ``masking_utils`` chunks a packed batch by ``position_ids`` (``remap_positions_for_packed_sequence``) but a
    batch of one document per row by the index in the row: so ``None`` also when every row holds one document.
    """
    if cu.numel() - 1 == shape[0]:  # one document per row: chunks from the row start
        return None
    first = text_positions(pos, shape).reshape(-1)[cu[:-1].to(pos.device)].to("cpu", torch.int64).numpy()
    return first if first.any() else None


def _batch_digest(tensors: list[torch.Tensor]) -> int:
    """A 63-bit digest of the batch content (what SP ranks compare)."""
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        h.update(str((tuple(t.shape), t.dtype)).encode())
        h.update(t.numpy().tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


def _check_same_batch(digest: int, sp: Any) -> None:
    """All-gather the digest in the SP group; raise on every rank if the ranks hold different batches."""
    import torch.distributed as dist

    mine = torch.tensor([digest], dtype=torch.int64, device=collective_device(sp.group))
    everyone = [torch.empty_like(mine) for _ in range(sp.size)]
    dist.all_gather(everyone, mine, group=sp.group)
    values = [int(t.item()) for t in everyone]
    if len(set(values)) > 1:
        bad = [r for r, v in enumerate(values) if v != values[0]]
        raise ValueError(
            f"the ranks of the SP group hold different global batches (SP ranks {bad} differ from rank 0); every "
            "rank of an SP group must get the same packed batch: wrap the data loader with "
            "hf_hsap.integrations.SPDataLoader (or use HSAPTrainer / HSAPSFTTrainer)"
        )


def _check_previous_batch(sp: Any) -> None:
    """Raise if the SP group's previous batch from :func:`shard_batch` went through a forward in which not
    every attention layer consumed its plan (a check not made yet by the trainers or the loss helper)."""
    use = getattr(sp, "pending_plan_use", None)
    if use is None or use.checked:
        return
    sp.pending_plan_use = None
    problem = use.problem()
    if problem is not None:
        raise PlanNotUsedError(f"the previous batch of this SP group: {problem}. (A loop that shards batches "
                               "without running the model on them passes check_previous=False to shard_batch / "
                               "SPDataLoader.)")


def _plan_kwargs(sp: Any, config: Any, placement: str | None) -> dict:
    """``plan_sequence`` keyword arguments from the config (the group's unless given) and a placement override."""
    from ..config import HSAPConfig

    config = config or getattr(sp, "config", None) or HSAPConfig()
    config = config.replace(placement=placement) if placement is not None else config  # validated there
    kwargs = {"placement": config.placement, **config.plan_options()}
    if config.cost_model is not None:
        kwargs["cost"] = config.cost_model
    return kwargs


def shard_batch(
    batch: Mapping[str, Any],
    sp: Any,
    placement: str | None = None,
    *,
    verify: bool = True,
    ignore_index: int = IGNORE_INDEX,
    check_previous: bool = True,
    config: Any = None,
) -> dict[str, Any]:
    """Turn one global packed batch into this rank's model inputs.

    Args:
        batch: the global batch, identical on every rank of the SP group: ``input_ids [B, L]``,
            ``labels [B, L]`` (unshifted, optional: without them no loss targets are produced),
            ``position_ids [B, L]`` (or ``[4, B, L]``, Transformers' packed multimodal rotary convention) and/or
            ``cu_seq_lens_q [n + 1]``. A vision-language batch from ``PackingCollator(vision=...)`` also holds the
            pixels and their ``hsap_vision`` layout: each rank gets the items with a placeholder on it, and
            ``hsap_vision_rows`` (see :mod:`hf_hsap.multimodal`). Other ``[B, L]`` tensors (e.g. a
            ``completion_mask``) are sharded too; other values pass through. An all-ones ``attention_mask``
            is dropped.
        sp: the :class:`~hf_hsap.SPGroup`; ``1`` or ``None`` for no sequence parallelism.
        placement: overrides the config's placement (``auto``, ``balanced``, ``contiguous``, ``zigzag``).
        config: the :class:`~hf_hsap.HSAPConfig` to plan with (placement, rounds, receive budget, token
            slack, how a vision item split across ranks is encoded: ``vision_encoding``, whether the plan weighs the
            items' encoder work: ``vision_balance``); default the group's
            ``sp.config``.
        verify: compare a digest of the batch across the SP group (one small all-gather per call).
        ignore_index: label value without a target.
        check_previous: under SP, first check that the forward of the group's previous batch from
            ``shard_batch`` ran its plan through every attention layer (see :mod:`.plan_use`), and keep this
            batch's record for the next call. Loaders that shard ahead of the forward (the trainers' loader,
            which checks each batch after its forward instead) pass ``False``.

    Returns:
        dict with ``input_ids``, ``position_ids``, ``shift_labels`` and ``labels`` (the same tensor as
        ``shift_labels``: Transformers computes a loss only when ``labels`` is given, and uses
        ``shift_labels`` in preference), each ``[1, T_local]``; ``hsap_plan``; ``num_items_in_batch``
        (0-dim int64: valid targets in the whole global batch, at least 1 so that an all-ignored batch
        gives a finite zero loss); ``use_cache=False``; under SP ``hsap_plan_use``, the
        :class:`~.plan_use.PlanUse` record the attention layers fill (:func:`~.plan_use.check_plan_used`).

    Shapes:
        ``[B, L]`` global -> ``[1, T_local]`` local, ``T_local = plan.num_local_tokens()``.

    Raises:
        ValueError: a padding ``attention_mask`` with zeros, no document layout, or SP ranks with
            different batches.
        PlanNotUsedError: (``check_previous``) the group's previous batch ran through a model whose attention
            layers did not all consume its plan.
    """
    ids = batch["input_ids"]
    if ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got {tuple(ids.shape)}")
    cu = batch_cu_seqlens(batch)
    labels = batch.get("labels")
    shift = shift_labels_global(torch.as_tensor(labels), cu, ignore_index) if labels is not None else None  # [B*L]
    if sp is None or isinstance(sp, int):
        if sp not in (None, 1):
            raise ValueError(f"shard_batch needs the SPGroup from hf_hsap.init_sequence_parallel, got sp={sp!r}")
        sp = 1
    size = getattr(sp, "size", 1)
    rank = None if size > 1 or not isinstance(sp, int) else 0  # an int-1 plan is offline: name rank 0
    if check_previous and size > 1:
        _check_previous_batch(sp)
    if verify and size > 1:
        parts = [ids, cu] + ([torch.as_tensor(labels)] if labels is not None else [])
        _check_same_batch(_batch_digest(parts), sp)
    vision = batch.get(VISION_LAYOUT_KEY)
    hsap = config or getattr(sp, "config", None) or HSAPConfig()
    items = None  # the items' encoder work, which the plan balances with the decoder's (not under cross-attention)
    if vision is not None and vision.cross_key is None and size > 1 and hsap.vision_balance:
        items = item_work(batch, vision, ids, encoding=hsap.vision_encoding)
    plan = plan_sequence(cu, sp, verify=False, **_plan_kwargs(sp, config, placement),
                         **({} if items is None else {"items": items}))
    blocks = batch_blocks(vision, batch, ids, cu)
    if blocks is not None:  # Gemma 3's images, PaliGemma's prefixes: seen both ways, each block inside one part
        whole = keep_blocks_whole(plan, blocks)
        if whole is not plan:
            plan = SPPlan.bind(whole, sp) if isinstance(plan, SPPlan) else whole
    device = ids.device
    shard = functools.partial(plan.shard, rank=rank)
    pos = batch.get("position_ids")
    if pos is not None:
        pos = torch.as_tensor(pos)
        if batch.get("cu_seq_lens_q") is not None:  # both given: they must describe the same documents
            check_position_ids(text_positions(pos, ids.shape).reshape(-1), plan.layout)
    else:  # positions restart at every document start of cu
        starts = torch.zeros(ids.numel(), dtype=torch.int64)
        starts[cu[:-1]] = cu[:-1]
        pos = torch.arange(ids.numel()) - torch.cummax(starts, 0).values  # [B*L]
    local: dict[str, Any] = {
        "input_ids": shard(ids.reshape(-1)).unsqueeze(0),  # [B*L] -> [1, T_local]
        "position_ids": _shard_positions(pos.to(device), ids.numel(), shard),
        "hsap_plan": plan,
        "use_cache": False,
    }
    if blocks is not None:
        local["hsap_blocks"] = blocks
    if vision is not None and vision.position_start:  # PaliGemma counts each document's positions from 1
        local["position_ids"] = local["position_ids"] + vision.position_start
    if vision is not None and vision.rope_rows_only and local["position_ids"].dim() == 3:  # HunYuan-VL
        local["position_ids"] = local["position_ids"][1:]  # [1 + rows, 1, T] -> its rotary rows [rows, 1, T]
    if vision is not None and vision.cross_key is not None:  # Mllama: each rank's tokens' own images
        local.update(shard_cross(batch, vision, shard))
    elif vision is not None:
        local.update(shard_vision(batch, vision, ids.reshape(-1), plan, rank=rank, encoding=hsap.vision_encoding))
    elif any(batch.get(k) is not None for k in PIXEL_KEYS):
        raise ValueError("shard_batch got pixels without their vision layout (the 'hsap_vision' key): pack the "
                         "documents with PackingCollator(max_length, vision=hf_hsap.vision_spec(model))")
    if size > 1:
        local[PLAN_USE_KEY] = PlanUse(size, plan, first_positions=_first_positions(pos, ids.shape, cu))
        if check_previous:
            sp.pending_plan_use = local[PLAN_USE_KEY]
    if shift is not None:
        local["shift_labels"] = shard(shift.to(device)).unsqueeze(0)  # [1, T_local]
        local["labels"] = local["shift_labels"]
        n_valid = (shift != ignore_index).sum().clamp_min(1)
        local["num_items_in_batch"] = n_valid.to(device)
    skip = vision_keys(vision) if vision is not None else set()
    if blocks is not None:  # the blocks replace the model's own bidirectional mask overlay
        skip |= {"token_type_ids", "mm_token_type_ids"}
        if getattr(vision, "type_blocks", None):  # Molmo2 requires its types when training: all text (no overlay)
            local[vision.type_blocks] = torch.zeros_like(local["input_ids"])
    for key, value in batch.items():
        if key in local or key in skip or key in LAYOUT_KEYS or key in ("labels", "shift_labels",
                                                                      "num_items_in_batch", PLAN_USE_KEY):
            continue
        if torch.is_tensor(value) and tuple(value.shape[:2]) == tuple(ids.shape):
            flat = value.reshape(ids.numel(), *value.shape[2:])  # [B, L, ...] -> [B*L, ...]
            local[key] = shard(flat).unsqueeze(0)  # [1, T_local, ...]
        else:
            local[key] = value
    return local
