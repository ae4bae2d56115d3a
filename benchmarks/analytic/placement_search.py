"""The offline optimiser of placements under the cost model: what the fast planner is measured against.

Slow on purpose (seconds, not milliseconds): tests and ``benchmarks/analytic/sweep.py`` use it to report how far
``placement="auto"`` is from the best placement the cost model can express. It runs the library's local search
(:func:`hf_hsap.plan.local_search.polish`, unbounded) from every simpler placement and the caller's; the best local
optimum wins. Never part of planning.
"""
from __future__ import annotations

import math

from hf_hsap.plan.balanced import balanced
from hf_hsap.plan.cost import CostModel
from hf_hsap.plan.density import density
from hf_hsap.plan.layout import Layout
from hf_hsap.plan.local_search import polish
from hf_hsap.plan.placement import DEFAULT_TOKEN_SLACK, Placement, contiguous, zigzag

__all__ = ["ZIGZAG_START_SEGMENTS", "optimise_placement"]

ZIGZAG_START_SEGMENTS = 4096  # zigzag is a start only up to this many segments (each move scans a part's)


def optimise_placement(layout: Layout, n_parts: int, cost: CostModel, start: Placement | None = None,
                       token_slack: float = DEFAULT_TOKEN_SLACK, max_moves: int = 2000) -> Placement:
    """Local search for the placement with the smallest step time of its slowest part (module docstring),
    from ``start`` and from every simpler placement (``zigzag`` up to 4096 segments, ``balanced``, ``density``,
    ``contiguous``): the best of the local optima.

    Args:
        layout: the documents. n_parts: parts P. cost: the cost model (priced as the plan's).
        start: a placement to start from as well (e.g. ``auto``'s).
        token_slack: no part holds more than ``ceil(T/P) * (1 + token_slack)`` tokens.
        max_moves: the most moves made from each start.

    Returns:
        The best placement found (name ``"oracle"``); never slower than any start by the cost model.
    """
    starts = [zigzag(layout, n_parts)] if 2 * n_parts * layout.n_docs <= ZIGZAG_START_SEGMENTS else []
    starts += [balanced(layout, n_parts, token_slack),
              density(layout, n_parts, cost.token_cost, token_slack),
              contiguous(layout, n_parts)]
    starts += [start] if start is not None else []
    found = [polish(layout, n_parts, cost, s, token_slack=token_slack, max_moves=max_moves, max_rows=math.inf)
             for s in starts]
    return min(found, key=lambda f: f[0])[1]
