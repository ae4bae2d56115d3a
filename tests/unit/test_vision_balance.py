"""The planner weighs vision items' encoder work (hf_hsap.plan.items): with items, ``auto`` lowers the busiest part's
predicted encoder + decoder time; without (text), plans are those of before. Deterministic, no clock."""
from __future__ import annotations

import numpy as np
import pytest

from hf_hsap.plan.cost import CostModel, step_time
from hf_hsap.plan.items import ItemWork, assign_owners, encoder_per_part, layer_params, part_of_positions
from hf_hsap.plan.planner import plan_sequence


def _video_row(docs: list[tuple[int, int, int]], work_per_placeholder: float, encoding: str
               ) -> tuple[list[int], ItemWork]:
    """``cu_seqlens`` of documents ``(text, placeholders, text)`` (one item each) and their items."""
    cu, pos, item = [0], [], []
    for i, (a, n, b) in enumerate(docs):
        s = cu[-1]
        pos += range(s + a, s + a + n)
        item += [i] * n
        cu.append(s + a + n + b)
    work = [n * work_per_placeholder for _, n, _ in docs]
    return cu, ItemWork.of(pos, item, work, encoding=encoding)


def _predicted(plan, items: ItemWork) -> np.ndarray:
    """Every part's encoder + decoder time of one layer by the planner's model (what the brief balances)."""
    from hf_hsap.plan.cost import part_times

    pl = plan.placement
    enc = encoder_per_part(items, part_of_positions(pl.start, pl.end, pl.part, items.positions), pl.n_parts)
    return part_times(plan.layout, pl, None, plan.cost) + plan.cost.token_cost * enc


@pytest.mark.parametrize("encoding", ["holders", "once", "auto"])
@pytest.mark.parametrize("docs,P", [
    ([(20, 768, 10), (20, 768, 10), (20, 512, 10)], 4),  # the benchmark's long video row
    ([(30, 900, 40), (200, 0, 300), (10, 300, 500), (50, 600, 20), (400, 0, 100)], 4),  # videos beside text
    ([(5, 1500, 5), (300, 0, 200), (100, 0, 150), (20, 200, 30)], 2),
])
def test_items_balance_the_busiest_parts_encoder_plus_decoder_work(docs, P: int, encoding: str) -> None:
    cu, items = _video_row(docs, 1.2, encoding)
    cost = CostModel.default()
    plain, weighed = plan_sequence(cu, P, cost=cost), plan_sequence(cu, P, cost=cost, items=items)
    before, after = _predicted(plain, items), _predicted(weighed, items)
    assert after.max() <= before.max() * (1 + 1e-9)  # auto prices every plain candidate too: never worse
    # the price auto minimises is this model's busiest part (one full-attention layer, no windows)
    enc = weighed.cost.token_cost * encoder_per_part(
        items, part_of_positions(weighed.placement.start, weighed.placement.end, weighed.placement.part,
                                 items.positions), P)
    assert step_time(weighed.layout, weighed.placement, {None: None}, {None: 1}, weighed.cost, encoder=enc) == \
        pytest.approx(after.max())


def test_holders_video_row_is_balanced_strictly() -> None:
    """Every holder encodes its videos: today's plan leaves one part encoding two videos; the weighed plan evens
    out the encoder plus decoder work (predicted busiest lower, spread near 1)."""
    cu, items = _video_row([(20, 768, 10), (20, 768, 10), (20, 512, 10)], 1.2, "holders")
    plain, weighed = plan_sequence(cu, 4), plan_sequence(cu, 4, items=items)
    before, after = _predicted(plain, items), _predicted(weighed, items)
    assert after.max() < 0.95 * before.max()
    assert after.max() / after.min() < before.max() / before.min()


@pytest.mark.parametrize("lengths,P,U", [([100, 300, 50, 900, 7], 4, 1), ([4096], 8, 1), ([30] * 40, 4, 2),
                                         ([1000, 1, 1, 998], 2, 1)])
def test_text_plans_are_unchanged(lengths: list[int], P: int, U: int) -> None:
    cu = np.concatenate([[0], np.cumsum(lengths)])
    plain = plan_sequence(cu, P, ulysses_size=U)
    none = ItemWork.of([], [], [])  # no item, and items of no work: the text plan
    zero = ItemWork.of([0, 1, 2], [0, 0, 0], [0.0])
    for items in (None, none, zero):
        other = plan_sequence(cu, P, ulysses_size=U, items=items)
        for a, b in zip((plain.placement.doc, plain.placement.start, plain.placement.end, plain.placement.part),
                        (other.placement.doc, other.placement.start, other.placement.end, other.placement.part)):
            np.testing.assert_array_equal(a, b)


def test_item_work_is_checked() -> None:
    with pytest.raises(ValueError, match="encoding"):
        ItemWork.of([0], [0], [1.0], encoding="twice")
    with pytest.raises(ValueError, match="item indices"):
        ItemWork.of([0], [1], [1.0])
    with pytest.raises(ValueError, match=">= 0"):
        ItemWork.of([0], [0], [-1.0])
    with pytest.raises(ValueError, match="outside"):
        plan_sequence([0, 8], 2, items=ItemWork.of([9], [0], [1.0]))
    assert ItemWork.of([1, 2], [0, 0], [3.0]) == ItemWork.of([1, 2], [0, 0], [3.0])  # the plan cache compares


def test_owners_and_patch_work() -> None:
    counts = np.array([[3, 0, 1], [1, 0, 0], [0, 2, 2]])  # [parts, items]
    owner, encodes = assign_owners(counts, np.array([4.0, 2.0, 3.0]), np.zeros(3, np.int64))
    assert owner.tolist() == [0, 2, 2]  # item 0 split: the least-loaded holder first (0, its most rows on ties)
    assert encodes[1].tolist() == [True, False, False]  # part 1 holds item 0 only: it encodes it too
    items = ItemWork.of([0, 1, 2, 3], [0, 0, 1, 1], [5.0, 1.0], encoding="holders")
    assert encoder_per_part(items, np.array([0, 1, 1, 1]), 2).tolist() == [5.0, 6.0]
    assert layer_params(8, 2, 1, 4, 16) == 8 * 4 * 6 + 3 * 8 * 16
