"""The items' encoder work that ``shard_batch`` gives the planner (hf_hsap.multimodal.item_work): every placeholder,
each item's patches times the tower's per-patch work derived from the config's shapes; planned with it, the busiest
part's predicted encoder + decoder work is no higher. Offline plans, no clock."""
from __future__ import annotations

import numpy as np
import torch

import hf_hsap
from hf_hsap.data.vision import LAYOUT_KEY
from hf_hsap.examples import tiny_vlm_config, vlm_documents
from hf_hsap.integrations.sharding import batch_cu_seqlens
from hf_hsap.multimodal import item_work, vision_spec
from hf_hsap.plan.cost import part_times
from hf_hsap.plan.items import encoder_per_part, layer_params, part_of_positions
from hf_hsap.plan.planner import plan_sequence


def test_item_work_of_a_video_row_and_its_plan() -> None:
    from transformers import AutoModelForImageTextToText

    config = tiny_vlm_config("qwen2_5_vl")
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    spec = vision_spec(model)
    v, t = config.vision_config, config.text_config
    per_patch = v.depth * layer_params(v.hidden_size, v.num_heads, v.num_heads, v.hidden_size // v.num_heads,
                                       v.intermediate_size)
    per_token = t.num_hidden_layers * layer_params(t.hidden_size, t.num_attention_heads, t.num_key_value_heads,
                                                   getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
                                                   t.intermediate_size)
    video = next(m for m in spec.layout.modalities if m.name == "video")
    assert video.patch_work == per_patch / per_token > 0

    grids = [(4, 8, 8), (2, 8, 4), (4, 4, 8)]
    docs = vlm_documents(config, [(6, g, 40) for g in grids], seed=0, video=True)
    batch = hf_hsap.PackingCollator(sum(d["input_ids"].numel() for d in docs), vision=spec)(docs)
    items = item_work(batch, batch[LAYOUT_KEY], batch["input_ids"], encoding="holders")
    ids = batch["input_ids"].reshape(-1)
    assert items.positions.tolist() == torch.nonzero(ids == video.token_id).flatten().tolist()
    np.testing.assert_allclose(items.work, [video.patch_work * t_ * h * w for t_, h, w in grids])
    merge = config.vision_config.spatial_merge_size ** 2
    assert np.bincount(items.item).tolist() == [t_ * h * w // merge for t_, h, w in grids]

    cu = batch_cu_seqlens(batch)
    plans = [plan_sequence(cu, 4, items=x) for x in (None, items)]
    busiest = []
    for plan in plans:
        pl = plan.placement
        enc = encoder_per_part(items, part_of_positions(pl.start, pl.end, pl.part, items.positions), 4)
        busiest.append(float((part_times(plan.layout, pl, None, plan.cost) + plan.cost.token_cost * enc).max()))
    assert busiest[1] <= busiest[0] * (1 + 1e-9)
