"""An image or video split across SP ranks, encoded once and its feature rows sent (``vision_encoding="once"``),
or by every holder (``"holders"``), and the per-batch rule between them (:mod:`hf_hsap.multimodal.exchange`).

The distributed checks compare with each document alone (float64: logits, loss and every parameter gradient, the
vision tower's included, :func:`test_vlm.check`) on rows where one rank holds part of a large item and a small item
of its own, so that rows really move (asserted)."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from hf_hsap.multimodal.exchange import Holdings, VisionPrice, route_items
from test_vlm import check_against
from workers import vlm_exchange as X

TIMEOUT_S = 300
# one large item SP must split, two small ones and a text document
SPLIT = [(2, (1, 12, 12), 2), (2, (1, 4, 4), 2), (2, (1, 4, 4), 2), (3, None, 3)]
SPLIT_VIDEO = [(2, (2, 8, 12), 2), (2, (1, 4, 4), 2), (2, (2, 2, 4), 2), (3, None, 3)]
CHEAP = VisionPrice(patch_cost=10.0, row_cost=1.0, round_cost=0.0)


def _holdings(tokens: list[int], held: list[list[int]], name: str = "image") -> Holdings:
    return Holdings(name, np.array(tokens), 4 * np.array(tokens), tuple(np.array(h, dtype=np.int64) for h in held))


def test_a_split_item_is_encoded_once_by_its_least_loaded_holder() -> None:
    """Items 0 (rows 0-7) and 1 (rows 8-9): rank 0 holds rows 0-2 and item 1, rank 1 rows 3-7. Once: rank 1 (the
    least encoder work) encodes item 0 and sends rows 0-2 to rank 0, which encodes item 1 only."""
    h = _holdings([8, 2], [[0, 1, 2, 8, 9], [3, 4, 5, 6, 7]])
    r0, r1 = (route_items([h], 2, r, encoding="once", price=CHEAP, executor=object())["image"] for r in (0, 1))
    assert r0.items.tolist() == [1] and r1.items.tolist() == [0]
    assert r0.rows.tolist() == [2, 3, 4, 0, 1]  # received rows after its own 2
    assert r1.rows.tolist() == [3, 4, 5, 6, 7]
    assert r1.exchange.send_index.tolist() == [0, 1, 2] and r1.exchange.send_splits == ((0, 0, 3),)
    assert r0.exchange.recv_splits == ((1, 0, 3),) and r0.exchange.recv_rows == 3
    holders = route_items([h], 2, 0, encoding="holders", price=CHEAP)["image"]
    assert holders.items.tolist() == [0, 1] and holders.exchange is None and holders.rows.tolist() == [0, 1, 2, 8, 9]


def test_a_holder_with_no_item_of_its_own_encodes_one() -> None:
    """Rank 1 holds only part of item 0: it must call the encoder to take part in the exchange, so it encodes item 0
    too and nothing moves; the rule then keeps every holder encoding."""
    h = _holdings([8], [[0, 1, 2], [3, 4, 5, 6, 7]])
    routes = [route_items([h], 2, r, encoding="once", price=CHEAP, executor=object())["image"] for r in (0, 1)]
    assert all(r.items.tolist() == [0] and r.exchange is None for r in routes)


def test_auto_chooses_by_the_busiest_ranks_price(caplog) -> None:
    """Two large items each split over ranks 0-1 and 1-2: every holder encoding puts both on rank 1. Cheap rows:
    once (rank 1 encodes one); rows dearer than encoding: holders. The choice is logged."""
    from hf_hsap.log import forget_logged

    h = _holdings([8, 8, 1, 1, 1], [[0, 1, 16], [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 17], [18]])
    forget_logged()
    with caplog.at_level(logging.INFO, logger="hf_hsap"):
        once = route_items([h], 3, 1, encoding="auto", price=CHEAP, executor=object())["image"]
    assert once.exchange is not None and once.items.size < 4
    assert "encoded once, rows sent" in caplog.text
    dear = VisionPrice(patch_cost=1.0, row_cost=1000.0, round_cost=0.0)
    assert route_items([h], 3, 1, encoding="auto", price=dear, executor=object())["image"].exchange is None


@pytest.mark.parametrize("family,sp_size,ulysses,video,encoding", [
    ("qwen2_5_vl", 2, 1, False, "once"), ("qwen2_5_vl", 4, 2, True, "once"), ("llava", 2, 2, False, "once"),
    ("qwen3_vl", 2, 1, True, "once")])  # Qwen3-VL: its deepstack rows travel with the pooled ones
def test_split_items_match_documents_alone(family: str, sp_size: int, ulysses: int, video: bool, encoding: str,
                                           pools) -> None:
    shapes = SPLIT_VIDEO if video else SPLIT
    results = pools(sp_size, TIMEOUT_S).run(X.exchange_run, family, sp_size, ulysses, video, encoding, shapes)
    check_against(X.reference(family, video, shapes), family, results)
    moved = sum(r["sent"] for r in results)
    assert moved == sum(r["received"] for r in results)
    assert (moved > 0) == (encoding == "once")
    if encoding == "once":  # the split item's rows reach its other holders without their encoding it
        assert all(r["encoded"].get(m, 0) + r["received"] >= r["local_rows"][m] for r in results for m in r["local_rows"])
        assert any(r["encoded"].get(m, 0) < r["local_rows"][m] for r in results for m in r["local_rows"])
