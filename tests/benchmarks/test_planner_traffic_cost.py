"""The planner priced by the benchmarks' cost model (:func:`benchmarks.analytic.traffic.planner_cost`): on a row of
the traffic section, auto refuses contiguous cuts whose gain is below the search's margin."""
from __future__ import annotations

import hf_hsap
from benchmarks.analytic.distributions import cu_seqlens, doc_lengths
from benchmarks.analytic.traffic import RECV_SHAPE, planner_cost
from hf_hsap.plan import search
from hf_hsap.plan.cutting import priced_cuts
from hf_hsap.plan.layout import make_layout
from hf_hsap.plan.windows import work_per_part


def test_a_gain_below_the_margin_is_refused(monkeypatch):
    """On an SFT row of the traffic section (T = 128K, 8 GPUs of one node, Llama-3-8B's cost model on an A100) the
    cuts are faster than auto's plan by less than the search's MARGIN and would raise the work max/mean well above
    1.1: auto keeps its plan; with no margin the rule would take them."""
    cu = cu_seqlens(doc_lengths("sft", 131072, 0))
    layout = make_layout(cu)
    cost = planner_cost(RECV_SHAPE, "nvlink", "A100")
    kept = hf_hsap.plan_sequence(cu, 8, "auto", cost=cost)
    s = search.Search(layout, 8, cost, 0.10)
    current = s.price(kept.placement)
    cut = s.price(priced_cuts(layout, 8, cost, s.cap, current.time))
    assert kept.placement_name != "contiguous-priced" and cut is not None
    assert current.time * (1 - search.MARGIN) <= cut.time < current.time and not s.accepts(current, cut)
    monkeypatch.setattr(search, "MARGIN", 0.0)
    assert s.accepts(current, cut)
    w_kept, w_cut = work_per_part(layout, kept.placement, None), work_per_part(layout, cut.placement, None)
    assert w_kept.max() / w_kept.mean() < 1.1 < 1.4 < w_cut.max() / w_cut.mean()
