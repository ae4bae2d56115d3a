"""init_sequence_parallel's groups are the DeviceMesh's (and no more communicators), and the SP loader's
tensor all-gather of per-rank batches (gather_batches) with uneven lengths, exhausted ranks and extras."""
from __future__ import annotations

import pytest
import torch

from workers import mesh as W


# ------------------------------------------------------------------------------------------- mesh groups
def test_world2_sp2_creates_no_more_groups_than_its_mesh(pools) -> None:
    res = pools(2).run(W.mesh_group_counts_world2)
    assert [r["rank"] for r in res] == [0, 1]
    for r in res:
        # init_device_mesh((1, 2, 1)) makes the two 1-rank dims' groups and reuses WORLD for the 2-rank dim;
        # with a timeout per dim (what HSAP passes) the 2-rank dim gets its own group: 3 in all. HSAP adds none
        # (no flattened group when U == 1, no extra SP / intra / inter communicators).
        assert r["plain_mesh"] == 2 and r["override_mesh"] == 3
        assert r["hsap"] <= r["override_mesh"] and r["hsap"] <= r["plain_mesh"] + 1
        assert r["hsap"] == 3
        assert r["group_is_sp_inter"] and r["inter_is_group"]  # sp.device_mesh.get_group("sp_inter") is sp.group
        assert r["intra_none"] and r["dp_none"]
        assert r["sp_ranks"] == [0, 1] and r["size"] == 2
        assert r["mesh_shape"] == (1, 2, 1) and r["mesh_dims"] == ("dp", "sp_inter", "sp_intra")


def test_config_timeout_and_resolved_ulysses(pools) -> None:
    for r in pools(2).run(W.mesh_from_config, 5):
        assert r["timeout_s"] == 5 and r["config_timeout"] == 5
        assert r["group_timeout_s"] == 5.0  # the communicator itself, not only the attribute
        assert r["config_is_hsap"] and r["config_type"] == "HSAPConfig"
        assert r["ulysses_is_int"] and r["ulysses"] == r["group_ulysses"] == 1  # "auto": one node -> pure SAP
        assert r["config_sp_size"] == 2
        assert r["caller_config_unchanged"]  # the caller's frozen config still says "auto"


def test_world4_sp4_u2_groups_are_mesh_dims(pools) -> None:
    res = pools(4).run(W.mesh_layout, 4, 2)
    for r in res:
        g = r["rank"]
        assert r["mesh_shape"] == (1, 2, 2)
        assert r["intra_is_dim"] and r["inter_is_dim"] and r["dp_is_dim"]
        assert r["intra"] == ([0, 1] if g < 2 else [2, 3])
        assert r["inter"] == ([0, 2] if g % 2 == 0 else [1, 3])
        assert r["dp"] is None and r["dp_size"] == 1 and r["dp_rank"] == 0
        assert r["sp"] == [0, 1, 2, 3] and r["sp_rank"] == g
        assert r["config_sp_size"] == 4 and r["config_ulysses"] == r["ulysses"] == 2
        # 3 mesh dims (timeouts: none reuses WORLD) + the flattened sp_inter x sp_intra group
        assert r["new_groups"] == 4
    assert [r["rank"] for r in res] == [0, 1, 2, 3]


def test_world4_sp2_dp_group_is_the_mesh_dp_dim(pools) -> None:
    res = pools(4).run(W.mesh_layout, 2, "auto")
    for r in res:
        g = r["rank"]
        assert r["mesh_shape"] == (2, 2, 1)
        assert r["dp_is_dim"] and r["inter_is_dim"] and r["intra_is_dim"]
        assert r["dp"] == [g % 2, g % 2 + 2] and r["dp_size"] == 2 and r["dp_rank"] == g // 2
        assert r["config_sp_size"] == 2 and r["config_ulysses"] == r["ulysses"] == 1
        assert r["intra"] is None and r["inter"] == r["sp"] == [g - g % 2, g - g % 2 + 1]
        assert not r["sp_group_is_world"]
        assert r["new_groups"] == 3  # the mesh's dims only (U == 1: no flattened group)


# ------------------------------------------------------------------------------------------- gather_batches
def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _same_batch(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    for key, x in a.items():
        y = b[key]
        if torch.is_tensor(x) != torch.is_tensor(y):
            return False
        if torch.is_tensor(x) and not _bitwise_equal(x, y):
            return False
        if not torch.is_tensor(x) and (type(x) is not type(y) or x != y):
            return False
    return True


@pytest.mark.parametrize("extras", [True, False])
def test_gather_uneven_batches_bitwise(pools, extras: bool) -> None:
    res = pools(2).run(W.gather_uneven, extras)
    originals = [r["mine"] for r in res]
    assert originals[0]["input_ids"].shape == (1, 5) and originals[1]["input_ids"].shape == (1, 8)
    assert ("max_length_q" in originals[0]) == extras
    for r in res:
        got = r["gathered"]
        assert len(got) == 2
        for rank in range(2):
            assert _same_batch(got[rank], originals[rank]), (rank, sorted(got[rank]))
        assert got[1]["weights"].dtype == torch.bfloat16 and bool(torch.isnan(got[1]["weights"][0, 0, 0]))
        assert torch.signbit(got[0]["weights"][0, 0, 1]) and got[0]["keep"].dtype == torch.bool
        assert got[1]["num_items_in_batch"].dim() == 0 and int(got[1]["num_items_in_batch"]) == 7
        assert got[0]["cu_seq_lens_q"].dtype == torch.int32 and got[0]["empty"].shape == (1, 0, 2)
        assert torch.equal(got[1]["strided"], torch.arange(0, 16, 2, dtype=torch.int16).unsqueeze(0))
        if extras:
            assert got[0]["max_length_q"] == 3 and got[1]["max_length_q"] == 6
            assert got[0]["source"] == "rank-0" and got[1]["source"] == "rank-1"
    for a, b in zip(res[0]["gathered"], res[1]["gathered"]):
        assert _same_batch(a, b)  # identical on both ranks


@pytest.mark.parametrize("extras", [True, False])
@pytest.mark.parametrize("exhausted", [0, 1])
def test_gather_with_an_exhausted_rank(pools, exhausted: int, extras: bool) -> None:
    present = 1 - exhausted
    expected = W.rank_batch(present, extras)
    for got in pools(2).run(W.gather_with_exhausted, exhausted, extras):
        assert got[exhausted] is None
        assert got[present] is not None and sorted(got[present]) == sorted(expected)
        assert _same_batch(got[present], expected)


def test_gather_when_every_rank_is_exhausted(pools) -> None:
    assert pools(2).run(W.gather_with_exhausted, -1, True) == [[None, None], [None, None]]


@pytest.mark.parametrize("kind", ["keys", "renamed", "dtype"])
def test_gather_refuses_ranks_with_different_keys_or_dtypes(pools, kind: str) -> None:
    errors = pools(2).run(W.gather_mismatch, kind)
    assert len(errors) == 2
    for err in errors:
        assert err is not None and "different keys or dtypes" in err and "same collator" in err


# ------------------------------------------------------------------------------------------- SPDataLoader
@pytest.mark.parametrize("per_rank,order", [
    ([[0, 2, 4], [1, 3]], [0, 1, 2, 3, 4]),  # interleaved, uneven epoch: rank 1 runs out first
    ([[0, 2], [1, 3, 4]], [0, 1, 2, 3, 4]),  # rank 0 runs out first: the last step gathers [None, batch 4]
    ([[0, 2], [1, 3]], [0, 1, 2, 3]),        # even epoch
])
def test_sp_loader_yields_the_global_batches_sharded_in_rank_order(pools, per_rank, order) -> None:
    res = pools(2).run(W.loader_uneven, per_rank)
    row_lengths = [int(b["input_ids"].shape[1]) for b in W.packed_batches(len(order))]
    assert len(set(row_lengths)) == len(row_lengths)  # every batch has its own length
    for r in res:
        assert r["order"] == order and r["yielded"] == r["expected"] == len(order)
        assert r["diffs"] == [[] for _ in order]  # each yield equals shard_batch of that global batch
        assert r["row_lengths"] == row_lengths
        assert r["tags"] == [f"batch-{i}" for i in order]  # non-tensor values travel with their batch
    assert res[0]["total_tokens"] == res[1]["total_tokens"]
    # the two ranks' shards together hold every token of each global batch
    for i, (a, b) in enumerate(zip(res[0]["local_ids"], res[1]["local_ids"])):
        assert len(a[0]) + len(b[0]) == res[0]["total_tokens"][i]
