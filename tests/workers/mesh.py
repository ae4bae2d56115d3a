"""Worker functions for tests/distributed/test_mesh_groups.py: the DeviceMesh behind init_sequence_parallel,
and the tensor all-gather of per-rank batches (gather_batches / SPDataLoader)."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _world

import hf_hsap
from hf_hsap.topology import _group_options

MESH_DIMS = ("dp", "sp_inter", "sp_intra")


def _n_groups() -> int:
    return len(_world.pg_map)


def _ranks(group: Any) -> list[int] | None:
    return None if group is None else dist.get_process_group_ranks(group)


# ------------------------------------------------------------------------------------------- mesh groups
def mesh_group_counts_world2() -> dict[str, Any]:
    """New process groups of init_sequence_parallel(sp 2) at world 2, next to init_device_mesh((1, 2, 1))
    plain and with the per-dim timeout override HSAP uses."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    n0 = _n_groups()
    init_device_mesh("cpu", (1, world, 1), mesh_dim_names=MESH_DIMS)
    n1 = _n_groups()
    init_device_mesh("cpu", (1, world, 1), mesh_dim_names=MESH_DIMS,
                     backend_override={name: _group_options(600.0) for name in MESH_DIMS})
    n2 = _n_groups()
    sp = hf_hsap.init_sequence_parallel(world, ulysses_size=1)
    n3 = _n_groups()
    mesh = sp.device_mesh
    return {
        "plain_mesh": n1 - n0, "override_mesh": n2 - n1, "hsap": n3 - n2,
        "group_is_sp_inter": mesh.get_group("sp_inter") is sp.group,
        "intra_none": sp.intra_group is None, "inter_is_group": sp.inter_group is sp.group,
        "dp_none": sp.dp_group is None, "sp_ranks": _ranks(sp.group), "size": sp.size, "rank": sp.rank,
        "mesh_shape": tuple(mesh.mesh.shape), "mesh_dims": tuple(mesh.mesh_dim_names),
    }


def mesh_from_config(timeout_s: float) -> dict[str, Any]:
    """init_sequence_parallel(HSAPConfig(sp_size=world, timeout_s=...)) with ulysses 'auto'."""
    cfg = hf_hsap.HSAPConfig(sp_size=dist.get_world_size(), timeout_s=timeout_s)
    sp = hf_hsap.init_sequence_parallel(cfg)
    return {"timeout_s": sp.timeout_s, "config_type": type(sp.config).__name__,
            "config_is_hsap": isinstance(sp.config, hf_hsap.HSAPConfig),
            "ulysses": sp.config.ulysses_size, "ulysses_is_int": type(sp.config.ulysses_size) is int,
            "group_ulysses": sp.ulysses_size, "config_timeout": sp.config.timeout_s,
            "config_sp_size": sp.config.sp_size, "caller_config_unchanged": cfg.ulysses_size is None,
            # the timeout the SP communicator really got (gloo backend options)
            "group_timeout_s": sp.group._get_backend(torch.device("cpu")).options._timeout.total_seconds()}


def mesh_layout(sp_size: int, ulysses: int | str) -> dict[str, Any]:
    """Which mesh dim each of this rank's groups is, their ranks, and the new process groups."""
    n0 = _n_groups()
    sp = hf_hsap.init_sequence_parallel(sp_size, ulysses_size=ulysses)
    n1 = _n_groups()
    mesh = sp.device_mesh

    def dim_group(name: str) -> Any:
        return mesh.get_group(name) if mesh[name].size() > 1 else None

    return {
        "rank": dist.get_rank(), "new_groups": n1 - n0, "mesh_shape": tuple(mesh.mesh.shape),
        "intra_is_dim": sp.intra_group is dim_group("sp_intra"),
        "inter_is_dim": sp.inter_group is dim_group("sp_inter"),
        "dp_is_dim": sp.dp_group is dim_group("dp"),
        "intra": _ranks(sp.intra_group), "inter": _ranks(sp.inter_group), "dp": _ranks(sp.dp_group),
        "sp": _ranks(sp.group), "sp_group_is_world": sp.group is dist.group.WORLD,
        "config_sp_size": sp.config.sp_size, "config_ulysses": sp.config.ulysses_size,
        "ulysses": sp.ulysses_size, "dp_size": sp.dp_size, "dp_rank": sp.dp_rank, "sp_rank": sp.rank,
    }


# ------------------------------------------------------------------------------------------- gather_batches
def rank_batch(rank: int, extras: bool = True) -> dict[str, Any]:
    """Rank ``rank``'s batch: ``[1, 5 + 3 * rank]`` tensors of several dtypes (one non-contiguous, a bf16 one
    holding nan / -0.0 / inf), a 1-D int32, a 0-dim, an empty and a 6-D tensor, and (``extras``) an int and a
    string."""
    g = torch.Generator().manual_seed(10 + rank)
    n = 5 + 3 * rank
    ids = torch.randint(0, 1000, (1, n), generator=g, dtype=torch.int64)
    weights = torch.randn(1, n, 3, generator=g).to(torch.bfloat16)
    weights[0, 0, 0], weights[0, 0, 1], weights[0, 0, 2] = float("nan"), -0.0, float("inf")
    batch: dict[str, Any] = {
        "input_ids": ids,
        "labels": torch.where(ids % 3 == 0, torch.full_like(ids, -100), ids),
        "position_ids": torch.arange(n, dtype=torch.int64).unsqueeze(0),
        "keep": ids % 2 == 0,  # bool [1, n]
        "weights": weights,  # bf16 [1, n, 3]
        "strided": torch.arange(2 * n, dtype=torch.int16).reshape(n, 2).t()[:1],  # [1, n], not contiguous
        "cu_seq_lens_q": torch.tensor([0, 2, n], dtype=torch.int32),
        "num_items_in_batch": torch.tensor(n - 1),  # 0-dim int64
        "empty": torch.zeros(1, 0, 2),  # float32, no elements
        "tiles": torch.randn(1, 2, 1 + rank, 3, 2, 2, generator=g),  # 6-D: Mllama's [B, images, tiles, C, H, W]
    }
    if extras:
        batch["max_length_q"] = n - 2
        batch["source"] = f"rank-{rank}"
    return batch


def _plain(batches: list[dict[str, Any] | None]) -> list[dict[str, Any] | None]:
    """Gathered batches as picklable plain values (tensors as themselves, contiguous, on the CPU)."""
    return [None if b is None else {k: (v.cpu().contiguous() if torch.is_tensor(v) else v) for k, v in b.items()}
            for b in batches]


def gather_uneven(extras: bool) -> dict[str, Any]:
    """Every rank gathers its ``rank_batch``; returns the gathered batches and what came in."""
    from hf_hsap.integrations.batch_gather import gather_batches

    me = dist.get_rank()
    mine = rank_batch(me, extras)
    out = gather_batches(mine, dist.group.WORLD, dist.get_world_size())
    return {"gathered": _plain(out), "mine": _plain([mine])[0],
            "key_order": [None if b is None else list(b) for b in out]}


def gather_with_exhausted(exhausted_rank: int, extras: bool) -> list[dict[str, Any] | None]:
    """Rank ``exhausted_rank`` passes None (``-1``: every rank does), the others their ``rank_batch``."""
    from hf_hsap.integrations.batch_gather import gather_batches

    me = dist.get_rank()
    mine = None if exhausted_rank in (me, -1) else rank_batch(me, extras)
    return _plain(gather_batches(mine, dist.group.WORLD, dist.get_world_size()))


def gather_mismatch(kind: str) -> str | None:
    """Ranks with different keys (``kind="keys"``) or dtypes (``"dtype"``): the ValueError each rank gets."""
    from hf_hsap.integrations.batch_gather import gather_batches

    me = dist.get_rank()
    mine = rank_batch(me, extras=False)
    if kind == "keys" and me == 1:
        mine["completion_mask"] = torch.ones_like(mine["input_ids"])
    if kind == "renamed" and me == 1:
        mine["keep_mask"] = mine.pop("keep")
    if kind == "dtype" and me == 1:
        mine["input_ids"] = mine["input_ids"].to(torch.int32)
    try:
        gather_batches(mine, dist.group.WORLD, dist.get_world_size())
    except ValueError as e:
        return str(e)
    return None


# ------------------------------------------------------------------------------------------- SPDataLoader
def packed_batches(n: int) -> list[dict[str, Any]]:
    """``n`` packed batches from PackingCollator with different row lengths (12, 16, 20, ...) and documents."""
    from hf_hsap.data import PackingCollator

    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(100 + i)
        collate = PackingCollator(max_length=12 + 4 * i)
        lens = [1 + int(x) for x in torch.randint(0, 6 + 2 * i, (2 + i % 3,), generator=g)]
        examples = [{"input_ids": torch.randint(1, 50, (m,), generator=g).tolist()} for m in lens]
        out.append({**collate(examples), "tag": f"batch-{i}"})  # a non-tensor value that must travel too
    return out


def _same_local(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Where two shard_batch outputs differ (empty: identical)."""
    diffs = []
    if set(a) != set(b):
        return [f"keys {sorted(a)} != {sorted(b)}"]
    for key in a:
        x, y = a[key], b[key]
        if key == "hsap_plan":
            if x.total_tokens != y.total_tokens or not torch.equal(x.local_token_indices(), y.local_token_indices()) \
                    or x.placement_name != y.placement_name:
                diffs.append(key)
        elif key == "hsap_plan_use":
            if type(x) is not type(y):
                diffs.append(key)
        elif torch.is_tensor(x):
            if not torch.is_tensor(y) or x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
                diffs.append(key)
        elif x != y:
            diffs.append(key)
    return diffs


def loader_uneven(per_rank: list[list[int]]) -> dict[str, Any]:
    """SPDataLoader over rank r's batches ``per_rank[r]`` (indices into ``packed_batches``): every yielded
    local batch against shard_batch of the global batch it should be, in rank order per step."""
    from hf_hsap.integrations import SPDataLoader, shard_batch

    sp = hf_hsap.init_sequence_parallel(dist.get_world_size(), ulysses_size=1)
    n = 1 + max(i for ids in per_rank for i in ids)
    batches = packed_batches(n)
    me = dist.get_rank()
    mine = [batches[i] for i in per_rank[me]]
    # the order of global batches: step s gathers batch s of every rank, in rank order
    steps = max(len(ids) for ids in per_rank)
    order = []
    for s in range(steps):
        row = [ids[s] if s < len(ids) else None for ids in per_rank]
        order += [i for i in row if i is not None]
        if None in row:
            break
    yielded = list(SPDataLoader(mine, sp, check_previous=False))
    expected = [shard_batch(batches[i], sp, verify=False, check_previous=False) for i in order]
    return {
        "yielded": len(yielded), "expected": len(expected), "order": order,
        "diffs": [_same_local(a, b) for a, b in zip(yielded, expected)],
        "total_tokens": [b["hsap_plan"].total_tokens for b in yielded],
        "row_lengths": [int(batches[i]["input_ids"].shape[1]) for i in order],
        "local_ids": [b["input_ids"].tolist() for b in yielded],
        "tags": [b.get("tag") for b in yielded],
    }
